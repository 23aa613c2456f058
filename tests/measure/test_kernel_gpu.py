"""The profile of a real CUDA step: kernels tied to their phases, categories, invariants (needs a GPU)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from lmscope.measure import nsys
from lmscope.measure.kernels import load_trace, step_spans
from lmscope.workloads.profile import run_point

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
POINT = dict(size="small", num_layers=3, context_length=256, batch_size=2, mode="train-step",
             precision="bf16", device="cuda", warmup=2, steps=2)


def test_cuda_profile_attributes_kernels_to_every_phase(tmp_path: Path) -> None:
    metrics = run_point({**POINT, "artifacts_dir": str(tmp_path)})
    profile = json.loads(Path(metrics["profile_json_path"]).read_text())
    trace = load_trace(Path(metrics["trace_path"]))
    assert trace.on_gpu and metrics["kernels_are"] == "cuda" and len(step_spans(trace)) == 2
    assert metrics["invariant_ok"], metrics["invariant_violations"]
    phases = profile["phases"]
    assert phases["forward"]["categories"]["matmul"] > 0.2
    assert phases["backward"]["launches_per_step"] > phases["forward"]["launches_per_step"] / 2
    assert phases["optimizer"]["categories"]["optimizer"] > 0.5  # fused AdamW: multi_tensor_apply
    for stats in phases.values():
        assert sum(stats["categories"].values()) == pytest.approx(1.0)
        assert stats["busy_ms_per_step"] <= stats["wall_ms_per_step"] * 1.002 + 0.02
    whole = phases["step"]
    assert whole["wall_ms_per_step"] <= max(profile["timing"]["profiled_times_ms"]) + 0.05
    assert 0 < metrics["gpu_busy_frac"] <= 1
    attention = profile["attention"]
    assert attention["layers"] == POINT["num_layers"]
    softmax = attention["parts"][2]
    assert softmax["gpu_ms_per_layer"] > 0 and softmax["launches_per_call"] >= 1
    kernel_names = [k["name"] for k in phases["forward"]["kernels"]]
    assert not any(name.startswith("aten::") for name in kernel_names)


def test_capture_mode_brackets_the_steps_with_the_cuda_profiler_api(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(nsys.CAPTURE_ENV, "1")
    metrics = run_point({**POINT, "mode": "forward", "artifacts_dir": str(tmp_path)})
    assert metrics["nsys_capture"] and metrics["device_type"] == "cuda" and len(metrics["times_ms"]) == 2
