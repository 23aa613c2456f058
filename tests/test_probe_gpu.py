"""Probe on a CUDA GPU: CUDA-event phases inside the step, allocated peaks per phase, kernels."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from lmscope.probe import Probe

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def test_phase_peaks_and_kernels_on_cuda(tmp_path: Path) -> None:
    a = torch.randn(2048, 2048, device="cuda")
    base_gib = torch.cuda.memory_allocated() / 2**30  # what earlier tests in this process still hold
    with Probe(device="cuda", warmup=1, kernels=True, trace_path=tmp_path / "t.json") as probe:
        for _ in range(4):
            with probe.phase("forward"):
                big = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda")  # 256 MiB
                (a @ a).relu_()
                del big
            with probe.phase("backward"):
                a @ a
            probe.step()
    row = probe.record
    shown = {k: row.get(k) for k in ("n", "forward_peak_allocated_gib", "backward_peak_allocated_gib",
                                     "peak_allocated_gib", "forward_ms", "backward_ms", "max_ms",
                                     "forward_launches_per_step", "backward_busy_ms")}
    assert row["n"] == 3, shown
    shown["base_gib"] = base_gib
    forward_gib, backward_gib = (row[f"{p}_peak_allocated_gib"] - base_gib for p in ("forward", "backward"))
    assert forward_gib >= 0.25 > backward_gib, shown
    assert row["peak_allocated_gib"] == row["forward_peak_allocated_gib"], shown
    # each step's phases lie inside its events, so their medians add up to about the step's (the
    # events leave the gaps between phases; a sum of medians may pass the median sum a little)
    assert row["forward_ms"] + row["backward_ms"] <= row["max_ms"] * 1.05, shown
    assert row["forward_launches_per_step"] >= 2 and row["backward_busy_ms"] > 0, shown
