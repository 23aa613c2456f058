"""What a FullyShardedDP-wrapped model holds under each original parameter name between steps.

FullyShardedDP keeps one flat fp32 shard per unit; the model's own parameters are gone. Under
each original name the model holds a `ShardedParameter`: a tensor with the parameter's full
shape, dtype and requires_grad (so counting parameters, `named_parameters()` and `.dtype` work)
but no data on this rank. Reading its values raises one line that says how to read the weights
(run the model through the wrapper; `summon_full_params()`; `full_state_dict()`), where the
freed view it replaces used to crash the process (its storage was 0 bytes).

This rank's part of it is `to_local()`: elements [start, stop) = `local_range` of the flattened
parameter, a 1-D view of the unit's flat shard (empty where this rank holds none of it; writing
to it writes the shard). `.grad` is a `ShardedGrad` shaped like the parameter whose `to_local()`
is the same piece of the shard's gradient (None until a backward reached the unit), as with
FSDP2's DTensor parameters: `param.grad.to_local()`.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch


class FlatShard(Protocol):
    """The flat shard a view reads (lmscope.parallel.fsdp._FlatGroup)."""

    shard: torch.nn.Parameter


READ_HINT = ("run the model through the wrapper (fsdp(...)); read weights inside `with "
             "fsdp.summon_full_params():` or from fsdp.full_state_dict(); this rank's piece is .to_local()")
"""How to read a sharded parameter, in every error that reading one raises."""


class _ShardedView(torch.Tensor):
    """Full shape and dtype, no data; `to_local()` is this rank's piece of one flat shard."""

    param_name: str
    """The parameter's name in the model."""
    local_range: tuple[int, int]
    """Elements [start, stop) of the flattened parameter that this rank holds."""
    _flat: FlatShard
    _offset: int
    """Where the piece begins in the rank's flat shard."""

    @staticmethod
    def __new__(cls, name: str, shape: torch.Size, flat: FlatShard, offset: int,
                local_range: tuple[int, int], requires_grad: bool = False) -> _ShardedView:
        shard = flat.shard
        view = torch.Tensor._make_wrapper_subclass(cls, shape, dtype=shard.dtype, device=shard.device,
                                                   requires_grad=requires_grad)
        view.param_name, view._flat, view._offset, view.local_range = name, flat, offset, local_range
        return view

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        views = [a for a in args if isinstance(a, _ShardedView)]
        if func is torch.ops.aten.detach.default and len(views) == 1:  # state_dict(), .data
            view = views[0]
            return type(view)(view.param_name, view.shape, view._flat, view._offset, view.local_range)
        names = ", ".join(sorted({v.param_name for v in views})) or "a parameter"
        raise RuntimeError(f"{names} is sharded by FullyShardedDP and holds no data here ({func}): "
                           f"{READ_HINT}")

    def _source(self) -> torch.Tensor:
        """The flat tensor the piece is cut from (this rank's shard)."""
        return self._flat.shard.detach()

    def to_local(self) -> torch.Tensor:
        """This rank's piece: elements `local_range` of the flattened tensor (1-D, may be empty)."""
        source = self._source()
        start, stop = self.local_range
        return source[self._offset: self._offset + stop - start]

    def __repr__(self, *, tensor_contents: object = None) -> str:
        start, stop = self.local_range
        return (f"{type(self).__name__}({self.param_name!r}, shape={tuple(self.shape)}, dtype={self.dtype}, "
                f"local_range=({start}, {stop}))")

    def __reduce_ex__(self, protocol: Any) -> Any:
        raise RuntimeError(f"{self.param_name} is sharded by FullyShardedDP: save fsdp.full_state_dict(), "
                           "not the module's state_dict()")


class ShardedParameter(_ShardedView):
    """An original parameter of a FullyShardedDP-wrapped model (see the module docstring)."""

    _is_param = True  # isinstance(view, nn.Parameter): the model's parameter registry expects it

    @property
    def grad(self) -> ShardedGrad | None:  # type: ignore[override]
        """This parameter's gradient, sharded like it (None before a backward reached its unit)."""
        if self._flat.shard.grad is None:
            return None
        return ShardedGrad(self.param_name, self.shape, self._flat, self._offset, self.local_range)

    @grad.setter
    def grad(self, value: torch.Tensor | None) -> None:
        if value is not None:
            raise RuntimeError(f"{self.param_name} is sharded by FullyShardedDP: write its gradient through "
                               ".grad.to_local() (this rank's piece)")
        self._flat.shard.grad = None  # zero_grad(set_to_none=True): the unit's flat gradient goes


class ShardedGrad(_ShardedView):
    """The gradient of a ShardedParameter; `to_local()` is this rank's piece of the shard's gradient."""

    def _source(self) -> torch.Tensor:
        grad = self._flat.shard.grad
        if grad is None:
            raise RuntimeError(f"the gradient of {self.param_name} was cleared (zero_grad) after it was "
                               "read: read param.grad again after the next backward")
        return grad
