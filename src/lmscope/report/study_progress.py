"""The study's progress bar: one bar over the plan's estimated seconds, with an ETA."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from lmscope.report.console import console, describe


class StudyProgress:
    """Advances by each point's estimated cost when it finishes; prints failed points."""

    def __init__(self, progress: Progress, task: Any, total_s: float) -> None:
        self._progress, self._task, self.cost_s, self._total_s = progress, task, 0.0, total_s

    def extend(self, cost_s: float) -> None:
        """More points join the run: the bar grows by their estimated seconds."""
        self._total_s += cost_s
        self._progress.update(self._task, total=max(self._total_s, 1e-9))

    def start(self, section: str, spec: dict[str, Any], cost_s: float) -> None:
        """A point of `section` starts; it is worth `cost_s` estimated seconds."""
        self.cost_s = cost_s
        self._progress.update(self._task, description=section, point=describe(spec))

    def skip(self, cost_s: float) -> None:
        """A planned point is left for a later run: the bar no longer waits for its seconds."""
        self.extend(-cost_s)

    def done(self, record: dict[str, Any]) -> None:
        """The started point finished (any status)."""
        if record.get("status") not in ("ok", "oom"):
            self._progress.console.print(
                f"  {describe(record)}: {record.get('status')} ({record.get('error')})",
                highlight=False,
                markup=False,
            )
        self._progress.advance(self._task, self.cost_s)


@contextmanager
def study_progress(total_s: float) -> Iterator[StudyProgress]:
    """A bar over `total_s` estimated seconds: elapsed, ETA, and the point running."""
    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TextColumn("{task.percentage:>3.0f}%"),
        TimeElapsedColumn(),
        TextColumn("eta"),
        TimeRemainingColumn(),
        TextColumn("{task.fields[point]}"),
        console=console,
        transient=False,
    ) as progress:
        task = progress.add_task("study", total=max(total_s, 1e-9), point="")
        yield StudyProgress(progress, task, total_s)
