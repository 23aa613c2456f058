"""`lmscope ddp --profile-steps N`: each rank profiles N more steps of its data-parallel step.

After a point's timed steps, every rank runs one unrecorded profiler warm-up step and N steps
under torch.profiler (CPU and CUDA activity), writes its trace to
`<artifacts_dir>/<point>/rank<R>.trace.json` (Perfetto opens it) and reads it back into the
breakdown of `lmscope.measure.overlap`: per step, compute, exposed communication (by the phase
that launched it), idle, and the host time in the wrapper's hooks (ranges `fsdp/...`; FSDP2's
`FSDP::...`). `profile_compute_pct` puts the compute kernels' time beside the unprofiled step:
the profiler slows the host, not the kernels, so it is the share of the timed step the GPU
computed. `profile_gpu_busy_pct` (compute and exposed communication over the unprofiled step)
says whether the host bounds a step, and only for a step without collectives: a collective's
kernel spins while it waits for the other ranks, and under the profiler they wait longer, so
communication time says nothing about the GPU's work (it is None there; a share above 100 % was
the sign of it).
"""

from __future__ import annotations

import hashlib
import json
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from lmscope.measure.kernels import load_trace, record_trace, step_spans
from lmscope.measure.overlap import step_breakdown
from lmscope.measure.timer import PhaseClock
from lmscope.workloads.model_spec import model_slug

STEP_PHASES = ("forward", "backward", "comm_wait", "optimizer")
"""The phase ranges of the ddp step, which split its exposed communication."""


def point_folder(point: dict[str, Any], artifacts_dir: str) -> Path:
    """The folder of a point's traces: its main fields and a hash of all of them."""
    fields = {k: v for k, v in point.items() if k != "artifacts_dir"}
    digest = hashlib.sha1(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()[:8]
    name = (f"{model_slug(str(point['size']))}-ctx{point['context_length']}-b{point['batch_size']}"
            f"-{point['precision']}-{model_slug(str(point['strategy']))}-x{point['world_size']}-{digest}")
    return Path(artifacts_dir) / name


def profile_steps(step: Callable[[PhaseClock], Any], *, steps: int, device: torch.device, rank: int,
                  folder: Path, step_median_ms: float) -> tuple[dict[str, float], str]:
    """Profile `steps` steps on this rank; (the breakdown as metrics, the trace's path)."""
    path = folder / f"rank{rank}.trace.json"
    clock = PhaseClock(device)
    times = record_trace(lambda: step(clock), steps=steps, device=device, path=path)
    trace = load_trace(path)
    breakdown = step_breakdown(trace, step_spans(trace), STEP_PHASES)
    busy_ms = breakdown.compute_ms + breakdown.exposed_comm_ms
    no_collectives = breakdown.comm_ms == 0
    return {
        **breakdown.as_record(),
        "profile_step_ms": statistics.median(times),
        "profile_compute_pct": 100 * breakdown.compute_ms / step_median_ms if trace.on_gpu else None,
        "profile_gpu_busy_pct": 100 * busy_ms / step_median_ms if trace.on_gpu and no_collectives else None,
    }, str(path)
