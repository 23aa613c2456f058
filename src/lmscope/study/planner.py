"""The study's plan: which points run now, which are done, which wait for a later --resume.

The budget is spent tier by tier across the sections (see sections.py), each point costed by
`cost.point_cost_s`. Points already finished in the run directory cost nothing, so running the
same study again with `--resume` and the same budget goes on where the last run stopped.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from lmscope.runner import _finished_keys, identity_key
from lmscope.study.cost import point_cost_s
from lmscope.study.sections import Point, Section
from lmscope.study.target import Target

RUN, DONE, LATER = "run", "done", "later"


@dataclass(frozen=True)
class PlannedPoint:
    """A point with its estimated cost and what the plan does with it."""

    section: Section
    point: Point
    cost_s: float
    action: str


@dataclass(frozen=True)
class Plan:
    """The study's points in the order they run (tier by tier, section by section)."""

    target: Target
    budget_s: float
    points: list[PlannedPoint]
    sections: list[Section]
    """Every section, in study order (skipped ones included)."""

    def of(self, section: Section, action: str | None = None) -> list[PlannedPoint]:
        """The planned points of `section` (with `action`, only those)."""
        return [p for p in self.points if p.section.name == section.name and action in (None, p.action)]

    @property
    def run_s(self) -> float:
        """Estimated seconds of the points this invocation runs."""
        return sum(p.cost_s for p in self.points if p.action == RUN)


def make_plan(sections: list[Section], target: Target, budget_s: float, run_dir: Path, resume: bool) -> Plan:
    """Cost every point, mark finished ones done (with `resume`), fit the rest into `budget_s`."""
    if not budget_s > 0:
        raise ValueError(f"--budget must be positive, got {budget_s:g} s: pass e.g. --budget 20m")
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
    for _, _, _, section, point in ordered:
        spec = dataclasses.asdict(point.spec)
        cost = point_cost_s(section.workload, spec, target, reused=section.reuse_worker)
        if identity_key(section.workload, spec) in done[section.name]:
            planned.append(PlannedPoint(section, point, cost, DONE))
        elif spent + cost <= budget_s:
            spent += cost
            planned.append(PlannedPoint(section, point, cost, RUN))
        else:
            planned.append(PlannedPoint(section, point, cost, LATER))
    return Plan(target, budget_s, planned, list(sections))


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
