"""Persistent low-precision copies of fp32 master weights, stacked the way the matmuls read them.

A bf16 forward over fp32 master weights otherwise casts every weight on every step (for xl about
12 GB of traffic per step). `ShadowWeights` keeps the bf16 copies between steps and
re-copies a weight when it may have changed since it was mirrored:

* `lmscope.kernels.adamw.FusedAdamW` writes the copies itself in its update and calls
  `mark_fresh`;
* any other ``torch.optim`` optimizer's step invalidates every live set of copies (a global
  step post-hook, registered when the first set is made): torch's fused optimizers
  (``AdamW(fused=True)``) update in place without bumping autograd's version counters, so
  versions alone would miss them;
* other in-place changes PyTorch makes (``load_state_dict``, ``with no_grad: w.add_(...)``) bump
  the weight's version counter, which `stack` compares.

A write that does neither (through ``.data``, or a raw kernel) is not seen: call `invalidate()`.

`ShadowWeights` is the model's side of `lmscope.kernels.shadow_copies.ShadowCopies`, the contract
an optimizer that writes the copies relies on (``views``, ``mark_fresh``, and the optimizer's
``WRITES_SHADOW_WEIGHTS`` attribute that spares its steps from the hook).
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

from lmscope.kernels.shadow_copies import WRITES_SHADOW_WEIGHTS

_LIVE: weakref.WeakSet[ShadowWeights] = weakref.WeakSet()


def _invalidate_after_foreign_step(optimizer: torch.optim.Optimizer, args, kwargs) -> None:
    """Global optimizer step post-hook: any optimizer but a shadow-writing one stales the copies."""
    if not getattr(optimizer, WRITES_SHADOW_WEIGHTS, False):
        for shadows in list(_LIVE):
            shadows.invalidate()


_HOOKED = False  # the hook is registered with the first ShadowWeights, not at import


def _where(weight: torch.Tensor) -> tuple:
    """What a copy depends on besides the values: storage, dtype, shape."""
    return weight.data_ptr(), weight.dtype, weight.shape


class ShadowWeights:
    """Groups of weights, each stacked along dim 0 into one persistent tensor of `dtype`."""

    def __init__(self, groups: Sequence[Sequence[torch.Tensor]], dtype: torch.dtype) -> None:
        self.dtype = dtype
        self.groups = [tuple(group) for group in groups]
        self.stacks: list[torch.Tensor] = []
        self.views: dict[torch.Tensor, torch.Tensor] = {}
        self._mirrored: dict[torch.Tensor, int | None] = {}
        for group in self.groups:
            rows = [w.shape[0] for w in group]
            # a normal tensor even if the first forward runs under inference_mode
            with torch.inference_mode(False):
                stack = torch.empty(sum(rows), *group[0].shape[1:], dtype=dtype, device=group[0].device)
            for weight, view in zip(group, stack.split(rows), strict=True):
                if weight in self.views:
                    raise ValueError(f"a weight of shape {tuple(weight.shape)} appears twice (tied "
                                     "weights): one copy per weight is kept, so shared ones are not")
                self.views[weight] = view
                self._mirrored[weight] = None
            self.stacks.append(stack)
        self._layout = self._signature()
        self._places = {w: _where(w) for group in self.groups for w in group}
        global _HOOKED
        if not _HOOKED:
            register_optimizer_step_post_hook(_invalidate_after_foreign_step)
            _HOOKED = True
        _LIVE.add(self)

    def _signature(self) -> tuple:
        return tuple(_where(w) for group in self.groups for w in group)

    def matches(self, groups: Sequence[Sequence[torch.Tensor]], dtype: torch.dtype) -> bool:
        """Whether these are still the copies of `groups` (same tensors, storage, dtype)."""
        same = len(groups) == len(self.groups) and all(
            len(new) == len(old) and all(a is b for a, b in zip(new, old, strict=True))
            for new, old in zip(groups, self.groups, strict=True)
        )
        return same and dtype == self.dtype and self._signature() == self._layout

    def stack(self, index: int) -> torch.Tensor:
        """Group `index` stacked in `dtype`, after re-copying the weights changed since mirrored."""
        with torch.no_grad():
            for weight in self.groups[index]:
                if self._mirrored[weight] != weight._version:
                    self.views[weight].copy_(weight)
                    self._mirrored[weight] = weight._version
        return self.stacks[index]

    def stack_of(self, index: int, weights: Sequence[torch.Tensor]) -> torch.Tensor | None:
        """`stack(index)` if `weights` are still group `index`'s tensors (same objects, storage,
        dtype and shape), else None: a caller that reads module attributes each forward (which a
        wrapper such as FSDP may have replaced) falls back to casting instead of stale copies."""
        group = self.groups[index]
        pairs = zip(weights, group, strict=False)
        if len(weights) != len(group) or any(new is not old or _where(new) != self._places[old]
                                             for new, old in pairs):
            return None
        return self.stack(index)

    def mark_fresh(self, weight: torch.Tensor) -> None:
        """Record that `weight`'s copy was just written with its current value (by an optimizer)."""
        self._mirrored[weight] = weight._version

    def invalidate(self) -> None:
        """Forget what is mirrored: every weight is copied again at its next use."""
        for weight in self._mirrored:
            self._mirrored[weight] = None
