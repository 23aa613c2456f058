"""`lmscope memory`: the peak of each phase of a step, measured beside the memory model's prediction.

A point builds the model (optionally with activation checkpointing of its blocks), reads the
memory after init, runs `warmup` steps outside any measurement, then `steps` measured steps:
each frees the gradients (set_to_none), and its phases (forward + loss, backward, optimizer)
each start with a reset of the peak and end with a read of it; the step time is taken around the
same steps. With `snapshot`, one more step runs with the allocation history recorded: its
snapshot pickle (pytorch.org/memory_viz), a timeline PNG with the phases marked, and the largest
allocations with where they come from, in `<artifacts_dir>/<point slug>/`.

On GPUs the numbers are the CUDA caching allocator's (allocated and reserved) beyond what the
process held when the point began (`baseline_allocated_gib`, `baseline_reserved_gib`: see
`MemoryMeter`), so a point reads the same in a fresh process and in one that holds memory; the
snapshot and its timeline are the allocator's whole state, baseline included. On CPUs they are the
bytes of live tensors the point made (no reserved memory; times include the tracking's overhead). Every phase
carries `predicted_*` from `lmscope.accounting.memory.predict_memory` and the error in percent
(lmscope's presets; for transformers and user models the predictions are None).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import statistics
import timeit
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch

from lmscope.accounting.checkpoint_plan import (
    PLAN_PREFIX,
    parse_bytes,
    recompute_share_pct,
    resolve_checkpoint,
)
from lmscope.accounting.memory import GIB, checkpointed_blocks, predict_memory
from lmscope.inputs.limits import MAX_SIZE, check_steps
from lmscope.measure.gpu_busy import measure_gpu_busy
from lmscope.measure.memory import MemoryMeter, PhasePeaks, build_timeline, load_snapshot, top_allocations
from lmscope.measure.timer import synchronize
from lmscope.model.checkpointing import checkpoint_blocks
from lmscope.report.memory_plots import plot_timeline
from lmscope.workloads.activations import activations_step
from lmscope.workloads.model_spec import ModelPointSpec, model_slug
from lmscope.workloads.train_step import TrainStep, device_facts, resolve_device

PHASES = ("after_init", "forward_peak", "backward_peak", "optimizer_peak", "step_peak")
"""Measured and predicted quantities of a point, each in GiB with its error."""
STEP_PHASES = {"forward": "forward_peak", "backward": "backward_peak", "optimizer": "optimizer_peak"}
"""TrainStep's phase names -> record names."""


@dataclass(frozen=True, kw_only=True)
class Spec(ModelPointSpec):
    """A memory point: the model point, checkpointing, steps, and the snapshot's options."""

    RUN_OPTIONS: ClassVar[tuple[str, ...]] = ("snapshot", "top", "max_entries")
    """Fields that change how the point runs, not what it measures (left out of its identity)."""

    checkpoint: str = "none"
    """Per-block treatment (`lmscope.accounting.treatments`): none | block | every:K (blocks 0, K,
    2K, ...) | blocks:LIST (e.g. blocks:0-3,7) | selective[:LIST] | offload[:LIST], parts joined
    with + | plan:BUDGET (the planner's full-checkpointing choice under e.g. 40GiB)."""
    activations: bool = False
    """Run one more step measuring what each block and op saves for backward, the gradients, and
    the breakdown of the step's peak (parameters, gradients, optimizer state, activations, rest)."""
    warmup: int = 2
    """Steps before measuring (they create the optimizer state and warm the allocator)."""
    steps: int = 2
    """Measured steps (peaks are the highest over them, time the median)."""
    snapshot: bool = True
    """Record one more step's allocation history: snapshot pickle, timeline PNG, top allocations."""
    top: int = 10
    """How many of the largest allocation groups to report."""
    max_entries: int = 200_000
    """Most alloc/free events the snapshot keeps (the latest ones)."""
    artifacts_dir: str = "runs/memory"
    """Folder that receives one sub-folder of artifacts per point."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.checkpoint_policy()
        if self.activations and self.mode == "forward":
            raise ValueError("--activations measures what the forward saves for backward: "
                             "use --mode forward-backward or train-step")
        if self.activations and self.compile:
            raise ValueError("--activations hooks eager autograd; torch.compile decides what to save "
                             "by itself: drop --compile on")
        if self.fast and self.checkpoint != "none" and self.source().kind == "preset":
            raise ValueError("activation checkpointing wraps the eager blocks; the fast model's "
                             "forward does not run them: drop --checkpoint or --fast")
        check_steps("warmup", self.warmup, 0)
        check_steps("steps", self.steps, 1)
        for name, low in (("top", 1), ("max_entries", 1000)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= MAX_SIZE:
                flag = "--" + name.replace("_", "-")
                raise ValueError(f"{name} must be an integer from {low} to {MAX_SIZE}, got {value!r}: "
                                 f"pass {flag} N")
        if not str(self.artifacts_dir).strip():
            raise ValueError("artifacts_dir is empty: give a folder for snapshots and timelines")


    def checkpoint_policy(self) -> str:
        """The concrete checkpoint policy (plan:BUDGET resolved by the planner, for presets)."""
        if self.checkpoint != "none" and self.source().blocks is None:
            raise ValueError(f"--checkpoint {self.checkpoint}: {self.size} exposes no blocks to checkpoint "
                             "(a factory names them with UserModel(blocks=...)): use --checkpoint none")
        if self.model_config() is None:
            if self.checkpoint.startswith(PLAN_PREFIX):
                raise ValueError(f"--checkpoint {self.checkpoint} plans from lmscope's memory model, "
                                 f"which knows its presets only, not {self.size}: pass block, every:K "
                                 "or blocks:LIST")
            checkpointed_blocks(self.checkpoint, self.source().blocks or 0)
            return self.checkpoint
        return resolve_checkpoint(self.checkpoint, self.model_config(), batch_size=self.batch_size,
                                  seq_len=self.context_length, mode=self.mode, precision=self.precision,
                                  attention=self.attention)


def point_slug(spec: Spec) -> str:
    """Readable, unique folder name of a point: its main fields and a hash of all of them."""
    fields = dataclasses.asdict(spec)
    fields.pop("artifacts_dir")
    digest = hashlib.sha1(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:8]
    policy = spec.checkpoint.replace(":", "").replace(",", "_")
    checkpoint = "" if spec.checkpoint == "none" else "-ckpt-" + policy
    return (f"{model_slug(spec.size)}-ctx{spec.context_length}-b{spec.batch_size}-{spec.mode}"
            f"-{spec.precision}-{spec.attention}{checkpoint}-{digest}")


def run_point(point: dict[str, Any]) -> dict[str, Any]:
    """Measure the point's phase peaks (and snapshot); return them beside the prediction."""
    spec = Spec(**point)
    device = resolve_device(spec.device)
    policy = spec.checkpoint_policy()
    with MemoryMeter(device) as meter:
        step = TrainStep(spec)
        checkpointed = checkpoint_blocks(step.built.blocks or [], policy)
        synchronize(device)
        measured: dict[str, float | None] = {
            "after_init_gib": meter.current() / GIB, "after_init_reserved_gib": _gib(meter.reserved()),
        }
        compile_s = step.compile_warmup()
        for _ in range(spec.warmup):
            step()
            synchronize(device)
        peaks, times, start = _measured_steps(step, meter, spec.steps)
        measured.update(peaks)
        busy = measure_gpu_busy(step, device=device, step_ms=statistics.median(times))
        saved = activations_step(step, meter, spec) if spec.activations else {}
        artifacts = _snapshot_or_error(step, meter, spec) if spec.snapshot else {}
    config = spec.model_config()  # the memory model predicts lmscope's presets only
    predicted = predict_memory(
        config, batch_size=spec.batch_size, seq_len=spec.context_length, mode=spec.mode,
        precision=spec.precision, attention=spec.attention, checkpoint=policy,
    ).as_record() if config is not None else {f"predicted_{name}_gib": None for name in PHASES}
    errors = {
        f"{name}_error_pct": _error_pct(predicted[f"predicted_{name}_gib"], measured.get(f"{name}_gib"))
        for name in PHASES
    }
    return {
        **device_facts(device),
        **step.model_facts(),
        **measured,
        **predicted,
        **errors,
        "baseline_allocated_gib": meter.baseline_allocated_gib,
        "baseline_reserved_gib": meter.baseline_reserved / GIB if meter.cuda else None,
        "step_start_gib": start / GIB,
        "median_ms": statistics.median(times),
        "times_ms": [round(t, 4) for t in times],
        **busy,
        "compile_s": compile_s,
        "checkpoint_policy": policy,
        "checkpoint_budget_gib": (parse_bytes(spec.checkpoint.removeprefix(PLAN_PREFIX)) / GIB
                                  if spec.checkpoint.startswith(PLAN_PREFIX) else None),
        "checkpointed_blocks": len(checkpointed),
        "predicted_recompute_share_pct": (recompute_share_pct(config, spec.batch_size, spec.context_length,
                                                              spec.mode, len(checkpointed))
                                          if spec.mode != "forward" and config is not None else None),
        **saved,
        **artifacts,
    }


def _measured_steps(
    step: TrainStep, meter: MemoryMeter, steps: int
) -> tuple[dict[str, Any], list[float], int]:
    """Run `steps` steps with PhasePeaks; highest peak of each phase, step times (ms), start bytes."""
    device = step.device
    highest: dict[str, tuple[int, int | None]] = {}
    times = []
    start = 0
    for _ in range(steps):
        step.model.zero_grad(set_to_none=True)
        clock = PhasePeaks(meter)
        synchronize(device)
        begin = timeit.default_timer()
        step(clock)
        synchronize(device)
        times.append((timeit.default_timer() - begin) * 1e3)
        start = max(start, clock.start_bytes)
        for name, (allocated, reserved) in clock.peaks.items():
            old = highest.get(name, (0, None))
            highest[name] = (max(old[0], allocated), _max(old[1], reserved))
    peaks: dict[str, Any] = {}
    for name, key in STEP_PHASES.items():  # phases the mode does not run stay None
        allocated, reserved = highest.get(name, (None, None))
        peaks[f"{key}_gib"] = _gib(allocated)
        peaks[f"{key.removesuffix('_peak')}_reserved_gib"] = _gib(reserved)
    peaks["step_peak_gib"] = max(allocated for allocated, _ in highest.values()) / GIB
    reserved = [r for _, r in highest.values() if r is not None]
    peaks["step_reserved_gib"] = max(reserved) / GIB if reserved else None
    return peaks, times, start


def _snapshot_or_error(step: TrainStep, meter: MemoryMeter, spec: Spec) -> dict[str, Any]:
    """The snapshot's artifacts; if they fail (not OOM), the point keeps its peaks and says why."""
    try:
        return _snapshot_step(step, meter, spec)
    except torch.cuda.OutOfMemoryError:
        raise
    except Exception as error:  # noqa: BLE001 - e.g. an allocator backend without history
        return {"snapshot_error": f"{type(error).__name__}: {error}"[:400]}


def _snapshot_step(step: TrainStep, meter: MemoryMeter, spec: Spec) -> dict[str, Any]:
    """One more step with the allocation history on: snapshot, timeline PNG, largest allocations."""
    folder = Path(spec.artifacts_dir) / point_slug(spec)
    path = folder / "snapshot.pickle"
    step.model.zero_grad(set_to_none=True)
    synchronize(step.device)
    clock = PhasePeaks(meter, markers=True)
    with meter.record(spec.max_entries):
        step(clock)
        synchronize(step.device)
        meter.dump(path)
    step_peak = max(allocated for allocated, _ in clock.peaks.values())
    timeline = build_timeline(load_snapshot(path), phases=list(clock.peaks))
    title = (f"lmscope memory: {spec.size} ctx {spec.context_length} batch {spec.batch_size} {spec.mode} "
             f"{spec.precision} {spec.attention} checkpoint={spec.checkpoint}")
    png = plot_timeline(timeline, folder / "timeline.png", title=title, baseline=meter.baseline_allocated)
    top = [group.as_record() for group in top_allocations(timeline, spec.top)]
    largest = top[0] if top else {}
    return {
        "snapshot_path": str(path),
        "snapshot_step_peak_gib": step_peak / GIB,
        "snapshot_step_requested_peak_gib": clock.requested_peak / GIB,
        "timeline_png": str(png),
        "top_allocations": top,
        "top_alloc_mib": largest.get("size_mib"),
        "top_alloc_count": largest.get("count"),
        "top_alloc_site": largest.get("site"),
    }


def _gib(value: int | None) -> float | None:
    return None if value is None else value / GIB


def _max(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else max(a, b)


def _error_pct(predicted: float | None, measured: float | None) -> float | None:
    """100 * (predicted - measured) / measured; None when either is missing."""
    if predicted is None or not measured:
        return None
    return 100.0 * (predicted - measured) / measured
