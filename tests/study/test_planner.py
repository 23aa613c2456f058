"""The study's planner: what runs for a device, a GPU count and a budget, and how resume goes on."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest

from lmscope.study.cost import point_cost_s
from lmscope.study.execute import copy_reused_rows
from lmscope.study.planner import DONE, LATER, REUSE, RUN, make_plan, parse_budget
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
    assert actions == {RUN, REUSE}
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
    tier0 = sum(p.cost_s for p in full.points if p.point.tier == 0 and p.section.device_work)
    plan = _plan(target, tier0 + 1e-6, tmp_path)
    assert sum(p.cost_s for p in plan.points if p.action == RUN and p.section.device_work) <= tier0 + 1e-6
    running = {p.section.name for p in plan.points if p.action in (RUN, REUSE)}
    assert running == {s.name for s in plan.sections if s.points}
    measured = [p for p in plan.points if p.section.device_work and p.action != REUSE]
    assert [p.point.tier == 0 for p in measured] == [p.action == RUN for p in measured]
    assert any(p.action == LATER for p in plan.points)


def _finish(plan, run_dir: Path, pace: float | None = None) -> None:
    """Write an ok record for each point the plan runs (what the runner would append; with `pace`,
    a wall time of that many times the point's estimate), then the reused points' copies."""
    for planned in plan.points:
        if planned.action == RUN:
            record = {
                "workload": planned.section.workload,
                **dataclasses.asdict(planned.point.spec),
                "status": "ok",
                **({"wall_s": pace * planned.estimate_s} if pace else {}),
            }
            with (run_dir / planned.section.file).open("a") as handle:
                handle.write(json.dumps(record) + "\n")
    copy_reused_rows(plan, run_dir)


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
        assert sum(p.cost_s for p in plan.points if p.action == RUN and p.section.device_work) <= budget
        _finish(plan, tmp_path)
    assert runs <= 3


def test_resume_skips_finished_points_and_without_resume_runs_them_again(tmp_path):
    first = _plan(CPU, 60, tmp_path)
    _finish(first, tmp_path)
    ran = {id(p.point) for p in first.points if p.action in (RUN, REUSE)}  # _finish copies reused rows
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


def test_a_resumed_plan_scales_its_estimates_by_the_pace_of_the_rows_already_there(tmp_path):
    """The rows of a first run took three times their estimates (a loaded machine): the resumed
    plan says so, and leaves for later what no longer fits the budget at that pace."""
    first = _plan(CPU, 60, tmp_path)
    _finish(first, tmp_path, pace=3.0)
    measured = [p for p in first.points if p.action == RUN and p.section.device_work]
    left = sum(p.estimate_s for p in _plan(CPU, 1e6, tmp_path, resume=True).points
               if p.action == RUN and p.section.device_work)
    again = _plan(CPU, 2 * left, tmp_path, resume=True)
    assert again.pace.points == len(measured) and again.pace.factor == pytest.approx(3.0)
    for planned in again.points:
        if planned.action in (RUN, LATER) and planned.section.device_work:
            assert planned.cost_s == pytest.approx(3.0 * planned.estimate_s)
            assert planned.estimate_s == point_cost_s(planned.section.workload,
                                                      dataclasses.asdict(planned.point.spec), CPU,
                                                      reused=planned.section.reuse_worker)
    assert again.run_s <= 2 * left and any(p.action == LATER for p in again.points)
    assert "x3" in again.pace.describe()


@pytest.mark.parametrize("target", [CPU, H100], ids=["cpu", "h100"])
def test_the_accounting_always_runs_it_needs_no_device(tmp_path, target):
    plan = _plan(target, 1.0, tmp_path)
    accounting = [p for p in plan.points if p.section.name == "accounting"]
    assert len(accounting) > 1 and all(p.action == RUN for p in accounting)
    assert plan.run_s - sum(p.cost_s for p in accounting) <= 1.0


def test_a_point_shared_by_sections_runs_once_and_the_others_reuse_it(tmp_path):
    """On the CPU, the tiny train step at context 128 is in timing, precision and compile: it runs
    once (first in plan order), the others reuse its row; warm-up runs it in a fresh process per
    point, another measurement, and runs it itself. On a GPU, precision and compile share
    medium bf16 at 512."""
    for target, point in ((CPU, dict(size="tiny", context_length=128, mode="train-step",
                                      precision="fp32", compile=False, warmup=2, steps=5, d_model=None)),
                          (H100, dict(size="medium", context_length=512, mode="train-step",
                                      precision="bf16", compile=False))):
        plan = _plan(target, 1e6, tmp_path)
        twins = [p for p in plan.points if p.section.workload == "bench"
                 and all(getattr(p.point.spec, k) == v for k, v in point.items())]
        actions = sorted((p.section.name, p.action, p.reuses) for p in twins)
        owner = next(name for name, action, _ in actions if action == RUN and name != "warmup")
        reusers = [name for name, action, reuses in actions if action == REUSE and reuses == owner]
        assert len(reusers) == len(twins) - 1 - (target is CPU) > 0, actions
        assert ("warmup", REUSE) not in {(n, a) for n, a, _ in actions}
