"""A rough estimate of how many seconds one study point takes, for the plan and its ETA.

Step time is the point's analytic FLOPs over an effective throughput per device and precision
(set from the `tflops` of the xl and 2.7B rows of the H100 study, benchmarks/results/study-h100/
timing.jsonl and precision.jsonl: effective rates well below peak), plus a floor per step, the
worker's start and the model's build; torch.compile adds a compile time that grows with the model.
Estimates decide what fits a budget and drive the ETA; they are never reported as measurements.
"""

from __future__ import annotations

from typing import Any

from lmscope.accounting.flops import step_flops
from lmscope.config import preset
from lmscope.study.target import Target

EFFECTIVE_TFLOPS = {
    ("cuda", "fp32"): 40.0,
    ("cuda", "bf16"): 130.0,
    ("cuda", "fp16"): 130.0,
    ("cpu", "fp32"): 0.005,
    ("cpu", "bf16"): 0.002,
    ("cpu", "fp16"): 0.002,
}
"""Effective TFLOP/s of a whole step (CPU: the tiny presets, where overheads dominate)."""
STEP_FLOOR_S = {"cuda": 0.005, "cpu": 0.02}
"""Seconds a step takes at least (launches, Python)."""
START_S = {"cuda": 12.0, "cpu": 6.0}
"""A fresh worker: interpreter, torch import, device start."""
REUSED_START_S = {"cuda": 3.0, "cpu": 0.5}
"""A point in a reused worker: the small presets' points of the H100 study took this long each
(wall_s in benchmarks/results/study-h100/timing.jsonl)."""
PROFILER_S = {"cuda": 7.0, "cpu": 3.0}
"""A profile point's profiler start and trace export (committed H100 rows: ~10 s per large point)."""
COMPILE_S = {"cuda": (10.0, 0.004, 60.0), "cpu": (40.0, 0.0, 40.0)}
"""torch.compile: base seconds, seconds per million parameters, cap (cuda: the `compile_s` of the
H100 study's compiled points, benchmarks/results/study-h100/compile.jsonl, barely grows with
the model: the blocks are compiled once and reused)."""
LIGHT_S = 1.0
"""A point with no device work (accounting, precision checks) in a reused worker; a fresh worker
adds its start."""


def _model_config(spec: dict[str, Any]) -> Any:
    overrides = {
        k: spec[k]
        for k in ("d_model", "d_ff", "num_layers", "num_heads", "vocab_size")
        if spec.get(k) is not None
    }
    return preset(spec["size"], **overrides)


def model_step_s(spec: dict[str, Any], device: str) -> float:
    """Estimated seconds of one step of a bench/profile/memory point."""
    config = _model_config(spec)
    flops = step_flops(config, spec["batch_size"], spec["context_length"], spec["mode"])
    rate = EFFECTIVE_TFLOPS[(device, spec.get("precision", "fp32"))] * 1e12
    return STEP_FLOOR_S[device] + flops / rate


def point_cost_s(workload: str, spec: dict[str, Any], target: Target, *, reused: bool) -> float:
    """Estimated wall seconds of one point of `workload` on `target`."""
    device = target.device_type
    start = REUSED_START_S[device] if reused else START_S[device]
    if workload in ("bench", "profile", "memory"):
        config = _model_config(spec)
        steps = spec.get("warmup", 5) + spec.get("steps", 10)
        repeat = {"bench": 1.0, "profile": 3.0, "memory": 2.5}[workload]
        build = config.num_layers * config.d_model**2 * 12 / 1e9 * (1.0 if device == "cuda" else 20.0)
        cost = start + build + repeat * steps * model_step_s(spec, device)
        if workload == "profile":
            cost += PROFILER_S[device]
        if spec.get("compile"):
            base, per_m, cap = COMPILE_S[device]
            params_m = config.num_layers * config.d_model * (4 * config.d_model + 3 * config.d_ff) / 1e6
            cost += min(cap, base + per_m * params_m)
        return cost
    if workload == "attention":
        compiled = 8.0 if spec.get("impl") == "naive-compiled" else 0.0
        tuned = 3.0 if spec.get("impl") == "flash-triton" and device == "cuda" else 0.0
        flops = 14.0 * spec["batch"] * spec["heads"] * spec["seq_len"] ** 2 * spec["head_dim"]
        per_call = flops / (EFFECTIVE_TFLOPS[(device, spec.get("dtype", "fp32"))] * 1e12)
        calls = 3 * (spec.get("cpu_steps", 3) + 1) if device == "cpu" else 0.5 / max(per_call, 1e-6)
        return start + compiled + tuned + min(calls * per_call, 5.0 if device == "cuda" else 60.0)
    if workload == "comm":
        return start + 3.0
    if workload == "ddp":
        return start + 25.0
    return LIGHT_S if reused else start + LIGHT_S
