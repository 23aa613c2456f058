"""Run a study plan through the one runner, each section into its own JSONL.

Every section's tier-0 points run first (so a run cut short still answers each question), then
each section's other points as one batch: in a section that reuses its worker, one worker start
per section, not one per tier. Past tier 0 a section's higher tiers thus run before the next
section's tier 1: when the pace is worse than estimated, the later sections' points are the ones
skipped, for the next --resume.
Progress is one rich bar over the plan's estimated seconds (so its ETA weighs a 2.7B point more
than a tiny one). A point is skipped, not started, when its estimate, scaled by the pace (pace.py:
the run directory's earlier rows, then every point finished in this run), would pass the budget's
deadline; smaller points after it still run, so a run uses its budget to the end and passes it by
at most one point's misestimate. Points without device work (the accounting) are never skipped.
When the planned points are done with time left, the plan's `later` points that fit it run too,
through the same runner and into the same files. A point the plan marks `reuse` is not run: the
row its twin measured in another section is copied into its section's file, with `reused_from`
naming that section. A section whose run raises is reported and the study goes on. `study.json`
in the run directory records the command, the target and each section's state for `lmscope report`.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import sys
import timeit
from pathlib import Path
from typing import Any

from lmscope.records.results import append_record, read_records
from lmscope.report import console
from lmscope.report.study_progress import StudyProgress, study_progress
from lmscope.report.tables import Table
from lmscope.running.runner import FINISHED, _finished_keys, identity_key, record_spec, run_sweep
from lmscope.study.pace import Pace
from lmscope.study.planner import DONE, LATER, REUSE, RUN, Plan, PlannedPoint
from lmscope.study.sections import Section

MANIFEST = "study.json"


def plan_table(plan: Plan) -> Table:
    """Per section: points, done, to run now, left for later, estimated minutes, or why skipped."""
    header = ["section", "workload", "points", "done", "run now", "reused", "later", "est. min", "note"]
    rows = []
    for section in plan.sections:
        if section.skip_reason:
            rows.append([section.name, section.workload, 0, 0, 0, 0, 0, 0.0,
                         f"skipped: {section.skip_reason}"])
            continue
        counts = {a: plan.of(section, a) for a in (DONE, RUN, REUSE, LATER)}
        est = sum(p.cost_s for p in counts[RUN]) / 60
        notes = [f"reused: measured once, in {owner}"
                 for owner in dict.fromkeys(p.reuses for p in counts[REUSE])]
        notes += ["no device work: always runs"] if not section.device_work else []
        notes += ["later: if time is left, else --resume"] if counts[LATER] else []
        rows.append(
            [
                section.name,
                section.workload.rsplit(".", 1)[-1],
                len(plan.of(section)),
                len(counts[DONE]),
                len(counts[RUN]),
                len(counts[REUSE]),
                len(counts[LATER]),
                round(est, 1),
                "; ".join(notes),
            ]
        )
    return header, rows


def run_plan(
    plan: Plan, run_dir: Path, *, timeout_s: float | None = None, command: str | None = None
) -> dict[str, Any]:
    """Run the plan's RUN points, then the `later` ones that fit the time left; return (and write)
    the manifest with each section's state."""
    run_dir.mkdir(parents=True, exist_ok=True)
    manifest = _manifest(plan, run_dir, command)
    deadline = timeit.default_timer() + plan.budget_s
    with study_progress(plan.run_s) as progress:
        session = _Session(run_dir, manifest, deadline, progress, timeout_s, copy.copy(plan.pace))
        later = [p for p in plan.points if p.action == LATER]
        finished = session.run(_batches([p for p in plan.points if p.action == RUN]))
        if finished and later:
            extra = later_that_fit(later, deadline - timeit.default_timer(), session.pace.factor)
            manifest["beyond_plan"] = len(extra)
            progress.extend(sum(p.cost_s for p in extra))
            finished = session.run(_batches(extra)) and len(extra) == len(later)
        if not finished:
            manifest["stopped"] = "budget spent: rerun with --resume to go on"
    copy_reused_rows(plan, run_dir)
    _finish(manifest, plan, run_dir)
    _write(run_dir, manifest)
    return manifest


def copy_reused_rows(plan: Plan, run_dir: Path) -> int:
    """Copy each `reuse` point's row from the section that measured it into its own section's file
    (marked `reused_from`), where that row exists and no copy is there yet; the number copied."""
    copied = 0
    for planned in (p for p in plan.points if p.action == REUSE and p.reuses):
        section, owner = planned.section, next(s for s in plan.sections if s.name == planned.reuses)
        spec = dataclasses.asdict(planned.point.spec)
        key = identity_key(section.workload, spec)
        if key in _finished_keys(section.workload, [spec], run_dir / section.file):
            continue
        path = run_dir / owner.file
        rows = read_records(path) if path.exists() else []
        twins = [r for r in rows if r.get("status") in FINISHED and r.get("workload") == section.workload
                 and identity_key(section.workload, record_spec(r, spec, section.workload)) == key]
        if twins:
            append_record(run_dir / section.file, {**twins[-1], "reused_from": owner.name})
            copied += 1
    return copied


@dataclasses.dataclass
class _Session:
    """One invocation's run: where rows go, the manifest it updates, its deadline and pace."""

    run_dir: Path
    manifest: dict[str, Any]
    deadline: float
    progress: StudyProgress
    timeout_s: float | None
    pace: Pace
    """The plan's pace, updated by every point finished here."""
    skipped: int = 0
    """Points not started because they would have ended past the deadline."""

    def run(self, batches: list[tuple[Section, list[PlannedPoint]]]) -> bool:
        """Run `batches` in order through the runner; False when the budget skipped a point."""
        skipped_before = self.skipped
        for section, points in batches:
            state = self.manifest["sections"][section.name]
            try:
                self._sweep(section, points, state)
            except Exception as error:  # noqa: BLE001 - a failed section is reported, the study goes on
                state["error"] = f"{type(error).__name__}: {error}".splitlines()[0][:300]
                console.say(f"section {section.name} failed: {state['error']}")
            finally:
                _write(self.run_dir, self.manifest)
        return self.skipped == skipped_before

    def _sweep(self, section: Section, points: list[PlannedPoint], state: dict[str, Any]) -> None:
        """One batch as one sweep, skipping each point that would end past the deadline."""
        costs = [p.cost_s for p in points]
        started: list[PlannedPoint] = []

        def on_start(index: int, spec: dict[str, Any]) -> bool:
            estimate = points[index].estimate_s * self.pace.factor
            if section.device_work and timeit.default_timer() + estimate > self.deadline:
                self.skipped += 1
                self.progress.skip(costs[index])
                return False
            started.append(points[index])
            self.progress.start(section.name, spec, costs[index])
            return True

        def on_done(record: dict[str, Any]) -> None:
            if section.device_work and record.get("status") in FINISHED:
                self.pace.add(started[-1].estimate_s, float(record.get("wall_s") or 0.0))
            state["ran"] += 1
            if record.get("status") not in ("ok", "oom"):
                state["failed_points"] += 1
            self.progress.done(record)

        run_sweep(
            section.workload,
            [p.point.spec for p in points],
            out=self.run_dir / section.file,
            resume=True,
            timeout_s=self.timeout_s or max(300.0, 6 * max(costs)),
            reuse_worker=section.reuse_worker,
            on_start=on_start,
            on_done=on_done,
        )


def later_that_fit(later: list[PlannedPoint], seconds_left: float, factor: float) -> list[PlannedPoint]:
    """The points of `later`, in plan order, that fit `seconds_left` with their estimates scaled
    by `factor`: the planner's rule, applied to the time the planned points left over."""
    chosen, spent = [], 0.0
    for planned in later:
        cost = planned.estimate_s * factor
        if spent + cost <= seconds_left:
            chosen.append(planned)
            spent += cost
    return chosen


def _batches(points: list[PlannedPoint]) -> list[tuple[Section, list[PlannedPoint]]]:
    """Each section's tier-0 points, section by section; then each section's other points in
    one batch (plan order within a section): a worker start per batch, not per tier."""
    batches: dict[tuple[bool, str], tuple[Section, list[PlannedPoint]]] = {}
    for planned in points:
        key = (planned.point.tier > 0, planned.section.name)
        batches.setdefault(key, (planned.section, []))[1].append(planned)
    first = [batch for (later, _), batch in batches.items() if not later]
    return first + [batch for (later, _), batch in batches.items() if later]


def _manifest(plan: Plan, run_dir: Path, command: str | None) -> dict[str, Any]:
    old = _read(run_dir)
    sections = {}
    for section in plan.sections:
        sections[section.name] = {
            "question": section.question,
            "workload": section.workload,
            "file": section.file,
            "points": len(section.points),
            "skip_reason": section.skip_reason,
            "variables": section.variables,
            "ran": 0,
            "failed_points": 0,
            "error": None,
        }
    commands = [*old.get("commands", []), command or " ".join(["lmscope", *sys.argv[1:]])]
    return {
        "target": dataclasses.asdict(plan.target),
        "budget_s": plan.budget_s,
        "commands": commands,
        "sections": sections,
        "stopped": None,
        "beyond_plan": 0,
    }


def _finish(manifest: dict[str, Any], plan: Plan, run_dir: Path) -> None:
    """Each section's state from its results file: finished points, failures, what is missing."""
    for section in plan.sections:
        state = manifest["sections"][section.name]
        path = run_dir / section.file
        records = read_records(path) if path.exists() else []
        ok = sum(r.get("status") in ("ok", "oom") for r in records)
        specs = [dataclasses.asdict(p.spec) for p in section.points]
        done = _finished_keys(section.workload, specs, path) if specs else set()
        state["finished"] = sum(identity_key(section.workload, spec) in done for spec in specs)
        if section.skip_reason:
            state["state"] = "skipped"
        elif state["error"] or (records and ok == 0):
            state["state"] = "failed"
        elif state["finished"] >= state["points"]:
            state["state"] = "complete"
        else:
            state["state"] = "partial"


def _read(run_dir: Path) -> dict[str, Any]:
    path = run_dir / MANIFEST
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _write(run_dir: Path, manifest: dict[str, Any]) -> None:
    (run_dir / MANIFEST).write_text(json.dumps(manifest, indent=1, default=str))


def summary_table(manifest: dict[str, Any]) -> Table:
    """Per section after a run: its state, finished of all points, failures and the error."""
    header = ["section", "state", "finished", "points", "failed points", "error"]
    rows = [
        [name, s.get("state"), s.get("finished"), s["points"], s["failed_points"], s["error"] or ""]
        for name, s in manifest["sections"].items()
    ]
    return header, rows
