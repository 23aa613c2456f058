"""Counted FLOPs of a step and MFU per phase, for the rows of bench and profile.

The count runs on one extra step outside every timed region (`lmscope.measure.flop_count`:
FlopCounterMode with lmscope's attention convention, docs/flops.md), on the eager model, since
compiled graphs do not dispatch their ops to the counter.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lmscope.accounting.devices import peak_tflops
from lmscope.measure.flop_count import FlopCount, count_step


def count_step_flops(step: Any) -> FlopCount:
    """FLOPs per phase of one untimed call of `step(clock)`, its `runnable` set to its eager model."""
    compiled = step.runnable
    step.runnable = step.model
    try:
        return count_step(step)
    finally:
        step.runnable = compiled


def flop_metrics(
    counted: FlopCount, step_ms: float, phases_ms: Mapping[str, float], *,
    device_name: str | None, precision: str, analytic_flops: float | None = None,
) -> dict[str, Any]:
    """Counted FLOPs per step and per phase, TFLOP/s and MFU of the step and of each phase.

    `{phase}_tflops` divides the phase's counted FLOPs by its measured time in `phases_ms`;
    `flops_counted_error` is counted / analytic - 1 where an analytic count exists.
    """
    peak = peak_tflops(device_name, precision) if device_name else None

    def rate(flops: float, ms: float | None) -> tuple[float | None, float | None]:
        if not ms:
            return None, None
        tflops = flops / (ms / 1e3) / 1e12
        return tflops, (tflops / peak if peak else None)

    metrics = counted.as_record()
    metrics["tflops_counted"], metrics["mfu_counted"] = rate(counted.total, step_ms)
    for name, phase in counted.phases.items():
        metrics[f"{name}_tflops"], metrics[f"{name}_mfu"] = rate(phase.flops, phases_ms.get(name))
    metrics["flops_counted_error"] = (counted.total / analytic_flops - 1) if analytic_flops else None
    return metrics
