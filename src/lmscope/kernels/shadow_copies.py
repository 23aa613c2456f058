"""The contract between an optimizer that writes low-precision weight copies and their owner.

A model that computes in bf16 over fp32 master weights may keep persistent bf16 copies of them
(``lmscope.model.shadow_weights.ShadowWeights`` implements this contract). An optimizer that
updates a parameter can write the parameter's copy in the same pass (``lmscope.kernels.adamw
.FusedAdamW``), so that nobody casts the weight again. The optimizer needs two things from the owner
of the copies: each parameter's copy (``views``) and a way to say that the copy now holds the
parameter's current value (``mark_fresh``). An optimizer that does this sets the attribute
``WRITES_SHADOW_WEIGHTS`` to True. Otherwise the owner treats every optimizer step as a change it
did not see and copies the weights again.

The contract lives in ``kernels`` so that the optimizer kernel and the model can both depend on
it, and the kernel never imports the model.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol, runtime_checkable

import torch

__all__ = ["WRITES_SHADOW_WEIGHTS", "ShadowCopies"]

# The optimizer attribute that says its step writes the copies itself (True) and keeps them current.
WRITES_SHADOW_WEIGHTS = "writes_shadow_weights"


@runtime_checkable
class ShadowCopies(Protocol):
    """Low-precision copies of parameters that an optimizer writes in its update."""

    @property
    def views(self) -> Mapping[torch.Tensor, torch.Tensor]:
        """parameter -> its copy (contiguous, the parameter's shape, the copies' dtype)."""
        ...

    def mark_fresh(self, weight: torch.Tensor) -> None:
        """Record that ``weight``'s copy was just written with its current value."""
        ...
