"""Running a study plan: time left goes to later points, a point that would pass the deadline is
skipped while smaller ones still run, resume finishes what was skipped, points are batched into
few workers, and a failed section does not stop the study.

The points are the accounting workload (no device work, a fraction of a second each); the tests
that are about the budget give them estimates of their own (`costs`) in place of the cost model,
so that what the pace says is known: estimates of minutes make the points far faster than
estimated, estimates of a millisecond far slower.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from lmscope.records.results import read_records
from lmscope.study import pace, planner
from lmscope.study.accounting_point import Spec
from lmscope.study.execute import MANIFEST, _batches, later_that_fit, run_plan
from lmscope.study.pace import Pace
from lmscope.study.planner import DONE, LATER, REUSE, RUN, make_plan
from lmscope.study.sections import Point, Section
from lmscope.study.target import Target

ACCOUNTING = "lmscope.study.accounting_point"


def _section(name: str, workload: str, meshes: list[tuple[int, int]], device_work: bool = True) -> Section:
    """One tier, so that the points run in one worker."""
    return Section(
        name=name,
        question=f"{name}?",
        workload=workload,
        points=[Point(Spec(model="small", fsdp=f, tp=t), tier=0) for f, t in meshes],
        device_work=device_work,
    )


@pytest.fixture
def costs(monkeypatch) -> dict[int, float]:
    """Estimated seconds of an accounting point by its fsdp, in place of `cost.point_cost_s`."""
    table: dict[int, float] = {}
    for module in (planner, pace):
        monkeypatch.setattr(module, "point_cost_s", lambda _w, spec, _t, reused: table[spec["fsdp"]])
    return table


def _fsdps(run_dir) -> list[int]:
    return [r["fsdp"] for r in read_records(run_dir / "accounting.jsonl")]


def test_time_left_after_the_plan_goes_to_later_points_that_fit_it(tmp_path, costs):
    """Three planned points estimated at 250 s take seconds: the pace falls to its floor (half).
    Of the later points, 1500 s (750 s at that pace) fits the time left, 2500 s does not, and
    400 s after it still does (the planner's rule, on the time left)."""
    costs.update({2: 250.0, 4: 250.0, 8: 250.0, 16: 1500.0, 32: 2500.0, 64: 400.0})
    sections = [_section("accounting", ACCOUNTING, [(f, 1) for f in costs])]
    plan = make_plan(sections, Target(), 1000.0, tmp_path, resume=False)
    assert [p.action for p in plan.points] == [RUN, RUN, RUN, LATER, LATER, LATER]

    manifest = run_plan(plan, tmp_path, timeout_s=120)
    assert _fsdps(tmp_path) == [2, 4, 8, 16, 64]
    state = manifest["sections"]["accounting"]
    assert state["ran"] == state["finished"] == 5 and state["state"] == "partial"
    assert manifest["beyond_plan"] == 2
    assert "--resume" in manifest["stopped"]
    assert json.loads((tmp_path / MANIFEST).read_text())["beyond_plan"] == 2


def test_a_slow_pace_skips_what_no_longer_fits_and_resume_finishes_it_without_running_points_again(
    tmp_path, costs
):
    """Points estimated at a millisecond take longer: the pace rises past a hundred from the
    first of them, so the planned 10 s point is not started in a 20 s budget, nor the later one.
    The next run with --resume (a budget for that pace) runs just those two."""
    costs.update({2: 0.001, 4: 0.001, 8: 0.001, 16: 10.0, 32: 15.0})
    sections = [_section("accounting", ACCOUNTING, [(f, 1) for f in costs])]
    first = make_plan(sections, Target(), 20.0, tmp_path, resume=False)
    assert [p.action for p in first.points] == [RUN, RUN, RUN, RUN, LATER]
    manifest = run_plan(first, tmp_path, timeout_s=120)
    assert _fsdps(tmp_path) == [2, 4, 8]
    assert manifest["sections"]["accounting"]["state"] == "partial"
    assert manifest["beyond_plan"] == 0 and "--resume" in manifest["stopped"]

    second = make_plan(sections, Target(), 1e7, tmp_path, resume=True)
    assert [p.action for p in second.points] == [DONE, DONE, DONE, RUN, RUN]
    manifest = run_plan(second, tmp_path, timeout_s=120)
    records = read_records(tmp_path / "accounting.jsonl")
    assert [r["fsdp"] for r in records] == [2, 4, 8, 16, 32]
    assert all(r["status"] == "ok" and r["total_gib"] > 0 for r in records)
    assert manifest["sections"]["accounting"]["state"] == "complete"
    assert manifest["stopped"] is None
    saved = json.loads((tmp_path / MANIFEST).read_text())
    assert len(saved["commands"]) == 2


def test_a_point_that_would_pass_the_deadline_is_skipped_and_a_smaller_one_after_it_runs(tmp_path, costs):
    """At the pace of the millisecond points the 10 s point would take far more than the 20 s
    budget: it is skipped, not started, and the millisecond point after it still runs."""
    costs.update({2: 0.001, 4: 0.001, 8: 0.001, 16: 10.0, 32: 0.001})
    sections = [_section("accounting", ACCOUNTING, [(f, 1) for f in costs])]
    plan = make_plan(sections, Target(), 20.0, tmp_path, resume=False)
    assert all(p.action == RUN for p in plan.points)
    manifest = run_plan(plan, tmp_path, timeout_s=120)
    assert _fsdps(tmp_path) == [2, 4, 8, 32]  # no row for the skipped point: it stays pending
    state = manifest["sections"]["accounting"]
    assert state["state"] == "partial" and state["failed_points"] == 0 and state["ran"] == 4
    assert "--resume" in manifest["stopped"]


def test_tier_zero_of_every_section_runs_first_then_each_section_in_one_batch():
    """Plan order is tier by tier (a0 b0 a1 b1 a2); the batches are a0 | b0 | a1 a2 | b1: a short
    run still answers every question, and a section's later tiers share one worker."""
    a = Section(name="a", question="a?", workload=ACCOUNTING)
    b = Section(name="b", question="b?", workload=ACCOUNTING)
    order = [(a, 0), (b, 0), (a, 1), (b, 1), (a, 2)]
    points = [planner.PlannedPoint(s, Point(f"{s.name}{t}", t), 1.0, RUN) for s, t in order]
    batches = [(s.name, [p.point.spec for p in ps]) for s, ps in _batches(points)]
    assert batches == [("a", ["a0"]), ("b", ["b0"]), ("a", ["a1", "a2"]), ("b", ["b1"])]


def test_a_failed_section_is_reported_and_the_study_goes_on(tmp_path):
    sections = [
        _section("broken", "lmscope.study.no_such_workload", [(2, 1)]),
        _section("accounting", ACCOUNTING, [(8, 1)]),
    ]
    plan = make_plan(sections, Target(), 600.0, tmp_path, resume=False)
    manifest = run_plan(plan, tmp_path, timeout_s=120)
    assert manifest["sections"]["broken"]["state"] == "failed"
    assert manifest["sections"]["accounting"]["state"] == "complete"
    (record,) = read_records(tmp_path / "accounting.jsonl")
    assert record["fsdp"] == 8 and record["status"] == "ok"


def test_pace_scales_estimates_by_what_finished_points_took_from_the_first_one():
    measured = Pace()
    assert measured.factor == 1.0
    measured.add(1.0, 3.0)
    assert measured.factor == 3.0  # a loaded machine shows from its first point
    measured.add(2.0, 6.0)
    assert measured.factor == 3.0
    measured.add(1.0, 100.0)
    assert measured.factor == pytest.approx(109 / 4)  # no cap: ten times slower, ten times fewer


def test_pace_goes_below_one_for_points_faster_than_estimated_down_to_a_half():
    measured = Pace()
    for _ in range(3):
        measured.add(10.0, 7.0)
    assert measured.factor == pytest.approx(0.7)
    measured.add(100.0, 1.0)
    assert measured.factor == 0.5


def test_later_points_are_chosen_in_plan_order_while_their_scaled_estimates_fit():
    later = [planner.PlannedPoint(None, None, cost, LATER) for cost in (30.0, 50.0, 10.0, 5.0)]
    assert [p.cost_s for p in later_that_fit(later, 40.0, 1.0)] == [30.0, 10.0]
    assert [p.cost_s for p in later_that_fit(later, 40.0, 0.5)] == [30.0, 50.0]
    assert [p.cost_s for p in later_that_fit(later, 40.0, 2.0)] == [10.0, 5.0]
    assert later_that_fit(later, 1.0, 1.0) == []


def test_points_without_device_work_run_whatever_the_budget_says(tmp_path, costs):
    """The accounting costs no device time: its points run even where their estimates (here far
    past the budget, as a loaded machine's pace would make them) do not fit; a device point
    that does not fit waits for --resume."""
    costs.update({2: 1000.0, 4: 1000.0, 8: 1000.0})
    sections = [_section("slow", ACCOUNTING, [(2, 1)]),
                _section("accounting", ACCOUNTING, [(4, 1), (8, 1)], device_work=False)]
    plan = make_plan(sections, Target(), 10.0, tmp_path, resume=False)
    assert [p.action for p in plan.points] == [LATER, RUN, RUN]
    manifest = run_plan(plan, tmp_path, timeout_s=120)
    assert _fsdps(tmp_path) == [4, 8]
    assert manifest["sections"]["accounting"]["state"] == "complete"
    assert not (tmp_path / "slow.jsonl").exists()


def test_a_point_two_sections_share_is_measured_once_and_its_row_reused(tmp_path, costs):
    """b's point is a's second point (same workload, spec and worker use): it runs once, in a,
    and b's file gets that row, marked reused_from a. c runs it in a fresh worker per point,
    which is another measurement: c measures it itself. A resume finds all of them done."""
    costs.update({2: 1.0, 4: 1.0})
    a = _section("a", ACCOUNTING, [(2, 1), (4, 1)])
    b = _section("b", ACCOUNTING, [(4, 1)])
    c = dataclasses.replace(_section("c", ACCOUNTING, [(4, 1)]), reuse_worker=False)
    plan = make_plan([a, b, c], Target(), 600.0, tmp_path, resume=False)
    assert [(p.section.name, p.action, p.reuses) for p in plan.points] == [
        ("a", RUN, None), ("a", RUN, None), ("b", REUSE, "a"), ("c", RUN, None)]
    manifest = run_plan(plan, tmp_path, timeout_s=120)
    (measured,) = [r for r in read_records(tmp_path / "a.jsonl") if r["fsdp"] == 4]
    (reused,) = read_records(tmp_path / "b.jsonl")
    (own,) = read_records(tmp_path / "c.jsonl")
    assert reused == {**measured, "reused_from": "a"}
    assert "reused_from" not in own and own["time"] >= measured["time"]
    assert manifest["sections"]["b"]["state"] == "complete" and manifest["sections"]["b"]["ran"] == 0
    again = make_plan([a, b, c], Target(), 600.0, tmp_path, resume=True)
    assert {p.action for p in again.points} == {DONE}
