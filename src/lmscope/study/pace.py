"""How much slower (or faster) this machine runs the study's points than the cost model says.

The cost model (cost.py) is tuned on idle machines; a loaded one runs every point slower, and
pessimistic estimates (big models, compile) make points finish early. The pace is the measured
wall time of finished points over their estimates: learned from the rows a run directory already
holds (a `--resume` plans with it), then from each point this run finishes. The planner and the
deadline check scale every estimate by it.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from lmscope.records.results import read_records
from lmscope.running.runner import FINISHED, record_spec
from lmscope.study.cost import point_cost_s
from lmscope.study.sections import Section
from lmscope.study.target import Target

MIN_FACTOR = 0.5
"""Never trust a point to take less than half its estimate. There is no upper bound: a machine
that runs points ten times slower than estimated gets ten times fewer of them, not an overrun."""


class Pace:
    """Actual over estimated seconds of the points finished so far (1 before any): the sums, so
    that one odd point (a cold worker's first) weighs less with every point after it."""

    def __init__(self) -> None:
        self.estimated_s = 0.0
        self.actual_s = 0.0
        self.points = 0

    def add(self, estimated_s: float, actual_s: float) -> None:
        """One finished point: its estimate and its wall time."""
        self.estimated_s += estimated_s
        self.actual_s += actual_s
        self.points += 1

    @property
    def factor(self) -> float:
        """Actual over estimated seconds so far, at least MIN_FACTOR."""
        if self.points == 0 or self.estimated_s <= 0:
            return 1.0
        return max(MIN_FACTOR, self.actual_s / self.estimated_s)

    def describe(self) -> str:
        """What the factor rests on, for the plan's title."""
        if self.points == 0:
            return "estimates of the cost model"
        return f"estimates x{self.factor:.2g}, the pace of {self.points} finished point(s)"


def pace_of_rows(sections: list[Section], target: Target, run_dir: Path) -> Pace:
    """The pace of the finished rows already in `run_dir`: each row's `wall_s` against the cost
    model's estimate of its spec (rows of sections without device work and reused rows left out)."""
    pace = Pace()
    for section in sections:
        path = run_dir / section.file
        if not section.device_work or not section.points or not path.exists():
            continue
        template = list(dataclasses.asdict(section.points[0].spec))
        for record in read_records(path):
            wall_s = record.get("wall_s")
            if (record.get("status") not in FINISHED or record.get("reused_from")
                    or not isinstance(wall_s, int | float) or wall_s <= 0):
                continue
            spec = record_spec(record, template, section.workload)
            try:
                estimate = point_cost_s(section.workload, spec, target, reused=section.reuse_worker)
            except (KeyError, TypeError, ValueError):  # a row the cost model cannot price
                continue
            pace.add(estimate, float(wall_s))
    return pace
