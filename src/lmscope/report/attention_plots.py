"""Plots of `lmscope attention` results: a metric against sequence length, one line per implementation.

One PNG holds a grid of panels: a row per (metric, dtype), a column per head dim. Both axes are
logarithmic for latencies (`*_ms`); TFLOP/s keep a linear y axis. Points that failed leave a gap;
the legend says where (e.g. "naive (OOM at 16384)"). Uses matplotlib's object API with the Agg
canvas, so it needs no display and changes no global backend; matplotlib is imported only when
a plot is drawn, so the command runs (with --no-plot) where it is missing.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from lmscope.records.results import Record
from lmscope.report.styles import series_styles

LINE_FIELDS = ("causal", "batch", "heads")
"""Spec fields that split an implementation's line when they vary within a panel."""


def latency_metrics(passes: str) -> list[str]:
    """What to plot for a sweep that timed `passes`: fwd_bwd_ms if timed, else each pass's ms."""
    timed = passes.split(",")
    return ["fwd_bwd_ms"] if "fwd_bwd" in timed else [f"{p}_ms" for p in timed]


def _values(records: Sequence[Record], field: str) -> list:
    return sorted({r.get(field) for r in records}, key=str)


def _line_label(record: Record, split: list[str]) -> str:
    extra = " ".join(f"{field}={record.get(field)}" for field in split)
    return f"{record.get('impl')} {extra}".strip()


def plot_attention(records: Sequence[Record], path: Path, metrics: Sequence[str]) -> Path | None:
    """Write the panel grid of `metrics` vs seq_len to `path`; None when nothing can be drawn."""
    from matplotlib.figure import Figure

    rows = [r for r in records if r.get("seq_len") is not None and r.get("impl") is not None]
    if not any(r.get("status") == "ok" and r.get(m) is not None for r in rows for m in metrics):
        return None
    dtypes, dims = _values(rows, "dtype"), sorted({r.get("head_dim") for r in rows})
    split = [f for f in LINE_FIELDS if len(_values(rows, f)) > 1]
    panels = [(metric, dtype) for metric in metrics for dtype in dtypes]
    figure = Figure(figsize=(max(6.0, 4.2 * len(dims)) + LEGEND_WIDTH_IN, 3.4 * len(panels)),
                    layout="constrained")
    axes = figure.subplots(len(panels), len(dims), squeeze=False)
    for row, (metric, dtype) in enumerate(panels):
        for col, dim in enumerate(dims):
            _panel(axes[row][col], [r for r in rows if r.get("dtype") == dtype and r.get("head_dim") == dim],
                   metric, split, title=f"{dtype}, d={dim}")
    figure.suptitle("lmscope attention: " + ", ".join(metrics) + " vs sequence length", fontsize=10)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    return path


LEGEND_WIDTH_IN = 2.6
"""Room to the right of the panels for their legends (kept off the data)."""


def plain_number(value: float, _position: object = None) -> str:
    """A tick label as a plain number ('0.5', '2', '300'), never '2x10^0'."""
    return f"{value:g}"


def plain_minor(value: float, _position: object = None) -> str:
    """Labels for the minor ticks of a log axis at 2x and 5x a power of ten, blank elsewhere."""
    if value <= 0:
        return ""
    mantissa = value / 10 ** math.floor(math.log10(value) + 1e-9)
    return plain_number(value) if round(mantissa, 6) in (2.0, 5.0) else ""


def _panel(ax, records: list[Record], metric: str, split: list[str], title: str) -> None:
    from matplotlib.ticker import FuncFormatter, NullLocator

    lines: dict[str, list[Record]] = {}
    for record in records:
        lines.setdefault(_line_label(record, split), []).append(record)
    for (label, line), style in zip(lines.items(), series_styles(len(lines)), strict=True):
        line.sort(key=lambda r: r["seq_len"])
        ok = [r for r in line if r.get("status") == "ok" and r.get(metric) is not None]
        failed = [f"{r.get('status', 'error').upper()} at {r['seq_len']}" for r in line
                  if r.get("status") not in ("ok", None)]
        if ok:
            full = label + (f" ({', '.join(failed)})" if failed else "")
            ax.plot([r["seq_len"] for r in ok], [r[metric] for r in ok], ms=3, label=full, **style)
        elif failed:  # nothing to draw: keep the implementation in the legend with its status
            statuses = sorted({r.get("status", "error").upper() for r in line})
            ax.plot([], [], marker="x", ls="none", color=style["color"],
                    label=f"{label} ({'/'.join(statuses)} at every length)")
    ax.set_xscale("log", base=2)
    lengths = sorted({r["seq_len"] for r in records})
    ax.set_xticks(lengths, [str(n) for n in lengths], fontsize=7)
    ax.xaxis.set_minor_locator(NullLocator())
    drawn = any(r.get("status") == "ok" and r.get(metric) is not None for r in records)
    if metric.endswith("_ms") and drawn:  # a log axis of no positive value fails at savefig
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(FuncFormatter(plain_number))
        ax.yaxis.set_minor_formatter(FuncFormatter(plain_minor))
    ax.set_xlabel("sequence length")
    ax.set_ylabel(metric)
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    if lines:
        ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0)


def plot_sweep(
    records: Sequence[Record], out: Path, passes: str, seq_lens: Sequence[int], wanted: bool | None
) -> Path | None:
    """The CLI's plot: beside `out` as <stem>_attention.png, when asked for (None: when the sweep
    has more than one sequence length)."""
    if wanted is False or (wanted is None and len(set(seq_lens)) < 2):
        return None
    return plot_attention(records, out.with_name(f"{out.stem}_attention.png"), latency_metrics(passes))
