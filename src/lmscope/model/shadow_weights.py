"""Persistent low-precision copies of fp32 master weights, stacked the way the matmuls read them.

A bf16 forward over fp32 master weights otherwise casts every weight on every step (for xl about
12 GB of traffic, ~4 ms on an H100). `ShadowWeights` keeps the bf16 copies between steps and
re-copies a weight only when it changed since it was mirrored: autograd's version counter says
so for every in-place update PyTorch makes (torch.optim, load_state_dict), and
`lmscope.kernels.adamw.FusedAdamW` writes the copy itself in its update and then calls
`mark_fresh`. A change that bypasses version counters (writes through ``.data`` or raw kernels)
is not seen: call `invalidate()` after one.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


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
            stack = torch.empty(sum(rows), *group[0].shape[1:], dtype=dtype, device=group[0].device)
            for weight, view in zip(group, stack.split(rows), strict=True):
                self.views[weight] = view
                self._mirrored[weight] = None
            self.stacks.append(stack)
        self._layout = self._signature()

    def _signature(self) -> tuple:
        return tuple((w.data_ptr(), w.dtype, w.shape) for group in self.groups for w in group)

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

    def mark_fresh(self, weight: torch.Tensor) -> None:
        """Record that `weight`'s copy was just written with its current value (by an optimizer)."""
        self._mirrored[weight] = weight._version

    def invalidate(self) -> None:
        """Forget what is mirrored: every weight is copied again at its next use."""
        for weight in self._mirrored:
            self._mirrored[weight] = None
