"""Everything lmscope shows on a terminal: rich tables, progress bars with ETA, messages."""

from __future__ import annotations

import sys
from collections.abc import Iterator
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

from lmscope.report.tables import Table, format_value

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
def sweep_progress(total: int, label: str) -> Iterator[Any]:
    """A progress bar with ETA; yields callbacks (on_start, on_done) for `run_sweep`."""
    with Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
        TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(),
        TextColumn("{task.fields[point]}"), console=console, transient=False,
    ) as progress:
        task = progress.add_task(label, total=total, point="")

        def on_start(index: int, spec: dict[str, Any]) -> None:
            progress.update(task, point=_describe(spec))

        def on_done(record: dict[str, Any]) -> None:
            status = record.get("status")
            if status != "ok":
                progress.console.print(f"  {_describe(record)}: {status} ({record.get('error')})",
                                       highlight=False, markup=False)
            progress.advance(task)

        yield on_start, on_done


def _describe(spec: dict[str, Any]) -> str:
    keys = ("size", "context_length", "batch_size", "mode", "precision", "attention", "impl",
            "op", "size_mb", "world_size", "strategy")
    return " ".join(f"{spec[k]}" for k in keys if k in spec and spec[k] is not None)
