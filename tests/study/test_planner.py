"""The study's planner: what runs for a device, a GPU count and a budget, and how resume goes on."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest

from lmscope.study.planner import DONE, LATER, RUN, make_plan, parse_budget
from lmscope.study.sections import FLASH_TORCH_MAX_SEQ, GPU_CONTEXTS, GPU_SIZES, build_sections
from lmscope.study.target import Target

CPU = Target()
H100 = Target(device_type="cuda", gpus=1, device_name="NVIDIA H100 80GB HBM3")
TWO_GPUS = Target(device_type="cuda", gpus=2, device_name="NVIDIA H100 80GB HBM3")


def _plan(target: Target, budget_s: float, run_dir: Path, resume: bool = False):
    return make_plan(build_sections(target, run_dir), target, budget_s, run_dir, resume)


def test_cpu_plan_runs_tiny_models_on_the_cpu_and_skips_distributed(tmp_path):
    plan = _plan(CPU, 3600, tmp_path)
    actions = {p.action for p in plan.points}
    assert actions == {RUN}
    specs = [dataclasses.asdict(p.point.spec) for p in plan.points]
    assert {s["size"] for s in specs if "size" in s} == {"tiny"}
    assert all(s["device"] == "cpu" for s in specs if "device" in s)
    skipped = {s.name: s.skip_reason for s in plan.sections if s.skip_reason}
    assert set(skipped) == {"comm", "ddp"} and "2+ GPUs" in skipped["comm"]
    assert plan.run_s < 10 * 60


def test_gpu_plan_has_the_study_sizes_and_contexts(tmp_path):
    plan = _plan(H100, 10**6, tmp_path)
    timing = next(s for s in plan.sections if s.name == "timing")
    grid = {(p.spec.size, p.spec.context_length) for p in timing.points}
    assert grid == {(s, c) for s in GPU_SIZES for c in GPU_CONTEXTS}
    assert {s.name for s in plan.sections if s.skip_reason} == {"comm", "ddp"}
    two = _plan(TWO_GPUS, 10**6, tmp_path)
    assert not any(s.skip_reason for s in two.sections)
    assert {p.section.name for p in two.points} >= {"comm", "ddp"}


def test_gpu_attention_points_are_ones_that_can_run_in_reasonable_time(tmp_path):
    plan = _plan(H100, 10**6, tmp_path)
    attention = next(s for s in plan.sections if s.name == "attention")
    specs = [p.spec for p in attention.points]
    assert not [s for s in specs if s.impl == "sdpa-flash" and s.dtype == "fp32"]  # 16-bit kernels only
    assert {s.dtype for s in specs if s.impl == "sdpa-efficient"} == {"fp32"}
    assert max(s.seq_len for s in specs if s.impl == "flash-torch") == FLASH_TORCH_MAX_SEQ
    assert max(s.seq_len for s in specs if s.impl == "flash-triton") > FLASH_TORCH_MAX_SEQ


@pytest.mark.parametrize("target", [CPU, H100], ids=["cpu", "h100"])
def test_a_short_budget_gives_every_section_its_first_point_first(tmp_path, target):
    full = _plan(target, 10**6, tmp_path)
    tier0 = sum(p.cost_s for p in full.points if p.point.tier == 0)
    plan = _plan(target, tier0 + 1e-6, tmp_path)
    assert plan.run_s <= tier0 + 1e-6
    running = {p.section.name for p in plan.points if p.action == RUN}
    assert running == {s.name for s in plan.sections if s.points}
    assert [p.point.tier == 0 for p in plan.points] == [p.action == RUN for p in plan.points]
    assert any(p.action == LATER for p in plan.points)


def _finish(plan, run_dir: Path) -> None:
    """Write an ok record for each point the plan runs (what the runner would append)."""
    for planned in plan.points:
        if planned.action == RUN:
            record = {
                "workload": planned.section.workload,
                **dataclasses.asdict(planned.point.spec),
                "status": "ok",
            }
            with (run_dir / planned.section.file).open("a") as handle:
                handle.write(json.dumps(record) + "\n")


def test_the_h100_study_fits_three_resumed_runs_of_benchmarks_study_run_gpu_sh(tmp_path):
    """The costs are calibrated on the H100 study's rows (benchmarks/results/study-h100): the
    whole study fits three resumed runs of the budget benchmarks/study/run_gpu.sh gives each
    10-minute call (its BUDGET default)."""
    script = (Path(__file__).parents[2] / "benchmarks/study/run_gpu.sh").read_text()
    budget = parse_budget(re.search(r"BUDGET=\$\{BUDGET:-(\w+)\}", script).group(1))
    assert budget < 10 * 60
    total = sum(p.cost_s for p in _plan(H100, 1e6, tmp_path, resume=False).points)
    assert total <= 3 * budget
    runs = 0
    while True:
        plan = _plan(H100, budget, tmp_path, resume=True)
        if all(p.action == DONE for p in plan.points):
            break
        runs += 1
        assert plan.run_s <= budget
        _finish(plan, tmp_path)
    assert runs <= 3


def test_resume_skips_finished_points_and_without_resume_runs_them_again(tmp_path):
    first = _plan(CPU, 60, tmp_path)
    _finish(first, tmp_path)
    ran = {id(p.point) for p in first.points if p.action == RUN}
    again = _plan(CPU, 60, tmp_path, resume=True)
    done = [p for p in again.points if p.action == DONE]
    assert len(done) == len(ran) > 0
    assert not any(p.action == DONE for p in _plan(CPU, 60, tmp_path).points)


@pytest.mark.parametrize(
    ("text", "seconds"), [("20m", 1200), ("90s", 90), ("1h30m", 5400), ("45", 45), ("1.5m", 90)]
)
def test_parse_budget(text, seconds):
    assert parse_budget(text) == seconds


@pytest.mark.parametrize("text", ["", "abc", "0m", "m", "20x"])
def test_parse_budget_rejects_what_is_not_a_duration(text):
    with pytest.raises(ValueError, match="--budget"):
        parse_budget(text)


def test_every_accounting_point_is_a_plan_that_can_exist():
    """The study plans only meshes `plan parallel` accepts (xl's 25 heads admit no TP of 2 or 4)."""
    import dataclasses

    from lmscope.study.accounting_point import run_point
    from lmscope.study.sections import _accounting

    points = _accounting()
    assert {p.spec.model for p in points} == {"xl", "2.7B"}
    assert all(p.spec.tp in (1, 5, 25) for p in points if p.spec.model == "xl")
    assert any(p.spec.tp > 1 for p in points if p.spec.model == "2.7B")
    for point in points:
        assert run_point(dataclasses.asdict(point.spec))
