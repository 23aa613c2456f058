"""A model without a sequence: an MLP classifier, measured as ``--model examples/mlp.py:build``.

Here an item of the batch is a sample, not a token: the factory says ``unit="samples"``, rows
report ``samples_per_s``, and ``--context-length`` is not used (make_batch ignores it). Its own
optimizer (SGD with momentum) replaces lmscope's AdamW, and its hidden layers are the blocks that
``--checkpoint`` may wrap. See docs/own_model.md.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from lmscope.sources import UserModel


def build(*, d_model: int = 4096, num_layers: int = 8, num_classes: int = 1000,
          in_features: int = 1024) -> UserModel:
    """The factory: `num_layers` hidden layers of width `d_model` (--d-model, --num-layers)."""
    hidden = nn.ModuleList(
        nn.Sequential(nn.Linear(in_features if i == 0 else d_model, d_model), nn.GELU())
        for i in range(num_layers)
    )
    model = nn.Sequential(*hidden, nn.Linear(d_model, num_classes))

    def make_batch(batch_size: int, context_length: int, device: torch.device) -> tuple[torch.Tensor, ...]:
        del context_length  # samples have no sequence
        return (torch.randn(batch_size, in_features, device=device),
                torch.randint(0, num_classes, (batch_size,), device=device))

    def loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        features, labels = batch
        return F.cross_entropy(model(features).float(), labels)

    def optimizer(model: nn.Module) -> torch.optim.Optimizer:
        return torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    return UserModel(model=model, make_batch=make_batch, loss=loss, optimizer=optimizer,
                     unit="samples", blocks=list(hidden))
