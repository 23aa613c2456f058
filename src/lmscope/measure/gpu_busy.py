"""How much of a step the GPU works, measured: kernel time over the step, and the host-bound flag.

After a point's timed steps, `measure_gpu_busy` runs a few more steps under torch.profiler
(`lmscope.measure.kernels.record_trace`: CUPTI's record of every kernel, memcpy and memset, one
unrecorded profiler warm-up step first). A step's busy time is the union of the device intervals
of the work it launched, so kernels that overlap on two streams count once and the gaps between
kernels count not at all. The row gets the median busy time per profiled step (`gpu_busy_ms`), its
share of the *timed* steps' median wall time (`gpu_busy_share`; the profiled steps' own wall time
carries the profiler's host overhead, the kernels' durations do not), and `host_bound` when that
share is below `lmscope.measure.host_bound.HOST_BOUND_BELOW`.

CUDA graphs: a graph replay's kernels reach CUPTI one by one, tied to the `cudaGraphLaunch` that
started them (PyTorch's tutorial "CUDA Graph Kernel Annotations and Profiling" profiles replays
this way), so the fast step's replays and torch.compile's reduce-overhead mode are measured like
eager steps. Where the profiler records no kernel at all (CUPTI held by another tool such as
nsys), the fields are None and `gpu_busy_reason` says why. On a CPU there is no device timeline:
the fields are left out.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from lmscope.measure.host_bound import busy_fields, unmeasured
from lmscope.measure.kernels import STEP, Trace, load_trace, phase_stats, record_trace, step_spans

BUSY_STEPS = 3
"""Profiled steps per point (after one unrecorded profiler warm-up step); the median is kept."""


def busy_ms_per_step(trace: Trace) -> list[float]:
    """Per `step` range of the trace: the union of its launched device intervals, in ms."""
    busy = []
    for span in step_spans(trace):
        stats = phase_stats(trace, STEP, [span], top_gaps=0)
        busy.append((stats.busy_ns if stats else 0) / 1e6)
    return busy


def measure_gpu_busy(
    step: Callable[[], Any], *, device: torch.device, step_ms: float, steps: int = BUSY_STEPS
) -> dict[str, Any]:
    """Profile `steps` extra calls of `step` and return the busy fields (empty on a CPU).

    Call it after the timed steps: its profiled steps are never timed ones.
    """
    if device.type != "cuda":
        return {}
    with tempfile.TemporaryDirectory(prefix="lmscope-busy-") as folder:
        path = Path(folder) / "trace.json"
        try:
            record_trace(step, steps=steps, device=device, path=path)
        except torch.cuda.OutOfMemoryError:
            raise
        except RuntimeError as error:  # the profiler could not start (CUPTI unavailable)
            return unmeasured(f"torch.profiler failed: {error}"[:300])
        trace = load_trace(path)
    busy = busy_ms_per_step(trace)
    if not trace.on_gpu or not busy or max(busy) == 0:
        return unmeasured("torch.profiler recorded no GPU kernels (is another profiler such as nsys "
                          "holding CUPTI?)")
    return busy_fields(busy, step_ms)
