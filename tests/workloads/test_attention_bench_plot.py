"""Plots of `lmscope attention` results: panels, lines, gaps for failed points, when to plot."""

from __future__ import annotations

import random

import lmscope.report.attention_plots as plots
from lmscope.report.attention_plots import latency_metrics, plot_attention, plot_sweep


def _records():
    rows = []
    for dtype in ("fp32", "bf16"):
        for dim in (32, 64):
            for impl in ("flash-triton", "naive", "sdpa-flash"):
                for seq in (256, 1024, 4096):
                    row = {"workload": "attention", "impl": impl, "dtype": dtype, "head_dim": dim,
                           "seq_len": seq, "batch": 8, "heads": 1, "causal": True, "status": "ok",
                           "fwd_bwd_ms": random.uniform(0.1, 10) * seq / 256}
                    if impl == "naive" and seq == 4096:
                        row = {**row, "status": "oom", "fwd_bwd_ms": None}
                    if impl == "sdpa-flash" and dtype == "fp32":
                        row = {**row, "status": "error", "fwd_bwd_ms": None}
                    rows.append(row)
    return rows



def test_plot_has_a_panel_per_dtype_and_head_dim(tmp_path, monkeypatch):
    drawn = {}
    original = plots._panel

    def spy(ax, records, metric, split, title):
        original(ax, records, metric, split, title)
        drawn[title] = [t.get_text() for t in ax.get_legend().get_texts()]

    monkeypatch.setattr(plots, "_panel", spy)
    path = plot_attention(_records(), tmp_path / "x.png", ["fwd_bwd_ms"])
    assert path == tmp_path / "x.png" and path.stat().st_size > 10_000
    assert set(drawn) == {"fp32, d=32", "fp32, d=64", "bf16, d=32", "bf16, d=64"}
    assert drawn["bf16, d=32"] == ["flash-triton", "naive (OOM at 4096)", "sdpa-flash"]
    assert "sdpa-flash (ERROR at every length)" in drawn["fp32, d=64"]


def test_nothing_to_draw_gives_no_file(tmp_path):
    rows = [{**r, "status": "error", "fwd_bwd_ms": None} for r in _records()]
    assert plot_attention(rows, tmp_path / "x.png", ["fwd_bwd_ms"]) is None
    assert not (tmp_path / "x.png").exists()


def test_sweep_plots_beside_results_when_more_than_one_length(tmp_path):
    out = tmp_path / "results.jsonl"
    records = _records()
    assert plot_sweep(records, out, "fwd,bwd,fwd_bwd", [256], None) is None
    assert plot_sweep(records, out, "fwd,bwd,fwd_bwd", [256, 1024], False) is None
    path = plot_sweep(records, out, "fwd,bwd,fwd_bwd", [256, 1024], None)
    assert path == tmp_path / "results_attention.png" and path.exists()


def test_latency_metric_follows_the_passes():
    assert latency_metrics("fwd,bwd,fwd_bwd") == ["fwd_bwd_ms"]
    assert latency_metrics("fwd,bwd") == ["fwd_ms", "bwd_ms"]


def test_log_ticks_are_plain_numbers_and_the_legend_is_off_the_data():
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    rows = [{"impl": impl, "seq_len": seq, "status": "ok",
             "fwd_ms": scale * random.uniform(1.0, 1.5) * seq / 256}
            for impl, scale in (("naive", 2.0), ("flash", 1.0)) for seq in (256, 512, 1024)]
    figure = Figure(figsize=(6, 3), layout="constrained")
    canvas = FigureCanvasAgg(figure)
    ax = figure.subplots()
    plots._panel(ax, rows, "fwd_ms", [], "t")
    canvas.draw()
    labels = [t.get_text() for t in ax.yaxis.get_ticklabels(which="both") if t.get_text()]
    assert labels and all(float(text) > 0 for text in labels)  # '2', '5', '10', never '2×10⁰'
    renderer = canvas.get_renderer()
    assert ax.get_legend().get_window_extent(renderer).x0 >= ax.get_window_extent(renderer).x1


def test_a_panel_of_failed_points_only_is_drawn_not_raised(tmp_path):
    """A resumed or cut sweep can leave a (dtype, head dim) panel with error rows only: it gets
    the legend entries and a linear axis (a log axis of no positive value fails to save)."""
    rows = [r for r in _records() if not (r["dtype"] == "fp32" and r["head_dim"] == 64
                                          and r["impl"] != "sdpa-flash")]  # fmt: skip
    path = plot_attention(rows, tmp_path / "partial.png", ["fwd_bwd_ms"])
    assert path is not None and path.stat().st_size > 10_000
