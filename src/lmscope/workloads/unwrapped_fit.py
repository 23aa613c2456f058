"""Whether `lmscope ddp`'s paired unwrapped step can fit on a rank's GPU, by the memory model.

Every multi-rank point first times the step unwrapped (no sharding: the whole model, its gradients
and AdamW state on each rank). Where that cannot fit (the 8B long-context step under FSDP), trying
costs a step's time and a CUDA out-of-memory error in the rank that goes on to measure the sharded
step: what the failed step leaves behind (fragments, anything it kept alive) counts against the
step that matters. So a point whose unwrapped step is predicted to exceed the device's memory by a
clear margin skips it; the row says why. Points without a prediction (a transformers model, a
user's factory, the CPU) try it as before.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from lmscope.accounting.memory import GIB
from lmscope.accounting.step_peak import predicted_step_peak

if TYPE_CHECKING:
    from lmscope.workloads.ddp import Spec

MARGIN = 1.10
"""Skip only above this multiple of the device's memory: the models are within a few percent."""


def unwrapped_peak_bytes(spec: Spec) -> int | None:
    """The predicted peak of the unwrapped train step on one rank (None without a model)."""
    config = spec.model_config()
    if config is None:
        return None
    try:
        return predicted_step_peak(config, batch_size=spec.batch_size, seq_len=spec.context_length,
                                   mode=spec.mode, precision=spec.precision, attention=spec.attention,
                                   checkpoint=spec.checkpoint, fast=spec.fast)
    except ValueError:  # a setting the memory models do not cover: no prediction
        return None


def why_unwrapped_cannot_fit(spec: Spec, device: torch.device) -> str | None:
    """One line saying why the unwrapped step is skipped on `device`, or None to run it."""
    if device.type != "cuda":
        return None
    peak = unwrapped_peak_bytes(spec)
    total = torch.cuda.get_device_properties(device).total_memory
    if peak is None or peak <= MARGIN * total:
        return None
    return (f"the unwrapped step is predicted to need {peak / GIB:.1f} GiB per rank, more than the "
            f"{total / GIB:.1f} GiB of the device: not run")
