"""Everything lmscope shows on a terminal: rich tables, progress bars with ETA, messages."""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table as RichTable

from lmscope.report.tables import Table, format_value, shown_fields

console = Console(width=None if sys.stdout.isatty() else 200)
errors = Console(stderr=True, width=None if sys.stderr.isatty() else 200)


def show_table(table: Table, title: str | None = None) -> None:
    """Print a table; failed cells (OOM, TIMEOUT, ERROR) in red."""
    header, rows = table
    rich_table = RichTable(title=title, show_lines=False)
    for name in header:
        rich_table.add_column(name, overflow="fold")
    for row in rows:
        cells = []
        for value in row:
            text = format_value(value)
            cells.append(f"[red]{text}[/red]" if text in ("OOM", "TIMEOUT", "ERROR") else text)
        rich_table.add_row(*cells)
    console.print(rich_table)


def say(message: str) -> None:
    """A line of information."""
    console.print(message, highlight=False, soft_wrap=True)


def fail(message: str) -> None:
    """One line on stderr saying what is wrong and how to fix it."""
    line = " ".join(message.splitlines())  # a value may hold line breaks (\n, \x1e, \u2028)
    errors.print(f"lmscope: error: {line}", highlight=False, markup=False, soft_wrap=True)


@contextmanager
def sweep_progress(total: int, label: str, points: Sequence[dict[str, Any]] = ()) -> Iterator[Any]:
    """A progress bar with ETA; yields callbacks (on_start, on_done) for `run_sweep`.

    Each point is named by the fields that differ between `points` (and any dimension that
    overrides the preset), so two points never share a name.
    """
    keys = shown_fields(points, list(points[0])) if points else []
    with Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
        TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(),
        TextColumn("{task.fields[point]}"), console=console, transient=False,
    ) as progress:
        task = progress.add_task(label, total=total, point="")

        def on_start(index: int, spec: dict[str, Any]) -> None:
            progress.update(task, point=describe(spec, keys))

        def on_done(record: dict[str, Any]) -> None:
            status = record.get("status")
            if status != "ok":
                progress.console.print(f"  {describe(record, keys)}: {status} ({record.get('error')})",
                                       highlight=False, markup=False)
            progress.advance(task)

        yield on_start, on_done


DEFAULT_LABEL_KEYS = ("size", "context_length", "batch_size", "mode", "precision", "attention", "impl",
                      "op", "size_mb", "world_size", "strategy")
"""What names a point when nothing varies (a sweep of one point)."""


def describe(spec: dict[str, Any], keys: Sequence[str] = ()) -> str:
    """'compile=on precision=bf16': the point's values of `keys` (or of DEFAULT_LABEL_KEYS)."""
    if keys:
        return " ".join(f"{k}={format_value(spec.get(k))}" for k in keys)
    return " ".join(f"{spec[k]}" for k in DEFAULT_LABEL_KEYS if k in spec and spec[k] is not None)
