"""ShardedOptimizer: optimizer state partitioned across data-parallel ranks (ZeRO stage 1).

Every parameter is owned by one rank, assigned greedily (largest first, to the least loaded
rank) so that ranks hold about the same number of elements. Each rank builds the wrapped
optimizer over the parameters it owns only, so its state (AdamW: two fp32 tensors per
parameter) is 1/N of the whole; after each local step the owners broadcast their updated
parameters. Gradients must already be averaged (a DDP wrapper does it).

Param groups keep their meaning: group i of this optimizer maps to group i of the local one
(possibly empty on a rank), and hyperparameters set on `param_groups` (by a scheduler) are
copied to the local groups before each step. A checkpoint is gathered with
`consolidate_state_dict(to=r)` on every rank, then `state_dict()` on rank r: the result has
the layout of the unsharded optimizer's state dict, and `load_state_dict` takes it back.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
import torch.distributed as dist


class ShardedOptimizer(torch.optim.Optimizer):
    """Wraps `optimizer_cls(**kwargs)` so that each rank keeps the state of its shard only."""

    def __init__(self, params: Iterable[Any], optimizer_cls: type[torch.optim.Optimizer],
                 **kwargs: Any) -> None:
        distributed = dist.is_available() and dist.is_initialized()
        self.rank = dist.get_rank() if distributed else 0
        self.world_size = dist.get_world_size() if distributed else 1
        self._optimizer_cls = optimizer_cls
        self._kwargs = kwargs
        self._loads = [0] * self.world_size
        self.owner: dict[torch.Tensor, int] = {}
        """Parameter -> the rank that holds its state and broadcasts it after a step."""
        self.local: torch.optim.Optimizer | None = None
        """The wrapped optimizer over this rank's shard."""
        self._consolidated: dict[str, Any] | None = None
        super().__init__(params, defaults=kwargs)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a group: its parameters are assigned to ranks, the local optimizer gets this rank's."""
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        for param in sorted(group["params"], key=lambda p: -p.numel()):
            rank = min(range(self.world_size), key=lambda r: self._loads[r])
            self._loads[rank] += param.numel()
            self.owner[param] = rank
        local_group = {**group, "params": [p for p in group["params"] if self.owner[p] == self.rank]}
        if self.local is None:
            self.local = self._optimizer_cls([local_group], **self._kwargs)
        else:
            self.local.add_param_group(local_group)
        for key, value in self.local.param_groups[-1].items():
            group.setdefault(key, value)

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        """Step this rank's shard, then broadcast each parameter from its owner."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        assert self.local is not None
        for group, local_group in zip(self.param_groups, self.local.param_groups, strict=True):
            local_group.update({k: v for k, v in group.items() if k != "params"})
        self.local.step()
        if self.world_size > 1:
            handles = [
                dist.broadcast(p, src=self.owner[p], async_op=True)
                for group in self.param_groups for p in group["params"]
            ]
            for handle in handles:
                handle.wait()
        return loss

    def _global_index(self) -> dict[torch.Tensor, int]:
        """Parameter -> its index in an unsharded state dict (order of the param groups)."""
        params = [p for group in self.param_groups for p in group["params"]]
        return {p: index for index, p in enumerate(params)}

    def consolidate_state_dict(self, to: int = 0) -> None:
        """Gather every rank's optimizer state on rank `to` (a collective: call it on all ranks)."""
        assert self.local is not None
        index = self._global_index()
        local_params = [p for group in self.local.param_groups for p in group["params"]]
        local_state = self.local.state_dict()["state"]
        shard = {
            index[local_params[i]]: {k: v.cpu() if torch.is_tensor(v) else v for k, v in state.items()}
            for i, state in local_state.items()
        }
        shards = [shard]
        if self.world_size > 1:
            shards = [{} for _ in range(self.world_size)] if self.rank == to else None
            dist.gather_object(shard, shards, dst=to)
        if self.rank != to:
            self._consolidated = None
            return
        state = {k: v for part in shards for k, v in part.items()}
        groups = [
            {**{k: v for k, v in group.items() if k != "params"},
             "params": [index[p] for p in group["params"]]}
            for group in self.param_groups
        ]
        self._consolidated = {"state": dict(sorted(state.items())), "param_groups": groups}

    def state_dict(self) -> dict[str, Any]:
        """The consolidated state dict (unsharded layout), on the rank it was gathered to."""
        if self._consolidated is None:
            raise RuntimeError(
                f"rank {self.rank} holds no consolidated state: call consolidate_state_dict(to=rank) "
                "on every rank first, then state_dict() on that rank"
            )
        return self._consolidated

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a consolidated (or unsharded) state dict: each rank keeps its shard's part."""
        assert self.local is not None
        if len(state_dict["param_groups"]) != len(self.param_groups):
            raise ValueError(
                f"state dict has {len(state_dict['param_groups'])} param groups, this optimizer "
                f"{len(self.param_groups)}: load it into an optimizer built over the same groups"
            )
        index = self._global_index()
        local_groups, local_state, position = [], {}, 0
        for group, saved in zip(self.param_groups, state_dict["param_groups"], strict=True):
            group.update({k: v for k, v in saved.items() if k != "params"})
            mine = [p for p in group["params"] if self.owner[p] == self.rank]
            for param in mine:
                if index[param] in state_dict["state"]:
                    local_state[position] = state_dict["state"][index[param]]
                position += 1
            ids = list(range(position - len(mine), position))
            local_groups.append({**{k: v for k, v in saved.items() if k != "params"}, "params": ids})
        self.local.load_state_dict({"state": local_state, "param_groups": local_groups})
