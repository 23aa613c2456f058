"""Everything lmscope shows on a terminal: rich tables, progress bars with ETA, messages."""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from rich.console import Console
from rich.markup import escape
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


NUMBER = re.compile(r"^-?[\d,]*\.?\d+(e[-+]?\d+)?%?$|^-$")
TEXT_COLUMN_WIDTH = 30
"""Width a text column is counted at when columns are fitted (its words wrap within it)."""


def show_table(table: Table, title: str | None = None) -> None:
    """Print a table; failed cells (OOM, TIMEOUT, ERROR) in red.

    Numbers and headers are never broken across lines: columns that do not fit the terminal
    are left out, from the right (the status stays), and named in a line under the table;
    every column stays in the results file and in --format exports.
    """
    header, rows = table
    texts = [[format_value(value) for value in row] for row in rows]
    widths, numeric = [], []
    for index, name in enumerate(header):
        cells = [row[index] for row in texts]
        is_number = all(NUMBER.match(c) or c in FAILED for c in cells)
        longest = max((len(c) for c in cells), default=0)
        numeric.append(is_number)
        widths.append(max(len(name), longest if is_number else min(longest, TEXT_COLUMN_WIDTH)))
    kept = fit_columns(header, widths, console.width)
    rich_table = RichTable(title=title, show_lines=False)
    for index in kept:
        if numeric[index]:
            rich_table.add_column(escape(header[index]), no_wrap=True, min_width=widths[index])
        else:
            rich_table.add_column(escape(header[index]), overflow="fold", min_width=len(header[index]))
    for row in texts:
        rich_table.add_row(*[f"[red]{row[i]}[/red]" if row[i] in FAILED else escape(row[i]) for i in kept])
    console.print(rich_table)
    left_out = [header[i] for i in range(len(header)) if i not in kept]
    if left_out:
        console.print(f"not shown (terminal too narrow; in the results file and --format csv): "
                      f"{', '.join(left_out)}", highlight=False, markup=False)


FAILED = ("OOM", "TIMEOUT", "ERROR")


def fit_columns(header: Sequence[str], widths: Sequence[int], width: int) -> list[int]:
    """Indices of the columns that fit in `width` characters, first to last; the first column and
    a last `status` column are always kept."""
    border = 3  # a column's padding and its rule
    always = [0] + ([len(header) - 1] if len(header) > 1 and header[-1] == "status" else [])
    used = 1 + sum(widths[i] + border for i in always)
    kept = set(always)
    for index in range(len(header)):
        if index in kept:
            continue
        if used + widths[index] + border > width:
            break
        kept.add(index)
        used += widths[index] + border
    return sorted(kept)


def say(message: str) -> None:
    """A line of information."""
    console.print(message, highlight=False, soft_wrap=True)


def fail(message: str) -> None:
    """One line on stderr saying what is wrong and how to fix it, printed as is (no markup, and no
    emoji: rich would turn `:abc:` of a value into one)."""
    line = " ".join(message.splitlines())  # a value may hold line breaks (\n, \x1e, \u2028)
    errors.print(f"lmscope: error: {line}", highlight=False, markup=False, emoji=False, soft_wrap=True)


def warn(message: str) -> None:
    """One line on stderr about something the command went on without (e.g. skipped lines)."""
    line = " ".join(message.splitlines())
    errors.print(f"lmscope: warning: {line}", highlight=False, markup=False, emoji=False, soft_wrap=True)


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
                                       highlight=False, markup=False, emoji=False)
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
