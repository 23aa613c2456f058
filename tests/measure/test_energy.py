"""Energy between NVML counter updates, with a fake counter that moves every 100 ms on a CPU."""

from __future__ import annotations

import math
import time

import pytest
import torch

from lmscope.measure.energy import KEYS, measure_energy, nvml_energy_counter, step_energy

CPU = torch.device("cpu")


class FakeCounter:
    """Total millijoules of a device drawing `watts`, refreshed every `period_s` like NVML's."""

    def __init__(self, watts: float, period_s: float = 0.1) -> None:
        self.watts, self.period_s = watts, period_s
        self.origin = time.perf_counter() - 0.0371  # updates fall at an arbitrary phase

    def __call__(self) -> int:
        refreshed = math.floor((time.perf_counter() - self.origin) / self.period_s) * self.period_s
        return int(refreshed * self.watts * 1e3)


def sleeper(seconds: float):
    return lambda: time.sleep(seconds)


def test_power_and_energy_per_step_within_the_stated_error() -> None:
    watts = 250 + 100 * torch.rand(()).item()
    row = measure_energy(sleeper(0.007), device=CPU, counter=FakeCounter(watts), tokens_per_step=8 * 17,
                         min_window_s=0.5, min_updates=4, tolerance=0.2)
    assert set(row) == set(KEYS)
    assert row["energy_exact"] and row["energy_reason"] is None
    assert row["energy_window_s"] >= 0.5 and row["energy_updates"] >= 4
    assert abs(row["avg_watts"] / watts - 1) <= row["energy_error"] + 1e-3
    assert row["energy_update_ms"] == pytest.approx(100, rel=0.15)
    assert row["joules_per_token"] == pytest.approx(row["joules_per_step"] / (8 * 17))
    # each sleeping step lasts at least 7 ms, so it used at least 7 ms of the power
    assert row["joules_per_step"] >= 0.007 * watts * (1 - row["energy_error"])


def test_a_window_cut_short_is_flagged_inexact() -> None:
    row = measure_energy(sleeper(0.005), device=CPU, counter=FakeCounter(300.0), tokens_per_step=1,
                         min_window_s=5.0, min_updates=50, max_s=0.45)
    assert row["energy_exact"] is False
    assert "stopped at 0.45 s" in row["energy_reason"]
    assert row["avg_watts"] == pytest.approx(300.0, rel=0.1)


def test_a_coarse_window_states_its_error() -> None:
    # a tolerance below the poll gap's share of a 0.3 s window cannot be met
    row = measure_energy(sleeper(0.004), device=CPU, counter=FakeCounter(300.0), tokens_per_step=1,
                         min_window_s=0.3, min_updates=2, tolerance=1e-5, poll_s=0.005)
    assert row["energy_exact"] is False and "error bound" in row["energy_reason"]
    assert row["energy_error"] > 1e-5


def test_too_few_updates_leave_the_fields_empty() -> None:
    row = measure_energy(sleeper(0.01), device=CPU, counter=FakeCounter(300.0, period_s=10.0),
                         tokens_per_step=1, max_s=0.1)
    assert row["joules_per_step"] is None and row["energy_exact"] is False
    assert "updated" in row["energy_reason"]


def test_no_energy_on_a_cpu() -> None:
    counter, reason = nvml_energy_counter(CPU)
    assert counter is None and "NVIDIA" in reason
    row = step_energy(sleeper(0), device=CPU, tokens_per_step=1)
    assert row["joules_per_step"] is None and row["avg_watts"] is None and "NVIDIA" in row["energy_reason"]
