"""Factories for the model-source tests, imported as a module (`own_models:<factory>`)."""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F
from torch import nn

from lmscope.sources import UserModel

NOT_A_FUNCTION = 3


def regression(*, d_model: int = 8) -> UserModel:
    """A linear regression in samples: batch (x, y), mean squared error; no blocks."""
    model = nn.Linear(d_model, 1)

    def make_batch(batch_size: int, context_length: int, device: torch.device) -> tuple[torch.Tensor, ...]:
        return torch.randn(batch_size, d_model, device=device), torch.randn(batch_size, 1, device=device)

    def loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        return F.mse_loss(model(batch[0]), batch[1])

    return UserModel(model=model, make_batch=make_batch, loss=loss, unit="samples")


def raises() -> UserModel:
    raise RuntimeError("the checkpoint shard is missing")


def wrong_type() -> nn.Module:
    return nn.Linear(2, 2)


def bad_unit() -> UserModel:
    return UserModel(model=nn.Linear(2, 2), make_batch=lambda *a: None, loss=lambda m, b: None, unit="pixels")


def needs_cuda() -> UserModel:
    """Fails on the meta device (reads a value), works on the CPU: the check falls back to it."""
    model = nn.Linear(4, 4)
    if float(model.weight.detach().abs().sum()) < 0:
        raise AssertionError
    return regression(d_model=4)


def too_big() -> UserModel:
    """Checks fine on the meta device; building it for real runs out of memory (an `oom` row)."""
    if torch.get_default_device().type != "meta":
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 80.00 GiB")
    return regression()


def exits() -> UserModel:
    """Ends the process instead of returning a model."""
    sys.exit(3)


def exits_on_the_device() -> UserModel:
    """Checks fine on the meta device; built for real (in the worker), it ends the process."""
    if torch.get_default_device().type != "meta":
        sys.exit(3)
    return regression()
