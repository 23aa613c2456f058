"""AdamW for `FullyShardedDP` with its moments in pinned host memory, each unit updated in the backward.

Why: under FSDP the master shards and AdamW's two moments are the static memory of a step, and
the moments are two thirds of it (8 of every 12 bytes per shard element). On the host they leave
that memory to activations, which a long-context step otherwise has to recompute (ZeRO-Offload's
memory; here the update stays on the GPU, so the host only stores).

How, per trainable shard of a unit (CUDA):

* when the unit's backward starts (`FullyShardedDP`'s pre-backward hint, `prefetch`) its moments
  are copied to a device buffer on a copy stream;
* as soon as the unit's gradient is reduce-scattered (`update`, on the reduce stream) that stream
  waits for the copy, the fused AdamW kernel (`lmscope.kernels.adamw.adamw_update_`) updates the
  shard from the reduced gradient (the reduce dtype: no fp32 gradient is ever stored), and the
  copy stream takes the moments back to the host after it;
* so at most `UNITS_IN_FLIGHT` units' moments are on the device at once (the one whose backward
  runs and the one going back), and the copies overlap the backward.

The shards reduced at the end of the backward (`FullyShardedDP.shards_reduced_last`: the root's
and the first unit's) keep their moments on the device: a copy in would be exposed there. On the
CPU everything stays where it is and the update is plain PyTorch math.

Contract: each backward must be followed by one ``step()``, which only advances the step counts
(the updates ran in the backward); a second backward first raises (no accumulation of
micro-batches) and gradients never reach ``.grad`` (no clipping, no ``GradScaler``).
``state_dict()`` / ``load_state_dict()`` work as torch's (the moments as host tensors), waiting for
the copies in flight. Math: ``torch.optim.AdamW``'s (decoupled weight decay, bias correction).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from lmscope.kernels.adamw import adamw_update_
from lmscope.parallel.fsdp import FullyShardedDP

__all__ = ["UNITS_IN_FLIGHT", "HostStateAdamW"]

UNITS_IN_FLIGHT = 2
"""Units whose moments are on the device at once: the one whose backward runs, the one copied back
(`lmscope.accounting.fsdp.HOST_STATE_UNITS_IN_FLIGHT` mirrors it)."""


class HostStateAdamW(torch.optim.Optimizer):
    """``HostStateAdamW(fsdp_model, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2)``:
    AdamW over the model's trainable shards, moments in pinned host memory (see the module)."""

    def __init__(self, model: FullyShardedDP, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 1e-2) -> None:
        if not isinstance(model, FullyShardedDP):
            raise TypeError(f"HostStateAdamW steps a FullyShardedDP model's shards, got "
                            f"{type(model).__name__}: wrap the model first (FullyShardedDP(model, ...))")
        if lr < 0 or eps < 0 or weight_decay < 0:
            raise ValueError(f"lr, eps and weight_decay must be >= 0, got {lr}, {eps}, {weight_decay}")
        if not all(0.0 <= b < 1.0 for b in betas):
            raise ValueError(f"betas must be in [0, 1), got {betas}")
        shards = [p for p in model.parameters() if p.requires_grad]
        if not shards:
            raise ValueError("the model has no trainable parameters to step")
        super().__init__(shards, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))
        resident = set(model.shards_reduced_last())
        device = shards[0].device
        self._copies = torch.cuda.Stream(device) if device.type == "cuda" else None
        self._host_moments: dict[nn.Parameter, torch.Tensor] = {}
        """(2, n) pinned exp_avg and exp_avg_sq of the shards whose moments live on the host."""
        for shard in shards:  # the host's now (pinning takes time); the device's at the first update
            if shard.is_cuda and shard not in resident:
                self._host_moments[shard] = self._new_state(shard, pinned=True)
        self._group_of = {p: group for group in self.param_groups for p in group["params"]}
        self._staged: dict[nn.Parameter, tuple[torch.Tensor, torch.cuda.Event]] = {}
        self._updated: set[nn.Parameter] = set()
        model.hand_gradients_to(self)

    def _new_state(self, shard: nn.Parameter, *, pinned: bool = False) -> torch.Tensor:
        """The shard's state: its count (on its device) and zero moments, one (2, n) tensor on the
        device or, `pinned`, in pinned host memory; returns the moments."""
        moments = torch.zeros((2, shard.numel()), dtype=shard.dtype, pin_memory=pinned,
                              device="cpu" if pinned else shard.device)
        self.state[shard] = {"step": torch.zeros((), dtype=torch.float32, device=shard.device),
                             "exp_avg": moments[0], "exp_avg_sq": moments[1]}
        return moments

    @property
    def host_bytes(self) -> int:
        """Bytes of the moments held in pinned host memory."""
        return sum(m.numel() * m.element_size() for m in self._host_moments.values())

    # ---- GradientConsumer: what FullyShardedDP calls in the backward --------------------------

    def takes(self, shard: nn.Parameter) -> bool:
        return shard in self._group_of

    @torch.no_grad()
    def prefetch(self, shard: nn.Parameter) -> None:
        """Copy the shard's moments to the device on the copy stream (after its last copy back)."""
        moments = self._host_moments.get(shard)
        if moments is None or shard in self._staged:
            return
        assert self._copies is not None
        with torch.cuda.stream(self._copies):
            staged = torch.empty_like(moments, device=shard.device)
            staged.copy_(moments, non_blocking=True)
            self._staged[shard] = (staged, self._copies.record_event())

    @torch.no_grad()
    def update(self, shard: nn.Parameter, grad: torch.Tensor) -> None:
        """Update the shard from its reduced gradient on the current stream; moments back after."""
        if shard in self._updated:
            raise RuntimeError("HostStateAdamW updates each shard in the backward: call step() after each "
                               "backward (no gradient accumulation over micro-batches)")
        self._updated.add(shard)
        if not self.state[shard]:
            self._new_state(shard)
        group, state = self._group_of[shard], self.state[shard]
        moments = self._host_moments.get(shard)
        if moments is None:
            adamw_update_(shard, grad, state["exp_avg"], state["exp_avg_sq"], state["step"], group)
            return
        if shard not in self._staged:  # its unit's backward gave no hint (a unit run outside the order)
            self.prefetch(shard)
        staged, ready = self._staged.pop(shard)
        assert self._copies is not None
        stream = torch.cuda.current_stream(shard.device)
        stream.wait_event(ready)
        adamw_update_(shard, grad, staged[0], staged[1], state["step"], group)
        staged.record_stream(stream)  # allocated on the copy stream, read and written here
        self._copies.wait_stream(stream)
        with torch.cuda.stream(self._copies):
            moments.copy_(staged, non_blocking=True)

    # ---- the optimizer's side ---------------------------------------------------------------

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        """Advance the step count of every shard updated in the backward just run (the updates ran
        there); returns closure's loss if given."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if self._updated:
            torch._foreach_add_([self.state[p]["step"] for p in self._updated], 1.0)
        self._updated = set()
        self._staged.clear()  # moments fetched for shards that got no gradient
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Nothing to zero: the shards' gradients never reach ``.grad``."""

    def wait_for_copies(self) -> None:
        """Block the host until every moment copied back has arrived (before reading them)."""
        if self._copies is not None:
            self._copies.synchronize()

    def state_dict(self) -> dict[str, Any]:
        self.wait_for_copies()
        return super().state_dict()

    @torch.no_grad()
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """torch's state dict of this optimizer (or of a ``torch.optim.AdamW`` over the same shards):
        the hyperparameters, and the moments and counts copied into the buffers where they live."""
        groups = state_dict["param_groups"]
        sizes = [len(group["params"]) for group in self.param_groups]
        if [len(saved["params"]) for saved in groups] != sizes:
            raise ValueError("the state dict's parameter groups do not match this optimizer's shards")
        if any(saved.get("amsgrad") or saved.get("maximize") for saved in groups):
            raise ValueError("HostStateAdamW has no amsgrad or maximize: load a state dict without them")
        self.wait_for_copies()
        saved_states = state_dict["state"]
        for saved, group in zip(groups, self.param_groups, strict=True):
            group.update({key: value for key, value in saved.items() if key != "params"})
            for index, shard in zip(saved["params"], group["params"], strict=True):
                if index in saved_states:
                    self._load(shard, saved_states[index])

    def _load(self, shard: nn.Parameter, saved: dict[str, Any]) -> None:
        if not self.state[shard]:
            self._new_state(shard)
        state = self.state[shard]
        for key in ("exp_avg", "exp_avg_sq"):
            state[key].copy_(saved[key].reshape(-1))
        state["step"].fill_(float(saved["step"]))
