"""Adaptive sampling: timing goes on past the minimum until the median is tight or time is up."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lmscope.measure.sampling import Sampler, StopRule, parse_target, precision, sampling_metrics
from lmscope.measure.timer import time_phased_steps
from lmscope.records.stats import median_interval
from lmscope.workloads.step import Spec, run_point


def test_without_a_target_exactly_the_minimum_is_timed():
    sampler = Sampler(StopRule(), minimum=3)
    assert sampler.stop_reason([1.0, 1.0], 0.0) is None
    assert sampler.stop_reason([1.0, 1.0, 1.0], 0.0) == "steps"


def test_timing_stops_once_the_median_is_within_the_target():
    rng = np.random.default_rng()
    times = list(rng.lognormal(0.0, 0.05, 400))
    sampler = Sampler(StopRule(target_ci=0.01, max_time_s=60), minimum=5)
    stopped = next(n for n in range(1, 401) if sampler.stop_reason(times[:n], 0.0) is not None)
    assert precision(times[:stopped]) <= 0.01
    assert 20 < stopped < 400
    # a check that is due fails until the precision is reached, and never before the minimum
    assert Sampler(StopRule(target_ci=0.5), minimum=5).stop_reason(times[:4], 0.0) is None


def test_the_time_budget_ends_a_target_that_is_not_reached():
    rng = np.random.default_rng()
    times = list(rng.lognormal(0.0, 0.5, 10))
    sampler = Sampler(StopRule(target_ci=0.001, max_time_s=2.0), minimum=5)
    assert sampler.stop_reason(times, 1.0) is None
    assert sampler.stop_reason(times, 2.5) == "time"


def test_the_timer_keeps_going_until_the_rule_stops_it():
    device = torch.device("cpu")
    loose = time_phased_steps(lambda clock: None, warmup=0, steps=2, device=device,
                              stop=StopRule(target_ci=0.99, max_time_s=60))
    assert loose.stop_reason == "target" and len(loose.times_ms) >= 5  # no interval below 5 steps
    strict = time_phased_steps(lambda clock: None, warmup=0, steps=3, device=device,
                               stop=StopRule(target_ci=1e-9, max_time_s=0.05))
    assert strict.stop_reason == "time" and len(strict.times_ms) > 3
    fixed = time_phased_steps(lambda clock: None, warmup=0, steps=4, device=device)
    assert fixed.stop_reason == "steps" and len(fixed.times_ms) == 4


def test_a_row_records_the_precision_reached_the_target_and_why_it_stopped():
    times = [10.0, 10.2, 9.9, 10.1, 10.4, 10.0, 9.8]
    row = sampling_metrics(times, StopRule(target_ci=0.05), "target")
    assert row == {"median_ci_rel": median_interval(times, 0.95, 1000).relative_half_width,
                   "ci_target": 0.05, "stop_reason": "target"}
    assert sampling_metrics(times[:3], StopRule(), "steps") == {
        "median_ci_rel": None, "ci_target": None, "stop_reason": "steps"}


def test_bench_rows_carry_the_sampling():
    row = run_point({"size": "tiny", "context_length": 8, "batch_size": 1, "mode": "forward", "warmup": 1,
                     "steps": 5, "target_ci": 0.9, "max_time_s": 30.0, "device": "cpu"})
    assert row["stop_reason"] == "target" and row["n"] == len(row["times_ms"]) >= 5
    assert row["ci_target"] == 0.9 and 0 < row["median_ci_rel"] <= 0.9


@pytest.mark.parametrize("fields,message", [
    ({"target_ci": 1.0}, "target_ci must be a relative half-width"),
    ({"target_ci": -0.1}, "--target-ci off"),
    ({"max_time_s": 0.0}, "max_time_s must be a positive number"),
    ({"max_time_s": float("inf")}, "--max-time 10"),
])
def test_bad_targets_and_budgets_are_refused_with_the_fix(fields, message):
    with pytest.raises(ValueError, match=message):
        Spec(size="tiny", **fields)


def test_target_flag_reads_off_and_numbers():
    assert parse_target("off") == 0.0 and parse_target("0.02") == 0.02
    with pytest.raises(ValueError, match="--target-ci takes"):
        parse_target("tight")


def test_resume_keeps_points_finished_under_another_target_or_budget():
    from lmscope.running.runner import identity_key

    point = {"size": "tiny", "steps": 10, "target_ci": 0.01, "max_time_s": 10.0}
    other = {**point, "target_ci": 0.0, "max_time_s": 3.0}
    assert identity_key("bench", point) == identity_key("bench", other)
    assert identity_key("bench", point) != identity_key("bench", {**point, "steps": 20})


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_gpu_bench_point_samples_until_its_median_is_tight():
    row = run_point({"size": "tiny", "context_length": 64, "batch_size": 2, "mode": "train-step", "warmup": 3,
                     "steps": 10, "target_ci": 0.05, "max_time_s": 30.0, "device": "cuda"})
    assert row["stop_reason"] == "target" and row["median_ci_rel"] <= 0.05 and row["n"] >= 10
