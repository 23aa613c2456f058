"""PyTorch's FSDP2 as the peer of FullyShardedDP: `fully_shard` per unit, then on the root.

The same units as ours (`lmscope.parallel.fsdp_units`: a list, a class policy, or the default
units), bottom-up, then the whole model;
`MixedPrecisionPolicy(param_dtype, reduce_dtype)` with the same dtypes as ours (the compute dtype
for both unless told otherwise) and `cast_forward_inputs=False` (ours leaves a unit's inputs as
they come: the fast model's fp32 residual stream and RoPE tables stay fp32),
`reshard_after_forward=True` (FSDP2's default: free after the forward, gather again in the
backward). The model's parameters become DTensor shards: build the
optimizer over `model.parameters()` after this call.
"""

from __future__ import annotations

import torch
from torch import nn

from lmscope.parallel.fsdp_units import UnitsSpec, resolve_units


def torch_fully_shard(model: nn.Module, units: UnitsSpec = None, *,
                      param_dtype: torch.dtype | None = None,
                      reduce_dtype: torch.dtype | None = None) -> dict[str, object]:
    """Apply `fully_shard` to each unit and the root in place; returns the settings used."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype or param_dtype,
                                  cast_forward_inputs=False)
    chosen, _ = resolve_units(model, units)  # FSDP2 needs no forward order
    for unit in chosen:
        fully_shard(unit, mp_policy=policy)
    fully_shard(model, mp_policy=policy)

    def name(dtype: torch.dtype | None) -> str:
        return "master" if dtype is None else str(dtype).replace("torch.", "")

    return {"units": len(chosen), "param_dtype": name(param_dtype),
            "reduce_dtype": name(reduce_dtype or param_dtype), "cast_forward_inputs": False,
            "reshard_after_forward": True}
