"""What a model source hands every workload: `UserModel` (the factory contract) and `ModelSource`.

A source (a preset, a transformers config, a user's factory) resolves to one `ModelSource`;
`ModelSource.build(device)` makes a `UserModel`: the model on the device, how to make a batch,
the loss, optionally the optimizer and the blocks that activation checkpointing may wrap.
Workloads read only these two objects and never ask which kind of source it was.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from lmscope.config import ModelConfig

UNITS = ("tokens", "samples")
"""What one item of a batch is: tokens (batch_size x context_length per step) or samples
(batch_size per step; the model has no sequence)."""


@dataclass(frozen=True, kw_only=True)
class UserModel:
    """A model and its training step, as a factory returns it (see docs/own_model.md).

    lmscope runs a step as: ``batch = make_batch(batch_size, context_length, device)`` once,
    then per step ``loss(model, batch).backward()`` and the optimizer, under the point's
    autocast (``--precision``); ``model`` may be the torch.compile'd module (``--compile on``).
    """

    model: nn.Module
    """The model; lmscope moves it to the point's device (the factory runs under that device)."""
    make_batch: Callable[[int, int, torch.device], Any]
    """(batch_size, context_length, device) -> a batch, any object ``loss`` accepts."""
    loss: Callable[[nn.Module, Any], torch.Tensor]
    """(model, batch) -> a scalar loss tensor: the forward of a step."""
    optimizer: Callable[[nn.Module], torch.optim.Optimizer] | None = None
    """model -> optimizer; None: lmscope's AdamW (lr 1e-4, fused on CUDA), as for its presets."""
    unit: str = "tokens"
    """tokens (rows report tokens_per_s) or samples (samples_per_s; context_length is unused)."""
    blocks: Sequence[nn.Module] | None = None
    """Modules that --checkpoint may wrap in torch.utils.checkpoint; None: refuse --checkpoint."""
    forward: Callable[[nn.Module, Any], Any] | None = None
    """(model, batch) -> output for --mode forward (run under no_grad); None: the loss."""

    def __post_init__(self) -> None:
        if not isinstance(self.model, nn.Module):
            raise ValueError(f"UserModel.model must be a torch.nn.Module, got {type(self.model).__name__}")
        for name in ("make_batch", "loss"):
            value = getattr(self, name)
            if not callable(value):
                raise ValueError(f"UserModel.{name} must be callable, got {type(value).__name__}")
        for name in ("optimizer", "forward"):
            value = getattr(self, name)
            if value is not None and not callable(value):
                raise ValueError(f"UserModel.{name} must be callable or None, got {type(value).__name__}")
        if self.unit not in UNITS:
            raise ValueError(f"UserModel.unit must be one of {', '.join(UNITS)}, got {self.unit!r}")
        if self.blocks is not None and not (
            isinstance(self.blocks, Sequence | nn.ModuleList)
            and all(isinstance(block, nn.Module) for block in self.blocks)
        ):
            raise ValueError("UserModel.blocks must be a list (or nn.ModuleList) of nn.Modules, or None")

    def run_forward(self, model: nn.Module, batch: Any) -> Any:
        """The forward of --mode forward: `forward` when given, else the loss."""
        return (self.forward or self.loss)(model, batch)


@dataclass(frozen=True, kw_only=True)
class ModelSource:
    """A resolved model source: what it is, and how to build its `UserModel` on a device."""

    name: str
    """The source as given (--model): a preset, hf:<model_type|config.json>, or module:factory."""
    kind: str
    """preset | hf | factory: said in rows; workloads never branch on it."""
    unit: str
    """tokens | samples."""
    build: Callable[[torch.device], UserModel]
    """Build the model and its step on a device (seeded by the caller)."""
    config: ModelConfig | None = None
    """The reference model's config for presets (analytic FLOPs and memory); None otherwise."""
    blocks: int | None = None
    """How many blocks --checkpoint can wrap; None: the model exposes none."""
    has_optimizer: bool = False
    """Whether the source brings its own optimizer (else lmscope's AdamW)."""
    row_fields: Mapping[str, Any] = field(default_factory=dict)
    """Fields every row of this source carries (fast_replaced: which modules --fast replaced)."""
    context_limit: int | None = None
    """Longest sequence the model accepts, where it has one."""
    adjusted: tuple[str, ...] = ()
    """Config fields the source moved with the size overrides, one note each (rows say them as
    overrides_adjusted): e.g. the key/value heads of a grouped-query config under --num-heads."""

    def facts(self) -> dict[str, Any]:
        """What a row says about the model's source: its kind, its unit, its own fields
        (`row_fields`) and any adjusted fields."""
        facts: dict[str, Any] = {"model_source": self.kind, "unit": self.unit, **self.row_fields}
        if self.adjusted:
            facts["overrides_adjusted"] = "; ".join(self.adjusted)
        return facts
