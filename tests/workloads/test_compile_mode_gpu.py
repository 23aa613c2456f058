"""On a GPU: every torch.compile mode and scope runs a train step that learns like the eager one."""

from __future__ import annotations

import pytest
import torch

from lmscope.workloads.step import Spec, run_point
from lmscope.workloads.train_step import TrainStep

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
SMALL = {"size": "small", "num_layers": 3, "context_length": 128, "batch_size": 2, "precision": "bf16",
         "attention": "sdpa", "device": "cuda"}


def _losses(spec: Spec, steps: int = 4) -> list[float]:
    step = TrainStep(spec, seed=11)
    step.compile_warmup()  # its steps train too: every variant runs the same number of them below
    losses = []
    while len(losses) < steps:
        step()
        losses.append(step.last_loss.float().item())
    return losses


@pytest.mark.parametrize("scope", ["model", "blocks"])
@pytest.mark.parametrize("mode", [True, "max-autotune-no-cudagraphs", "reduce-overhead"])
def test_compiled_steps_follow_the_eager_losses(mode, scope) -> None:
    torch.compiler.reset()
    compiled = _losses(Spec(**SMALL, compile=mode, compile_scope=scope))
    eager_step = TrainStep(Spec(**SMALL), seed=11)
    for _ in range(2 if mode == "reduce-overhead" else 1):  # as many as compile_warmup ran
        eager_step()
    eager = []
    while len(eager) < 4:
        eager_step()
        eager.append(eager_step.last_loss.float().item())
    assert compiled == pytest.approx(eager, rel=2e-2)


def test_a_reduce_overhead_row_has_compile_time_and_busy_time() -> None:
    torch.compiler.reset()
    row = run_point({**SMALL, "compile": "reduce-overhead", "compile_scope": "blocks", "warmup": 2,
                     "steps": 5, "target_ci": 0.0})
    assert row["compile_s"] > 0 and row["median_ms"] > 0
    assert row["gpu_busy_reason"] is None and 0 < row["gpu_busy_share"] <= 1.1
