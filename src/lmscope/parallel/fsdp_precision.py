"""Modules FullyShardedDP keeps in fp32 when it computes in a lower precision (`keep_fp32`).

With `param_dtype=torch.bfloat16` every parameter is gathered in bf16, norms included. A module
named in `keep_fp32` (a class: every module of it, e.g. RMSNorm; or a module itself, e.g. one
unit) keeps its parameters in the master dtype instead: they are gathered, and their gradients
reduce-scattered, in fp32. Its floating inputs are cast to the master dtype on the way in and its
floating outputs to `param_dtype` on the way out, so it runs entirely in fp32 between layers that
run in bf16 (FSDP2 gets the same with a `MixedPrecisionPolicy(param_dtype=torch.float32,
output_dtype=bf16, cast_forward_inputs=True)` on that module). Modules whose weights a fused
kernel reads without calling them see the fp32 weights but no casts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from lmscope.parallel.fsdp_units import outermost

KeepFp32 = Sequence[type[nn.Module] | nn.Module]
"""What `FullyShardedDP(keep_fp32=...)` takes: module classes and/or modules."""


def kept_modules(model: nn.Module, keep: KeepFp32) -> list[nn.Module]:
    """The outermost submodules of `model` that `keep` names (by class or as the module itself)."""
    classes = tuple(k for k in keep if isinstance(k, type))
    instances = {id(k) for k in keep if isinstance(k, nn.Module)}
    if len(classes) + len(instances) != len(keep):
        raise TypeError("keep_fp32 takes module classes (e.g. RMSNorm) and submodules of the model")
    found = outermost(model, lambda m: isinstance(m, classes) or id(m) in instances)
    if not found:
        raise ValueError(f"keep_fp32 names nothing in {type(model).__name__}: pass the classes of its "
                         "norms (e.g. nn.LayerNorm) or some of its submodules")
    return found


def cast_at_boundaries(module: nn.Module, inputs: torch.dtype, outputs: torch.dtype) -> None:
    """Cast `module`'s floating inputs to `inputs` and its floating outputs to `outputs` (hooks)."""
    module.register_forward_pre_hook(
        lambda m, args, kwargs: (_cast(args, inputs), _cast(kwargs, inputs)), with_kwargs=True)
    module.register_forward_hook(lambda m, args, output: _cast(output, outputs))


def _cast(value: Any, dtype: torch.dtype) -> Any:
    """`value` with every floating tensor in it (through plain tuples, lists and dicts) cast to `dtype`."""
    if isinstance(value, torch.Tensor):
        return value.to(dtype) if value.is_floating_point() else value
    if type(value) in (tuple, list):
        return type(value)(_cast(item, dtype) for item in value)
    if type(value) is dict:
        return {key: _cast(item, dtype) for key, item in value.items()}
    return value
