"""The tensors inside a module's arguments or outputs, however they are nested.

Hooks around a module (FSDP's pre-backward, activation offload's prefetch and the storages it
leaves alone) look at every tensor a forward takes or returns: a tensor, or tensors in lists,
tuples and dicts (a transformers ModelOutput is a dict), nested to any depth.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch


def tensors_in(value: Any) -> Iterator[torch.Tensor]:
    """The tensors in `value`: itself, or those in its list, tuple or dict items, depth first."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from tensors_in(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from tensors_in(item)
