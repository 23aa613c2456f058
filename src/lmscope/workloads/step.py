"""`lmscope bench`: end-to-end timing of forward, forward+backward or a full train step."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any, ClassVar

from lmscope.accounting.devices import peak_tflops
from lmscope.accounting.flops import step_flops
from lmscope.accounting.memory import checkpointed_blocks
from lmscope.inputs.limits import check_steps
from lmscope.measure.energy import step_energy
from lmscope.measure.gpu_busy import measure_gpu_busy
from lmscope.measure.memory import MemoryMeter
from lmscope.measure.sampling import StopRule, sampling_metrics
from lmscope.measure.timer import summarize, time_phased_steps
from lmscope.model.checkpointing import checkpoint_blocks
from lmscope.workloads.counted_flops import count_step_flops, flop_metrics
from lmscope.workloads.cuda_graph_step import GraphedStep, check_cuda_graph_choice, uses_cuda_graph
from lmscope.workloads.model_spec import ModelPointSpec
from lmscope.workloads.train_step import TrainStep, check_model_choice, device_facts, resolve_device

GIB = 2**30


@dataclass(frozen=True, kw_only=True)
class Spec(ModelPointSpec):
    """A bench point: the model point plus how many warm-up and timed steps."""

    RUN_OPTIONS: ClassVar[tuple[str, ...]] = ("target_ci", "max_time_s")
    """How long to sample, not what is measured: `--resume` keeps points finished under others."""

    warmup: int = 5
    """Untimed steps before measuring."""
    steps: int = 10
    """Timed steps: the minimum when target_ci is set."""
    target_ci: float = 0.01
    """Keep timing until the median's 95 % interval is within +-target_ci of it (relative), or
    max_time_s runs out; 0: time exactly `steps` (lmscope.measure.sampling)."""
    max_time_s: float = 10.0
    """Seconds the timed steps may take while target_ci is not reached."""
    peer: str = "none"
    """none | hf: transformers' LlamaForCausalLM of the same sizes (needs lmscope[hf])."""
    cuda_graph: str = "auto"
    """auto | on | off: replay the step's phases from CUDA graphs (auto: on for --fast on a GPU)."""
    checkpoint: str = "none"
    """Activation checkpointing of the model's blocks: none | block | every:K (blocks 0, K, 2K, ...)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_model_choice(self.fast, self.peer, self.attention)
        if self.checkpoint != "none":
            blocks = self.source().blocks
            if blocks is None:
                raise ValueError(f"--checkpoint needs blocks to wrap, and {self.size} exposes none: "
                                 "use --checkpoint none (or return blocks from the factory)")
            if self.fast and self.source().kind == "preset":
                raise ValueError("activation checkpointing wraps the eager blocks; the fast model's "
                                 "forward does not run them: drop --checkpoint or --fast")
            checkpointed_blocks(self.checkpoint, blocks)
        check_cuda_graph_choice(self, self.cuda_graph)
        check_steps("warmup", self.warmup, 0)
        check_steps("steps", self.steps, 1)
        self.stop_rule()  # checks target_ci and max_time_s

    def stop_rule(self) -> StopRule:
        """When the timed steps stop (after `steps`)."""
        return StopRule(target_ci=self.target_ci, max_time_s=self.max_time_s)


def throughput_metrics(
    spec: ModelPointSpec, step_ms: float, device_name: str | None, parameters: int
) -> dict[str, Any]:
    """Tokens/s (samples/s for models without a sequence), FLOPs per step, TFLOP/s and MFU.

    FLOPs are analytic where the source has a ModelConfig (lmscope's presets); for other
    sources they are None here (counted ones come from a FLOP counter over a step).
    """
    source = spec.source()
    per_sample = spec.context_length if source.unit == "tokens" else 1
    config = source.config
    flops = step_flops(config, spec.batch_size, spec.context_length, spec.mode) if config else None
    tflops = flops / (step_ms / 1e3) / 1e12 if flops else None
    peak = peak_tflops(device_name, spec.precision) if device_name else None
    return {
        "parameters": parameters,
        **source.facts(),
        f"{source.unit}_per_s": spec.batch_size * per_sample / (step_ms / 1e3),
        "flops_per_step": flops,
        "tflops": tflops,
        "peak_tflops": peak,
        "mfu": tflops / peak if peak and tflops else None,
    }


def run_point(point: dict[str, Any]) -> dict[str, Any]:
    """Build the point, warm up, time `steps` synchronized steps; return the metrics."""
    spec = Spec(**point)
    device = resolve_device(spec.device)
    graphed = uses_cuda_graph(spec, spec.cuda_graph, device)
    meter = MemoryMeter(device).take_baseline()  # on CUDA: the bytes the process held before the point
    eager = TrainStep(spec, capturable=graphed)
    if spec.checkpoint != "none":
        checkpoint_blocks(eager.built.blocks or [], spec.checkpoint)
    counted = count_step_flops(eager)  # one extra eager step, before warm-up and timing
    compile_s = eager.compile_warmup()
    step: TrainStep | GraphedStep = GraphedStep(eager) if graphed else eager

    def reset_peak() -> None:
        if device.type == "cuda":
            meter.reset_peak()

    measured = time_phased_steps(step, warmup=spec.warmup, steps=spec.steps, device=device,
                                 after_warmup=reset_peak, stop=spec.stop_rule())
    times, phases = measured.times_ms, measured.phases_ms
    stats = summarize(times)
    facts = device_facts(device)
    phase_ms = {name: statistics.median(ms) for name, ms in phases.items()}
    throughput = throughput_metrics(spec, stats.median_ms, facts.get("device_name"), eager.parameter_count())
    metrics: dict[str, Any] = {
        **facts,
        **stats.as_record(),
        "times_ms": [round(t, 4) for t in times],
        **sampling_metrics(times, spec.stop_rule(), measured.stop_reason),
        **{f"{name}_ms": ms for name, ms in phase_ms.items()},
        "compile_s": compile_s,
        "cuda_graph_used": graphed,
        **throughput,
        **flop_metrics(counted, stats.median_ms, phase_ms, device_name=facts.get("device_name"),
                       precision=spec.precision, analytic_flops=throughput["flops_per_step"]),
    }
    if device.type == "cuda":  # the point's own bytes: beyond what the process held before it
        peak = meter.peak()
        if isinstance(step, GraphedStep):  # replays allocate nothing: the capture saw the peak
            peak = max(peak, step.capture_peak_allocated_bytes - meter.baseline_allocated)
        metrics["peak_allocated_gib"] = peak / GIB
        metrics["peak_reserved_gib"] = meter.peak_reserved() / GIB
    metrics["baseline_allocated_gib"] = meter.baseline_allocated_gib
    # extra untimed steps after the timed ones: a few under the profiler for the GPU's busy time,
    # then as many as the energy counter's window needs
    metrics.update(measure_gpu_busy(step, device=device, step_ms=stats.median_ms))
    unit = throughput["unit"]
    items = spec.batch_size * (spec.context_length if unit == "tokens" else 1)
    energy = step_energy(step, device=device, tokens_per_step=items)
    if unit == "samples":  # a model without a sequence: energy per sample, not per token
        energy["joules_per_sample"] = energy.pop("joules_per_token", None)
    metrics.update(energy)
    return metrics
