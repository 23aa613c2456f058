"""ShardedGradScaler: torch's GradScaler for gradients sharded over ranks (FullyShardedDP, fp16).

torch.amp.GradScaler checks the gradients it is given for inf/NaN and skips the optimizer step
when it finds one. Under FullyShardedDP each rank holds a different shard of the gradients, so
an overflow lands in one rank's shard only: with the plain scaler that rank skips the step and
lowers its scale while the others step, and the replicas of the model part ways. This scaler
takes the maximum of the inf/NaN flags over the process group before any decision, so every
rank skips (or steps) together and keeps the same scale. Use it exactly like GradScaler:
`scaler.scale(loss).backward(); scaler.step(optimizer); scaler.update()`.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist


class ShardedGradScaler(torch.amp.GradScaler):
    """GradScaler whose inf/NaN check spans every rank of `process_group` (None: all ranks)."""

    def __init__(self, device: str = "cuda", *, process_group: dist.ProcessGroup | None = None,
                 **kwargs: Any) -> None:
        super().__init__(device, **kwargs)
        self.process_group = process_group

    def _unscale_grads_(self, optimizer: torch.optim.Optimizer, inv_scale: torch.Tensor,
                        found_inf: torch.Tensor, allow_fp16: bool) -> dict[torch.device, torch.Tensor]:
        """Unscale this rank's gradients, then agree with the other ranks on whether any overflowed."""
        per_device = super()._unscale_grads_(optimizer, inv_scale, found_inf, allow_fp16)
        for flag in per_device.values():
            dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.process_group)
        return per_device
