"""On a GPU: busy time is measured for eager and CUDA-graph-replayed steps, and flags a host-bound one."""

from __future__ import annotations

import pytest
import torch

from lmscope.measure.gpu_busy import measure_gpu_busy
from lmscope.measure.timer import summarize, time_steps
from lmscope.workloads.cuda_graph_step import GraphedStep
from lmscope.workloads.step import Spec, run_point
from lmscope.workloads.train_step import TrainStep

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def _busy(step, device: torch.device) -> dict:
    median = summarize(time_steps(step, warmup=2, steps=5, device=device)).median_ms
    return measure_gpu_busy(step, device=device, step_ms=median)


def test_graph_replays_show_their_kernels_to_the_profiler() -> None:
    """The same step eagerly and replayed from CUDA graphs runs the same kernels: the profiler must
    see the replayed ones (busy time near the eager one), not an empty timeline."""
    spec = Spec(size="small", context_length=256, precision="bf16", attention="sdpa", device="cuda")
    eager = TrainStep(spec, capturable=True)
    device = eager.device
    eager_fields = _busy(eager, device)
    graphed_fields = _busy(GraphedStep(eager), device)
    for fields in (eager_fields, graphed_fields):
        assert fields["gpu_busy_reason"] is None
        assert 0 < fields["gpu_busy_share"] <= 1.1
    assert graphed_fields["gpu_busy_ms"] == pytest.approx(eager_fields["gpu_busy_ms"], rel=0.3)


def test_a_tiny_model_step_is_flagged_host_bound_in_its_bench_row() -> None:
    """tiny's kernels are microseconds each: the step is launch work, the GPU mostly idle."""
    row = run_point({"size": "tiny", "device": "cuda", "warmup": 2, "steps": 5, "target_ci": 0.0})
    assert row["host_bound"] is True and row["gpu_busy_share"] < 0.8
    assert 0 < row["gpu_busy_ms"] < row["median_ms"]
