"""The host-bound rule: a GPU step whose GPU idles for a large share of it (no torch here).

`lmscope.measure.gpu_busy` measures the busy time; these are the row fields made from it, which
reports read without importing torch. The one rule for every step: bench, profile and memory rows
(`host_bound`) and `lmscope ddp --profile-steps` (its `bound` column, from `profile_gpu_busy_pct`).
"""

from __future__ import annotations

from typing import Any

HOST_BOUND_BELOW = 0.8
"""A point is host-bound when its GPU works less than this share of the step's wall time.

Below it, more than a fifth of the step is the GPU waiting for the host (Python, kernel launches,
a synchronization), and that part grows or shrinks with the CPU's speed and load: the same point
measured on another host, or under other load, gets another time. A GPU-bound step of a large
model keeps its GPU busy for well above this (the launch gaps between its kernels are
microseconds against kernels of tens or hundreds); the margin also absorbs that the busy time
comes from profiled steps beside the timed ones."""
BUSY_STEPS = 3
"""Profiled steps per point, after its timed ones."""
KEYS = ("gpu_busy_ms", "gpu_busy_share", "host_bound", "gpu_busy_reason")
"""The fields of a GPU row (absent on a CPU, where there is no device timeline)."""


def is_host_bound(busy_share: float) -> bool:
    """Whether a step whose GPU was busy for `busy_share` of its wall time waited on the host."""
    return busy_share < HOST_BOUND_BELOW


def busy_fields(busy_ms: float, step_ms: float) -> dict[str, Any]:
    """The row's fields from the GPU's busy time per step and the timed median step time."""
    share = busy_ms / step_ms
    return {"gpu_busy_ms": busy_ms, "gpu_busy_share": share, "host_bound": is_host_bound(share),
            "gpu_busy_reason": None}


def unmeasured(reason: str) -> dict[str, Any]:
    """The fields of a GPU row whose busy time could not be measured, with why."""
    return {**dict.fromkeys(KEYS), "gpu_busy_reason": reason}
