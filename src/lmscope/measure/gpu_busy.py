"""How much of a step the GPU works, measured: kernel time over the step, and the host-bound flag.

After a point's timed steps, `measure_gpu_busy` runs `BUSY_STEPS` more under torch.profiler with
CUDA activity only (CUPTI's record of every kernel, memcpy and memset; no CPU operators, so the
profiler adds little to the point's run time). The device is synchronized before the profiler
starts and after the last step, so every interval recorded belongs to these steps. The busy time
is the union of those intervals, so kernels that overlap on two streams count once and the gaps
between kernels count not at all, divided by the steps. The row gets it (`gpu_busy_ms`), its share
of the *timed* steps' median wall time (`gpu_busy_share`: the profiled steps' own wall time
carries the profiler's host overhead, the kernels' durations do not), and `host_bound` when that
share is below `lmscope.measure.host_bound.HOST_BOUND_BELOW`.

CUDA graphs: a graph replay's kernels reach CUPTI one by one (PyTorch's tutorial "CUDA Graph
Kernel Annotations and Profiling" profiles replays this way), so the fast step's replays and
torch.compile's reduce-overhead mode are measured like eager steps. Where the profiler records no
kernel at all (CUPTI held by another tool such as nsys), the fields are None and
`gpu_busy_reason` says why. On a CPU there is no device timeline: the fields are left out.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from lmscope.measure.host_bound import BUSY_STEPS, busy_fields, unmeasured
from lmscope.measure.kernels import Trace, load_trace, union_ns
from lmscope.measure.timer import synchronize


def busy_ms(trace: Trace, steps: int) -> float:
    """Busy time per step of a trace of `steps` synchronized steps: the union of its device
    intervals over the steps, in ms (0 for a trace without device activity)."""
    return union_ns(trace.activities) / 1e6 / steps if trace.on_gpu else 0.0


def record_kernels(step: Callable[[], Any], *, steps: int, device: torch.device, path: Path) -> None:
    """Run `steps` calls of `step` under torch.profiler (CUDA activity) into a Chrome trace at `path`."""
    synchronize(device)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as profiler:
        for _ in range(steps):
            step()
        synchronize(device)
    profiler.export_chrome_trace(str(path))


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
            record_kernels(step, steps=steps, device=device, path=path)
        except torch.cuda.OutOfMemoryError:
            raise
        except RuntimeError as error:  # the profiler could not start (CUPTI unavailable)
            return unmeasured(f"torch.profiler failed: {error}"[:300])
        busy = busy_ms(load_trace(path), steps)
    if busy == 0:
        return unmeasured("torch.profiler recorded no GPU kernels (is another profiler such as nsys "
                          "holding CUPTI?)")
    return busy_fields(busy, step_ms)
