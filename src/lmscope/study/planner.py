"""The study's plan: which points run now, which are done, which wait for a later --resume.

The budget is spent tier by tier across the sections (see sections.py), each point costed by
`cost.point_cost_s` scaled by the pace this machine showed on the rows the run directory already
holds (pace.py): a `--resume` on a loaded machine plans with what its points really took. Points
already finished in the run directory cost nothing, so running the same study again with
`--resume` and the same budget goes on where the last run stopped. Points without device work
(the accounting) always run. A point that two sections share (the same workload and spec, run
the same way) is measured once, by the first in plan order, and its row is reused by the others.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from lmscope.running.runner import _finished_keys, identity_key
from lmscope.study.cost import point_cost_s
from lmscope.study.pace import Pace, pace_of_rows
from lmscope.study.sections import Point, Section
from lmscope.study.target import Target

RUN, DONE, LATER, REUSE = "run", "done", "later", "reuse"


@dataclass(frozen=True)
class PlannedPoint:
    """A point with its estimated cost and what the plan does with it."""

    section: Section
    point: Point
    estimate_s: float
    """The cost model's seconds (cost.py)."""
    action: str
    reuses: str | None = None
    """With REUSE: the section that measures this same point; its row is copied here."""
    pace: float = 1.0
    """The factor the plan scaled the estimate by (1 for points without device work)."""

    @property
    def cost_s(self) -> float:
        """The planned seconds: the estimate at the pace."""
        return self.estimate_s * self.pace


@dataclass(frozen=True)
class Plan:
    """The study's points in the order they run (tier by tier, section by section)."""

    target: Target
    budget_s: float
    points: list[PlannedPoint]
    sections: list[Section]
    """Every section, in study order (skipped ones included)."""
    pace: Pace = field(default_factory=Pace)
    """The pace the estimates are scaled by (learned from the run directory's rows)."""

    def of(self, section: Section, action: str | None = None) -> list[PlannedPoint]:
        """The planned points of `section` (with `action`, only those)."""
        return [p for p in self.points if p.section.name == section.name and action in (None, p.action)]

    @property
    def run_s(self) -> float:
        """Estimated seconds of the points this invocation runs."""
        return sum(p.cost_s for p in self.points if p.action == RUN)


def make_plan(sections: list[Section], target: Target, budget_s: float, run_dir: Path, resume: bool) -> Plan:
    """Cost every point at this machine's pace, mark finished ones done (with `resume`) and shared
    ones reused, fit the rest into `budget_s` (points without device work always run)."""
    if not budget_s > 0:
        raise ValueError(f"--budget must be positive, got {budget_s:g} s: pass e.g. --budget 20m")
    pace = pace_of_rows(sections, target, run_dir)
    done: dict[str, set[str]] = {}
    for section in sections:
        path = run_dir / section.file
        specs = [dataclasses.asdict(p.spec) for p in section.points]
        done[section.name] = _finished_keys(section.workload, specs, path) if resume and specs else set()
    ordered = sorted(
        ((p.tier, i, j, s, p) for i, s in enumerate(sections) for j, p in enumerate(s.points)),
        key=lambda item: item[:3],
    )
    planned, spent = [], 0.0
    measured_by: dict[tuple[str, str, bool], str] = {}
    for _, _, _, section, point in ordered:
        spec = dataclasses.asdict(point.spec)
        key = identity_key(section.workload, spec)
        cost = point_cost_s(section.workload, spec, target, reused=section.reuse_worker)
        owner = measured_by.setdefault((section.workload, key, section.reuse_worker), section.name)
        factor = pace.factor if section.device_work else 1.0
        if key in done[section.name]:
            planned.append(PlannedPoint(section, point, cost, DONE, pace=factor))
        elif owner != section.name:
            planned.append(PlannedPoint(section, point, 0.0, REUSE, reuses=owner))
        elif not section.device_work:
            planned.append(PlannedPoint(section, point, cost, RUN))
        elif spent + cost * factor <= budget_s:
            spent += cost * factor
            planned.append(PlannedPoint(section, point, cost, RUN, pace=factor))
        else:
            planned.append(PlannedPoint(section, point, cost, LATER, pace=factor))
    return Plan(target, budget_s, planned, list(sections), pace)


def parse_budget(text: str) -> float:
    """'20m', '90s', '1h', '1h30m' or seconds -> seconds."""
    value = text.strip().lower()
    total, number = 0.0, ""
    units = {"h": 3600.0, "m": 60.0, "s": 1.0}
    for char in value:
        if char.isdigit() or char == ".":
            number += char
        elif char in units and number:
            total += float(number) * units[char]
            number = ""
        else:
            raise ValueError(f"--budget takes a duration like 20m, 90s or 1h30m, got {text!r}")
    if number:
        total += float(number)
    if total <= 0:
        raise ValueError(f"--budget takes a positive duration like 20m, got {text!r}")
    return total
