"""Running a study plan: a budget stop resumed, and a failed section that does not stop the study.

The points are the accounting workload (no device work), so each costs a worker start only.
"""

from __future__ import annotations

import json

from lmscope.results import read_records
from lmscope.study.accounting_point import Spec
from lmscope.study.execute import MANIFEST, run_plan
from lmscope.study.planner import DONE, LATER, RUN, make_plan
from lmscope.study.sections import Point, Section
from lmscope.study.target import Target

ACCOUNTING = "lmscope.study.accounting_point"


def _section(name: str, workload: str, meshes: list[tuple[int, int]]) -> Section:
    return Section(
        name=name,
        question=f"{name}?",
        workload=workload,
        points=[Point(Spec(model="small", fsdp=f, tp=t), tier=i) for i, (f, t) in enumerate(meshes)],
    )


def test_a_budget_stop_is_finished_by_resume_without_running_points_again(tmp_path):
    sections = [_section("accounting", ACCOUNTING, [(2, 1), (4, 1)])]
    first = make_plan(sections, Target(), 2.0, tmp_path, resume=False)
    assert [p.action for p in first.points] == [RUN, LATER]
    manifest = run_plan(first, tmp_path, timeout_s=120)
    assert manifest["sections"]["accounting"]["state"] == "partial"
    assert len(read_records(tmp_path / "accounting.jsonl")) == 1

    second = make_plan(sections, Target(), 2.0, tmp_path, resume=True)
    assert [p.action for p in second.points] == [DONE, RUN]
    manifest = run_plan(second, tmp_path, timeout_s=120)
    records = read_records(tmp_path / "accounting.jsonl")
    assert sorted(r["fsdp"] for r in records) == [2, 4]
    assert all(r["status"] == "ok" and r["total_gib"] > 0 for r in records)
    assert manifest["sections"]["accounting"]["state"] == "complete"
    saved = json.loads((tmp_path / MANIFEST).read_text())
    assert len(saved["commands"]) == 2


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


def test_pace_scales_estimates_by_what_finished_points_took():
    from lmscope.study.execute import Pace

    pace = Pace()
    pace.add(1.0, 3.0)
    pace.add(1.0, 3.0)
    assert pace.factor == 1.0
    pace.add(2.0, 6.0)
    assert pace.factor == 3.0
    pace.add(1.0, 100.0)
    assert pace.factor == 5.0
