"""A study workload: the mixed-precision checks of `lmscope precision` as runner points.

`accumulate` sums 0.01 `count` times with every accumulator; `autocast` lists the dtype of each
tensor of a model under autocast. Each point's rows are kept in the record's `rows` list, the way
`top_allocations` keeps a memory point's largest allocations.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lmscope.planning.precision import accumulate, autocast_dtypes
from lmscope.workloads.train_step import resolve_device

CHECKS = ("accumulate", "autocast")


@dataclass(frozen=True, kw_only=True)
class Spec:
    """One precision check."""

    check: str = "accumulate"
    """accumulate | autocast."""
    count: int = 1000
    """accumulate: how many times 0.01 is added."""
    model: str = "toy"
    """autocast: toy or a preset."""
    dtype: str = "bf16"
    """autocast: fp16 | bf16."""
    device: str = "auto"
    """auto | cpu | cuda."""

    def __post_init__(self) -> None:
        if self.check not in CHECKS:
            raise ValueError(f"unknown precision check {self.check!r}: choose one of {', '.join(CHECKS)}")


def run_point(point: dict[str, Any]) -> dict[str, Any]:
    """The check's rows, and the device they ran on."""
    spec = Spec(**point)
    device = str(resolve_device(spec.device))
    if spec.check == "accumulate":
        rows = accumulate(spec.count, 0.01, device)
    else:
        rows = autocast_dtypes(spec.model, spec.dtype, device)
    return {"device_type": device.split(":")[0], "rows": rows}
