"""A study workload: the parallelism accounting of one model on one mesh (no device work).

It runs through the runner like every measured point, so the study's last section is a JSONL of
Records too: per mesh, the memory per device, the bytes each axis moves per step and the pass
times at the device's peak, from `lmscope.planning.plan.parallel_plan`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lmscope.accounting.parallelism import Mesh, PrecisionPlan, hardware
from lmscope.planning import plan


@dataclass(frozen=True, kw_only=True)
class Spec:
    """One model on one DP x FSDP x TP mesh of a catalogued device."""

    model: str = "xl"
    """Preset name (tiny..2.7B) or xxl."""
    context_length: int = 1024
    """Tokens per sequence."""
    batch_size: int = 8
    """Sequences per global batch."""
    dp: int = 1
    """Data-parallel replicas."""
    fsdp: int = 1
    """FSDP shards."""
    tp: int = 1
    """Tensor-parallel shards."""
    device_name: str = "H100 SXM"
    """A device of the accounting catalogue."""

    def __post_init__(self) -> None:
        for name in ("context_length", "batch_size", "dp", "fsdp", "tp"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")


def run_point(point: dict[str, Any]) -> dict[str, Any]:
    """The plan's memory, traffic and times for the mesh, flattened into one record."""
    spec = Spec(**point)
    shape = plan.model_shape(spec.model, spec.context_length)
    mesh = Mesh(dp=spec.dp, fsdp=spec.fsdp, tp=spec.tp)
    sections = plan.parallel_plan(
        shape,
        mesh,
        PrecisionPlan(),
        tokens=spec.batch_size * spec.context_length,
        hw=hardware(spec.device_name, "bf16"),
    )
    metrics: dict[str, Any] = {"devices": mesh.devices, "parameters": shape.parameters}
    for row in sections["memory per device"]:
        if "fits" in row:
            metrics["device_memory_gib"] = row["gib"]
            metrics["fits"] = row["fits"]
        else:
            metrics[f"{row['component']}_gib"] = row["gib"]
    for row in sections["communication per step"]:
        metrics[f"{row['axis']}_step_mb"] = row["step_mb"]
    for row in sections["time per pass"]:
        metrics[f"{row['phase']}_math_ms_at_peak"] = row["math_ms_at_peak"]
        metrics[f"{row['phase']}_comm_ms"] = row["comm_ms"]
        metrics[f"{row['phase']}_bound"] = row["bound"]
    return metrics
