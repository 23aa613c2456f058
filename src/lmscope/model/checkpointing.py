"""Activation checkpointing of transformer blocks, per block: full, selective, offloaded, or none.

`apply_checkpointing(model, policy)` treats the blocks of a TransformerLM's `layers`;
`checkpoint_blocks(blocks, policy)` does the same for any list of blocks (a transformers model's
decoder layers, a user model's blocks, lmscope's fast blocks). The policy
(`lmscope.accounting.treatments`) gives each block one of:

* **full** (`block`, `every:K`, `blocks:LIST`): the block's forward runs in torch.utils.checkpoint
  (use_reentrant=False): it keeps only its inputs (all its arguments) and the backward runs its
  forward again (same autocast state) before its own backward. About one more forward of work.
* **selective** (`selective[:LIST]`): the outputs of matmuls and attention stay saved; the
  elementwise work is redone in the backward. lmscope's fast block (a block whose class sets
  `rebuilds_cheap_tensors`) names what it can rebuild (`lmscope.model.saved_tensors`): its norms'
  outputs, SwiGLU's activation and the heads' layout copy are saved as recipes over tensors that
  stay saved anyway, so nothing but those elementwise kernels runs again. Other blocks run under
  torch's selective checkpointing: the outputs of mm, addmm, bmm and the SDPA kernels are cached,
  the rest recomputed (their Triton kernels, if any, too: SAC cannot see inside custom Functions).
* **offload** (`offload[:LIST]`, alone or with either of the above): the block's saved activations
  live in host memory between its forward and backward (`lmscope.model.offload`); a fully
  checkpointed block offloads its inputs. One `Offloader` per call serves all the blocks (it
  prefetches a block's activations during the next block's backward).

Values and gradients are those of the untreated blocks (full and SAC recompute the same ops on the
same inputs; recipes rerun the same kernels; offloaded tensors come back bit for bit). Parameter
names and the state dict are unchanged. The return value is the fully checkpointed blocks.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from lmscope.accounting.treatments import FULL, NONE, SELECTIVE, parse_treatments
from lmscope.model.offload import Offloader
from lmscope.model.saved_tensors import BlockFrame

_MARK = "_lmscope_checkpointed"
RECOMPUTE_RANGE = "recompute"
"""torch.profiler range around a checkpointed block's forward rerun in the backward."""
_SAVED_BY_SELECTIVE = ("mm", "addmm", "bmm", "baddbmm", "_scaled_dot_product_flash_attention",
                       "_scaled_dot_product_flash_attention_for_cpu",
                       "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
                       "_flash_attention_forward", "_efficient_attention_forward")
"""aten ops whose outputs torch's selective checkpointing keeps for an eager block."""
_SAC_TAKES_HOOKS = "respect_saved_tensors_hooks" in inspect.signature(checkpoint).parameters
"""Whether torch's selective checkpointing can pass its cache through saved-tensor hooks."""


def apply_checkpointing(model: nn.Module, policy: str) -> tuple[int, ...]:
    """Treat the blocks of `model.layers` as `policy` says; returns the fully checkpointed indices.

    Raises ValueError for an unknown policy or a model that is already treated.
    """
    layers = getattr(model, "layers", None)
    if not isinstance(layers, nn.ModuleList):
        raise ValueError("activation checkpointing needs a model with a `layers` ModuleList of blocks")
    return checkpoint_blocks(layers, policy)


def checkpoint_blocks(layers: Sequence[nn.Module], policy: str) -> tuple[int, ...]:
    """Treat the blocks of `layers` (each called with any arguments) as `policy` says."""
    treatments = parse_treatments(policy, len(layers))
    if any(getattr(block, _MARK, False) for block in layers):
        raise ValueError("the model's blocks are checkpointed already: apply a policy once")
    selective_hooks = [i for i in treatments.selective if i in treatments.offload
                       and not getattr(layers[i], "rebuilds_cheap_tensors", False)]
    if selective_hooks and not _SAC_TAKES_HOOKS:
        raise ValueError("selective with offload on these blocks needs torch's selective checkpointing to "
                         "pass its cache through saved-tensor hooks (a newer torch): drop one of the two")
    offloader = Offloader() if treatments.offload else None
    for index, block in enumerate(layers):
        kind, offloaded = treatments.kind(index), index in treatments.offload
        if kind == NONE and not offloaded:
            continue
        recipes = kind == SELECTIVE and getattr(block, "rebuilds_cheap_tensors", False)
        forward = block.forward
        if kind == FULL:
            forward = _checkpointed(forward)
        elif kind == SELECTIVE and not recipes:
            forward = _checkpointed(forward, selective=True)
        if recipes or offloaded:
            forward = _framed(block, forward, index, recipes, offloader if offloaded else None)
        block.forward = forward
        setattr(block, _MARK, True)
    return treatments.full


def _checkpointed(forward: Callable[..., Any], selective: bool = False) -> Callable[..., Any]:
    """torch.utils.checkpoint around `forward`; its rerun in the backward is a `recompute` range
    (torch.profiler), so a trace shows what recomputing costs. Not under selective checkpointing:
    its cache would have to hold the range's profiler op (an ordered effect), which the forward
    does not run."""
    options: dict[str, Any] = {}
    if selective:
        options["context_fn"] = functools.partial(
            torch.utils.checkpoint.create_selective_checkpoint_contexts, _save_matmuls_and_attention)
        if _SAC_TAKES_HOOKS:  # its cache goes through the surrounding hooks (offload, measurement)
            options["respect_saved_tensors_hooks"] = True
    running = [False]

    def replay(*args: Any, **kwargs: Any) -> Any:
        if running[0] or selective:
            return forward(*args, **kwargs)
        with torch.profiler.record_function(RECOMPUTE_RANGE):
            return forward(*args, **kwargs)

    def run(*args: Any, **kwargs: Any) -> Any:
        running[0] = True
        try:
            return checkpoint(replay, *args, use_reentrant=False, **options, **kwargs)
        finally:
            running[0] = False

    return run


def _saved_ops() -> frozenset:
    aten = torch.ops.aten
    return frozenset(getattr(aten, name).default for name in _SAVED_BY_SELECTIVE if hasattr(aten, name))


def _save_matmuls_and_attention(ctx: Any, func: Any, *args: Any, **kwargs: Any) -> Any:
    """Torch SAC policy: keep the outputs of matmuls and attention, recompute everything else."""
    policy = torch.utils.checkpoint.CheckpointPolicy
    return policy.MUST_SAVE if func in _SAVED_OPS else policy.PREFER_RECOMPUTE


_SAVED_OPS = _saved_ops()


def _framed(block: nn.Module, forward: Callable[..., Any], index: int, recipes: bool,
            offloader: Offloader | None) -> Callable[..., Any]:
    """Run `forward` in a BlockFrame: recipes for cheap tensors and/or offloaded activations."""

    def run(*args: Any, **kwargs: Any) -> Any:
        if not torch.is_grad_enabled():
            return forward(*args, **kwargs)
        offload = offloader.frame(index, block, args, kwargs) if offloader is not None else None
        with BlockFrame(recipes=recipes, offload=offload):
            outputs = forward(*args, **kwargs)
        if offload is not None:
            offload.finish_forward(outputs)
        return outputs

    return run
