"""Terminal tables wider than the terminal: no number or header broken across lines; messages as is."""

from __future__ import annotations

import io
import random

import pytest
from rich.console import Console

from lmscope.report import console
from lmscope.report.tables import format_value


@pytest.fixture
def narrow(monkeypatch):
    def make(width: int) -> io.StringIO:
        buffer = io.StringIO()
        monkeypatch.setattr(console, "console", Console(file=buffer, width=width, color_system=None))
        return buffer

    return make


@pytest.mark.parametrize("width", [60, 80, 120, 200])
def test_a_wide_table_keeps_numbers_and_headers_whole(narrow, width):
    header = ["size", "context_length", "mean_ms", "std_ms", "median_ms", "forward_ms", "backward_ms",
              "optimizer_ms", "tokens_per_s", "tflops", "peak_allocated_gib", "compile_s", "status"]
    rng = random.Random()
    rows = [["tiny", 128] + [rng.uniform(0.001, 99999) for _ in header[2:-1]] + ["ok"] for _ in range(4)]
    rows[1][4] = "ERROR"
    buffer = narrow(width)
    console.show_table((header, rows), title="t")
    text = buffer.getvalue()
    assert max(len(line) for line in text.splitlines()) <= width
    grid = text.split("not shown")[0]
    shown = [name for name in header if name in grid]
    assert shown[0] == "size" and shown[-1] == "status" and len(shown) >= 3
    for row in rows:
        for name, value in zip(header, row, strict=True):
            if name in shown:
                assert format_value(value) in grid, (name, value)  # whole, on one line
    if len(shown) < len(header):
        note = " ".join(text[text.index("not shown"):].split())
        assert all(name in note for name in header if name not in shown)


def test_markup_in_cells_is_printed_as_is(narrow):
    buffer = narrow(100)
    console.show_table((["name", "status"], [["[red]x[/red] [bold]", "ok"]]))
    assert "[red]x[/red] [bold]" in buffer.getvalue()


@pytest.mark.parametrize("show", [console.fail, console.warn])
def test_an_error_or_warning_line_is_printed_as_is(monkeypatch, show):
    buffer = io.StringIO()
    monkeypatch.setattr(console, "errors", Console(file=buffer, width=200, color_system=None))
    message = "bad --size :tiny: or :smile: [bold]x[/bold]"
    show(message)
    assert buffer.getvalue().rstrip("\n").endswith(f": {message}")


def test_a_failed_point_s_error_is_printed_as_is(monkeypatch):
    buffer = io.StringIO()
    monkeypatch.setattr(console, "console", Console(file=buffer, width=200, color_system=None))
    with console.sweep_progress(1, "bench", [{"size": "tiny"}]) as (on_start, on_done):
        on_start(0, {"size": "tiny"})
        on_done({"size": "tiny", "status": "error", "error": "ValueError: :smile: [red]"})
    assert "(ValueError: :smile: [red])" in buffer.getvalue()
