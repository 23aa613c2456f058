"""`lmscope bench`: end-to-end timing of forward, forward+backward or a full train step."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

import torch

from lmscope.accounting.devices import peak_tflops
from lmscope.accounting.flops import step_flops
from lmscope.measure.timer import summarize, time_phased_steps
from lmscope.workloads.model_spec import ModelPointSpec
from lmscope.workloads.train_step import TrainStep, check_model_choice, device_facts

GIB = 2**30


@dataclass(frozen=True, kw_only=True)
class Spec(ModelPointSpec):
    """A bench point: the model point plus how many warm-up and timed steps."""

    warmup: int = 5
    """Untimed steps before measuring."""
    steps: int = 10
    """Timed steps."""
    fast: bool = False
    """Run lmscope's fused fast path (FastTransformerLM: Triton kernels, fused LM head + loss)."""
    peer: str = "none"
    """none | hf: transformers' LlamaForCausalLM of the same sizes (needs lmscope[hf])."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_model_choice(self.fast, self.peer, self.attention)
        if not isinstance(self.warmup, int) or self.warmup < 0:
            raise ValueError(f"warmup must be 0 or more steps, got {self.warmup!r}: pass --warmup N")
        if not isinstance(self.steps, int) or self.steps < 1:
            raise ValueError(f"steps must be at least 1, got {self.steps!r}: pass --steps N")


def throughput_metrics(
    spec: ModelPointSpec, step_ms: float, device_name: str | None, parameters: int
) -> dict[str, Any]:
    """Tokens/s, analytic FLOPs per step, achieved TFLOP/s and MFU (None for unknown devices)."""
    flops = step_flops(spec.model_config(), spec.batch_size, spec.context_length, spec.mode)
    tflops = flops / (step_ms / 1e3) / 1e12
    peak = peak_tflops(device_name, spec.precision) if device_name else None
    return {
        "parameters": parameters,
        "tokens_per_s": spec.batch_size * spec.context_length / (step_ms / 1e3),
        "flops_per_step": flops,
        "tflops": tflops,
        "peak_tflops": peak,
        "mfu": tflops / peak if peak else None,
    }


def run_point(point: dict[str, Any]) -> dict[str, Any]:
    """Build the point, warm up, time `steps` synchronized steps; return the metrics."""
    spec = Spec(**point)
    step = TrainStep(spec)
    device = step.device
    compile_s = step.compile_warmup()

    def reset_peak() -> None:
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)

    measured = time_phased_steps(step, warmup=spec.warmup, steps=spec.steps, device=device,
                                 after_warmup=reset_peak)
    times, phases = measured.times_ms, measured.phases_ms
    stats = summarize(times)
    facts = device_facts(device)
    metrics: dict[str, Any] = {
        **facts,
        **stats.as_record(),
        "times_ms": [round(t, 4) for t in times],
        **{f"{name}_ms": statistics.median(ms) for name, ms in phases.items()},
        "compile_s": compile_s,
        **throughput_metrics(spec, stats.median_ms, facts.get("device_name"), step.parameter_count()),
    }
    if device.type == "cuda":
        metrics["peak_allocated_gib"] = torch.cuda.max_memory_allocated(device) / GIB
        metrics["peak_reserved_gib"] = torch.cuda.max_memory_reserved(device) / GIB
    return metrics
