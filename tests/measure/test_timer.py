"""Timer statistics and the step loop."""

import math
import statistics

import numpy as np
import pytest
import torch

from lmscope.measure.ranges import phase, traced
from lmscope.measure.timer import PhaseClock, percentile, summarize, time_phased_steps, time_steps


def test_summary_statistics_match_numpy():
    rng = np.random.default_rng()
    values = list(rng.exponential(5.0, size=int(rng.integers(3, 40))))
    stats = summarize(values)
    assert math.isclose(stats.mean_ms, float(np.mean(values)))
    assert math.isclose(stats.std_ms, float(np.std(values, ddof=1)))
    assert math.isclose(stats.median_ms, float(np.median(values)))
    assert math.isclose(stats.p20_ms, float(np.percentile(values, 20)))
    assert math.isclose(stats.p80_ms, float(np.percentile(values, 80)))
    assert (stats.min_ms, stats.max_ms, stats.n) == (min(values), max(values), len(values))


def test_single_value_has_zero_spread_and_empty_is_refused():
    assert summarize([3.0]).std_ms == 0.0
    with pytest.raises(ValueError, match="no timings"):
        summarize([])
    with pytest.raises(ValueError):
        percentile([], 50)


def test_as_record_prefixes_keys():
    record = summarize([1.0, 2.0]).as_record("fwd_")
    assert record["fwd_mean_ms"] == 1.5 and record["fwd_n"] == 2


def test_time_steps_runs_warmup_untimed_and_times_each_step():
    calls = []
    times = time_steps(lambda: calls.append(1), warmup=3, steps=5, device=torch.device("cpu"))
    assert len(calls) == 8 and len(times) == 5 and all(t >= 0 for t in times)


def test_phase_clock_measures_each_phase_on_cpu():
    import time

    clock = PhaseClock(torch.device("cpu"))
    clock.start()
    time.sleep(0.02)
    clock.mark("a")
    clock.mark("b")
    elapsed = clock.elapsed_ms()
    assert list(elapsed) == ["a", "b"] and elapsed["a"] >= 15 and elapsed["b"] < elapsed["a"]


def test_phase_is_a_profiler_range_and_a_plain_block_otherwise():
    with phase("outside"):
        value = statistics.fmean([1.0, 3.0])
    assert value == 2.0
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof, phase("inside"):
        torch.ones(3).sum()
    assert "inside" in {event.name for event in prof.events()}


def test_a_traced_function_is_a_profiler_range_only_while_profiling():
    @traced("hook/add")
    def add(a: float, *, b: float) -> float:
        """Adds."""
        return a + b

    assert add(1.0, b=2.5) == 3.5 and add.__doc__ == "Adds." and add.__name__ == "add"
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        add(1.0, b=1.0)
        add(2.0, b=2.0)
    assert [event.name for event in prof.events()].count("hook/add") == 2


def test_time_phased_steps_collects_phases_results_and_runs_hooks_outside_the_steps():
    events = []

    def step(clock):
        clock.start()
        events.append("step")
        clock.mark("forward")
        clock.mark("backward")
        return len(events)

    measured = time_phased_steps(
        step, warmup=2, steps=3, device=torch.device("cpu"),
        after_warmup=lambda: events.append("warm"), before_each=lambda: events.append("before"),
        after_each=lambda: events.append("after"),
    )
    assert events[:3] == ["step", "step", "warm"] and events[3:6] == ["before", "step", "after"]
    assert len(measured.times_ms) == 3 and measured.results == [5, 8, 11]
    assert set(measured.phases_ms) == {"forward", "backward"}
    assert all(len(v) == 3 and min(v) >= 0 for v in measured.phases_ms.values())
