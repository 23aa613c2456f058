"""AdamW for `FullyShardedDP` with its moments in pinned host memory, each unit updated in the backward.

Why: under FSDP the master shards and AdamW's two moments are the static memory of a step, and
the moments are two thirds of it (8 of every 12 bytes per shard element). On the host they leave
that memory to activations, which a long-context step otherwise has to recompute (ZeRO-Offload's
memory; here the update stays on the GPU, so the host only stores).

How, per trainable shard of a unit (CUDA):

* when the unit's backward starts (`FullyShardedDP`'s pre-backward hint, `prefetch`) its moments
  are copied into one of `UNITS_IN_FLIGHT` device slots on a copy-in stream, once the slot's last
  copy back (and the shard's own) has left;
* as soon as the unit's gradient is reduce-scattered (`update`, on the reduce stream) that stream
  waits for the copy, the fused AdamW kernel (`lmscope.kernels.adamw.adamw_update_`) updates the
  shard from the reduced gradient (the reduce dtype: no fp32 gradient is ever stored), and a
  copy-out stream takes the moments back to the host after it, freeing the slot;
* the slots are allocated once: the moments on the device never exceed them, however far the host
  runs ahead of the GPU (a unit that finds none free is fetched into a buffer of its own when its
  gradient arrives).

The shards reduced at the end of the backward (`FullyShardedDP.shards_reduced_last`: the root's
and the first unit's) keep their moments on the device: a copy in would be exposed there. Where
each shard's moments live is decided at the first backward (or load), once the wrapper knows the
units' order. On the CPU everything stays where it is and the update is plain PyTorch math.

Contract: each backward must be followed by one ``step()``, which only advances the step counts
(the updates ran in the backward); a forward for another backward before it raises (no
accumulation of micro-batches). Gradients never reach ``.grad``: no clipping
(`FullyShardedDP.clip_grad_norm_` refuses), no ``GradScaler`` (fp16 is refused), no param groups
added later. ``state_dict()`` / ``load_state_dict()`` are torch's format (the moments as host
tensors, views of the live buffers: clone them to keep them across a backward), waiting for the
copies in flight. The wrapper holds this optimizer weakly. Not for CUDA-graph capture. Math:
``torch.optim.AdamW``'s (decoupled weight decay, bias correction).
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch import nn

from lmscope.kernels.adamw import adamw_update_, check_hyperparameters
from lmscope.parallel.fsdp import FullyShardedDP

__all__ = ["UNITS_IN_FLIGHT", "HostStateAdamW"]

UNITS_IN_FLIGHT = 2
"""Device slots for the moments of units on the host: the unit whose backward runs and the one
going back (`lmscope.accounting.fsdp.HOST_STATE_UNITS_IN_FLIGHT` mirrors it)."""

SECOND_BACKWARD = ("HostStateAdamW updates each shard in the backward: call step() after each backward "
                   "(no gradient accumulation over micro-batches)")


class _Staged:
    """A shard's moments on the device, in a slot (or a buffer of its own), and when they arrive."""

    def __init__(self, moments: torch.Tensor, ready: torch.cuda.Event, slot: int | None) -> None:
        self.moments, self.ready, self.slot = moments, ready, slot


class HostStateAdamW(torch.optim.Optimizer):
    """``HostStateAdamW(fsdp_model, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2)``:
    AdamW over the model's trainable shards, moments in pinned host memory (see the module)."""

    def __init__(self, model: FullyShardedDP, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 1e-2) -> None:
        if not isinstance(model, FullyShardedDP):
            raise TypeError(f"HostStateAdamW steps a FullyShardedDP model's shards, got "
                            f"{type(model).__name__}: wrap the model first (FullyShardedDP(model, ...))")
        if torch.float16 in (model.param_dtype, model.reduce_dtype):
            raise ValueError("HostStateAdamW updates from the reduced gradients, which a GradScaler never "
                             "sees: run bf16 or fp32 (param_dtype=torch.bfloat16)")
        check_hyperparameters(lr, betas, eps, weight_decay)
        shards = [p for p in model.parameters() if p.requires_grad]
        if not shards:
            raise ValueError("the model has no trainable parameters to step")
        super().__init__(shards, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))
        self._group_of = {p: group for group in self.param_groups for p in group["params"]}
        self._reduced_last = weakref.WeakMethod(model.shards_reduced_last)
        self._placed = False
        self._host_moments: dict[nn.Parameter, torch.Tensor] = {}
        """(2, n) pinned exp_avg and exp_avg_sq of the shards whose moments live on the host."""
        cuda = shards[0].device.type == "cuda"
        self._copy_in = torch.cuda.Stream(shards[0].device) if cuda else None
        self._copy_out = torch.cuda.Stream(shards[0].device) if cuda else None
        self._slots: list[torch.Tensor] = []
        self._slot_owner: list[nn.Parameter | None] = []
        self._slot_free: list[torch.cuda.Event | None] = []
        self._back: dict[nn.Parameter, torch.cuda.Event] = {}
        """Per shard on the host: its last copy back (the next copy in waits for it)."""
        self._staged: dict[nn.Parameter, _Staged] = {}
        self._updated: set[nn.Parameter] = set()
        model.hand_gradients_to(self)

    def add_param_group(self, param_group: dict) -> None:
        """torch's, while building; later groups are refused (the wrapper's shards are all there)."""
        if hasattr(self, "_group_of"):
            raise ValueError("HostStateAdamW steps the FullyShardedDP model's shards, all given at "
                             "construction: build another optimizer for other parameters")
        super().add_param_group(param_group)

    @property
    def host_bytes(self) -> int:
        """Bytes of the moments held in pinned host memory (0 before the first backward)."""
        return sum(m.numel() * m.element_size() for m in self._host_moments.values())

    # ---- placement ----------------------------------------------------------------------------

    def _place(self) -> None:
        """Pin the moments of every shard not reduced last, and allocate the device slots."""
        self._placed = True
        reduced_last = self._reduced_last()
        resident = set(reduced_last() if reduced_last is not None else ())
        for shard in self._group_of:
            if shard.is_cuda and shard not in resident:
                self._host_moments[shard] = self._new_state(shard, pinned=True)
        if self._host_moments:
            largest = max(shard.numel() for shard in self._host_moments)
            first = next(iter(self._host_moments))
            self._slots = [torch.empty(2 * largest, dtype=first.dtype, device=first.device)
                           for _ in range(UNITS_IN_FLIGHT)]
            self._slot_owner = [None] * UNITS_IN_FLIGHT
            self._slot_free = [None] * UNITS_IN_FLIGHT

    def _new_state(self, shard: nn.Parameter, *, pinned: bool = False) -> torch.Tensor:
        """The shard's state: its count (on its device) and zero moments, one (2, n) tensor on the
        device or, `pinned`, in pinned host memory; returns the moments."""
        moments = torch.zeros((2, shard.numel()), dtype=shard.dtype, pin_memory=pinned,
                              device="cpu" if pinned else shard.device)
        self.state[shard] = {"step": torch.zeros((), dtype=torch.float32, device=shard.device),
                             "exp_avg": moments[0], "exp_avg_sq": moments[1]}
        return moments

    # ---- GradientConsumer: what FullyShardedDP calls -----------------------------------------

    def takes(self, shard: nn.Parameter) -> bool:
        return shard in self._group_of

    def forward_starts(self) -> None:
        if self._updated:
            raise RuntimeError(SECOND_BACKWARD)

    @torch.no_grad()
    def prefetch(self, shard: nn.Parameter) -> None:
        """Copy the shard's moments into a free device slot on the copy-in stream."""
        if not self._placed:
            self._place()
        if shard not in self._host_moments or shard in self._staged:
            return
        slot = next((i for i, owner in enumerate(self._slot_owner) if owner is None), None)
        if slot is not None:
            self._slot_owner[slot] = shard
            self._stage(shard, self._slots[slot][: 2 * shard.numel()].view(2, -1), slot)

    def _stage(self, shard: nn.Parameter, moments: torch.Tensor, slot: int | None) -> None:
        assert self._copy_in is not None
        for event in (self._slot_free[slot] if slot is not None else None, self._back.get(shard)):
            if event is not None:
                self._copy_in.wait_event(event)
        with torch.cuda.stream(self._copy_in):
            moments.copy_(self._host_moments[shard], non_blocking=True)
            self._staged[shard] = _Staged(moments, self._copy_in.record_event(), slot)

    @torch.no_grad()
    def update(self, shard: nn.Parameter, grad: torch.Tensor) -> None:
        """Update the shard from its reduced gradient on the current stream; moments back after."""
        if shard in self._updated:
            raise RuntimeError(SECOND_BACKWARD)
        if not self._placed:
            self._place()
        self._updated.add(shard)
        if not self.state[shard]:
            self._new_state(shard)
        group, state = self._group_of[shard], self.state[shard]
        if shard not in self._host_moments:
            adamw_update_(shard, grad, state["exp_avg"], state["exp_avg_sq"], state["step"], group)
            return
        if shard not in self._staged:
            self.prefetch(shard)
        if shard not in self._staged:  # every slot holds a unit still to come: a buffer of its own
            assert self._copy_in is not None
            with torch.cuda.stream(self._copy_in):
                own = torch.empty((2, shard.numel()), dtype=shard.dtype, device=shard.device)
            self._stage(shard, own, None)
        staged = self._staged.pop(shard)
        stream = torch.cuda.current_stream(shard.device)
        stream.wait_event(staged.ready)
        adamw_update_(shard, grad, staged.moments[0], staged.moments[1], state["step"], group)
        assert self._copy_out is not None
        self._copy_out.wait_stream(stream)
        with torch.cuda.stream(self._copy_out):
            self._host_moments[shard].copy_(staged.moments, non_blocking=True)
            back = self._back[shard] = self._copy_out.record_event()
        if staged.slot is None:  # allocated on the copy-in stream, read here and by the copy back
            staged.moments.record_stream(stream)
            staged.moments.record_stream(self._copy_out)
        else:
            self._slot_owner[staged.slot], self._slot_free[staged.slot] = None, back

    # ---- the optimizer's side ---------------------------------------------------------------

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        """Advance the step count of every shard updated in the backward just run (the updates ran
        there); returns closure's loss if given."""
        stray = [p for p in self._group_of if p.grad is not None]
        if stray:
            raise RuntimeError(f"{len(stray)} shard(s) hold a .grad, which HostStateAdamW never reads (it "
                               "updates from the reduced gradients in the backward): a handler other "
                               "than this optimizer got them (hand_gradients_to)? set them to None")
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if self._updated:
            torch._foreach_add_([self.state[p]["step"] for p in self._updated], 1.0)
        self._updated = set()
        for staged in self._staged.values():  # moments fetched for shards that got no gradient
            if staged.slot is not None:
                self._slot_owner[staged.slot] = None
        self._staged.clear()
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Nothing to zero: the shards' gradients never reach ``.grad``."""

    def wait_for_copies(self) -> None:
        """Block the host until every moment copy in flight has arrived (before reading them)."""
        for stream in (self._copy_in, self._copy_out):
            if stream is not None:
                stream.synchronize()

    def state_dict(self) -> dict[str, Any]:
        self.wait_for_copies()
        return super().state_dict()

    @torch.no_grad()
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """torch's state dict of this optimizer (or of a ``torch.optim.AdamW`` over the same shards):
        the hyperparameters, and the moments and counts copied into the buffers where they live;
        shards the dict has no state for start afresh."""
        groups = state_dict["param_groups"]
        sizes = [len(group["params"]) for group in self.param_groups]
        if [len(saved["params"]) for saved in groups] != sizes:
            raise ValueError("the state dict's parameter groups do not match this optimizer's shards")
        if any(saved.get("amsgrad") or saved.get("maximize") for saved in groups):
            raise ValueError("HostStateAdamW has no amsgrad or maximize: load a state dict without them")
        if not self._placed:
            self._place()
        self.wait_for_copies()
        saved_states = state_dict["state"]
        for saved, group in zip(groups, self.param_groups, strict=True):
            group.update({key: _plain(value) for key, value in saved.items() if key != "params"})
            for index, shard in zip(saved["params"], group["params"], strict=True):
                self._load(shard, saved_states.get(index))

    def _load(self, shard: nn.Parameter, saved: dict[str, Any] | None) -> None:
        if not self.state[shard]:
            if saved is None:
                return
            self._new_state(shard)
        state = self.state[shard]
        for key in ("exp_avg", "exp_avg_sq"):
            if saved is None:
                state[key].zero_()
            else:
                state[key].copy_(saved[key].reshape(-1))
        state["step"].fill_(float(saved["step"]) if saved is not None else 0.0)


def _plain(value: Any) -> Any:
    """A hyperparameter as a Python number (torch's state dicts may hold 0-d tensors: lr, betas)."""
    if torch.is_tensor(value):
        return value.item()
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    return value
