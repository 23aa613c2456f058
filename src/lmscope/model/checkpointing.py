"""Activation checkpointing of transformer blocks: keep a block's input, recompute the rest in backward.

`apply_checkpointing(model, policy)` wraps the forward of the chosen blocks of a TransformerLM in
torch.utils.checkpoint (use_reentrant=False); `checkpoint_blocks(blocks, policy)` does the same for
any list of blocks (a transformers model's decoder layers, a user model's blocks). The forward
keeps only each checkpointed block's input (all its arguments), and the backward runs that
block's forward again (under the same autocast state) before its own backward. Memory goes down
by what the blocks would have saved; the step does about one more forward's worth of work.
Parameter names and the state dict are unchanged.

Policies (see `lmscope.accounting.memory.checkpointed_blocks`): none, block (every block), every:K
(blocks 0, K, 2K, ...: a dial between the two).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from torch import nn
from torch.utils.checkpoint import checkpoint

from lmscope.accounting.memory import checkpointed_blocks

_MARK = "_lmscope_checkpointed"


def apply_checkpointing(model: nn.Module, policy: str) -> tuple[int, ...]:
    """Checkpoint the blocks of `model.layers` chosen by `policy`; returns their indices.

    Raises ValueError for an unknown policy or a model that is already checkpointed.
    """
    layers = getattr(model, "layers", None)
    if not isinstance(layers, nn.ModuleList):
        raise ValueError("activation checkpointing needs a model with a `layers` ModuleList of blocks")
    return checkpoint_blocks(layers, policy)


def checkpoint_blocks(layers: Sequence[nn.Module], policy: str) -> tuple[int, ...]:
    """Checkpoint the blocks of `layers` chosen by `policy` (each called with any arguments)."""
    chosen = checkpointed_blocks(policy, len(layers))
    if any(getattr(block, _MARK, False) for block in layers):
        raise ValueError("the model's blocks are checkpointed already: apply a policy once")
    for index in chosen:
        block = layers[index]
        block.forward = _checkpointed(block.forward)
        setattr(block, _MARK, True)
    return chosen


def _checkpointed(forward: Callable[..., Any]) -> Callable[..., Any]:
    def run(*args: Any, **kwargs: Any) -> Any:
        return checkpoint(forward, *args, use_reentrant=False, **kwargs)

    return run
