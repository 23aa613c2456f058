"""NVML's energy counter under a matmul loop on a GPU."""

from __future__ import annotations

import pytest
import torch

from lmscope.measure.energy import step_energy

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def test_energy_of_a_matmul_loop_is_exact_and_plausible() -> None:
    pytest.importorskip("pynvml")
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)

    def step() -> None:
        for _ in range(4):
            a @ a

    row = step_energy(step, device=torch.device("cuda"), tokens_per_step=8192)
    assert row["energy_exact"], row["energy_reason"]
    assert 30 < row["avg_watts"] < 2000 and row["energy_window_s"] >= 2.0
    assert 20 < row["energy_update_ms"] < 1000 and row["energy_error"] <= 0.01
    assert row["joules_per_token"] == pytest.approx(row["joules_per_step"] / 8192)
