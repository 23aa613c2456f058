"""Tables of records: swept axes, failed cells, pivots with ratios, output formats."""

import csv
import io
import json

import pytest

from lmscope.report.tables import build_table, format_value, render

KEYS = ["size", "context_length", "precision", "steps"]


def bench_row(size, precision, mean, status="ok"):
    row = {"workload": "bench", "size": size, "context_length": 128, "precision": precision,
           "steps": 10, "status": status}
    if status == "ok":
        row |= {"mean_ms": mean, "std_ms": mean / 10, "median_ms": mean}
    return row


ROWS = [bench_row("small", "fp32", 40.0), bench_row("small", "bf16", 20.0),
        bench_row("2.7B", "fp32", None, status="oom"), bench_row("2.7B", "bf16", 80.0)]


def test_table_shows_swept_fields_metrics_and_oom_cells():
    header, rows = build_table(ROWS, KEYS)
    assert header == ["size", "precision", "mean_ms", "std_ms", "median_ms", "status"]
    assert rows[2] == ["2.7B", "fp32", "OOM", "OOM", "OOM", "oom"]


def test_compare_pivots_a_field_with_ratios():
    header, rows = build_table(ROWS, KEYS, compare="precision")
    assert header == ["size", "median_ms precision=fp32", "median_ms precision=bf16",
                      "ratio fp32/bf16"]
    assert rows[0] == ["small", 40.0, 20.0, "2.00x (no interval)"]
    assert rows[1] == ["2.7B", "OOM", 80.0, None]


def test_compare_when_every_point_failed_pivots_the_status_cells():
    failed = [bench_row("small", "fp32", None, status="error"),
              bench_row("small", "bf16", None, status="oom")]
    header, rows = build_table(failed, KEYS, compare="precision")
    assert header == ["median_ms precision=fp32", "median_ms precision=bf16", "ratio fp32/bf16"]
    assert rows == [["ERROR", "OOM", None]]


def test_compare_by_a_field_that_does_not_vary_is_an_error():
    with pytest.raises(ValueError, match="cannot compare by 'context_length'"):
        build_table(ROWS, KEYS, compare="context_length")


def test_last_record_of_a_point_wins():
    retried = [*ROWS, bench_row("2.7B", "fp32", 120.0)]
    _, rows = build_table(retried, KEYS)
    assert len(rows) == 4 and rows[-1][:3] == ["2.7B", "fp32", 120.0]


def test_formats_render_every_row():
    table = build_table(ROWS, KEYS)
    md = render(table, "md").splitlines()
    assert md[0].startswith("| size | precision") and len(md) == 2 + len(ROWS)
    parsed = list(csv.reader(io.StringIO(render(table, "csv"))))
    assert parsed[1] == ["small", "fp32", "40.0", "4.0", "40.0", "ok"]
    assert r"\begin{tabular}" in render(table, "latex") and "mean\\_ms" in render(table, "latex")
    assert json.loads(render(table, "json"))[2]["mean_ms"] == "OOM"
    with pytest.raises(ValueError, match="unknown format"):
        render(table, "xlsx")


def test_format_value():
    assert format_value(None) == "-" and format_value(True) == "true"
    assert format_value(1234567.0) == "1,234,567" and format_value(0.000123) == "0.000123"
    assert format_value(12.345) == "12.35" and format_value(3.14159) == "3.14"


def test_overridden_dimensions_are_shown_beside_the_preset():
    records = [{"workload": "bench", "size": "tiny", "d_model": 512, "d_ff": 1536, "num_layers": None,
                "context_length": c, "status": "ok", "mean_ms": 1.0} for c in (16, 32)]
    header, rows = build_table(records, ["size", "d_model", "d_ff", "num_layers", "context_length"])
    assert header[:4] == ["size", "d_model", "d_ff", "context_length"]
    assert rows[0][:3] == ["tiny", 512, 1536]


def test_failed_points_that_differ_in_one_flag_get_different_labels(capsys):
    from lmscope.report import console

    points = [{"size": "tiny", "compile": flag, "precision": "fp32"} for flag in (False, True)]
    with console.sweep_progress(2, "bench", points) as (on_start, on_done):
        for point in points:
            on_start(0, point)
            on_done({**point, "status": "error", "error": "boom"})
    lines = [line.strip() for line in capsys.readouterr().out.splitlines() if "boom" in line]
    assert len(lines) == 2 and lines[0] != lines[1] and "compile=true" in lines[1]
