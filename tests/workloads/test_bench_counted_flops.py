"""Bench rows carry counted FLOPs per phase beside the analytic count, and the energy fields."""

from __future__ import annotations

import pytest

from lmscope.workloads import step


@pytest.mark.parametrize("attention", ["sdpa"])
def test_bench_row_counts_phases_like_the_accounting(attention: str) -> None:
    row = step.run_point({"size": "tiny", "vocab_size": 101, "context_length": 23, "batch_size": 3,
                          "attention": attention, "mode": "train-step", "steps": 2, "warmup": 1,
                          "target_ci": 0.0, "device": "cpu"})
    assert row["flops_per_step_counted"] == row["flops_per_step"] and row["flops_counted_error"] == 0
    assert row["backward_flops"] == 2 * row["forward_flops"] and row["optimizer_flops"] == 0
    assert row["forward_tflops"] == pytest.approx(row["forward_flops"] / row["forward_ms"] / 1e9)
    assert row["forward_mfu"] is None and row["mfu_counted"] is None  # a CPU has no peak in the table
    assert row["flops_per_step_counted"] < row["flops_per_step_counted_full_square"]
    assert row["joules_per_step"] is None and "NVIDIA" in row["energy_reason"]
