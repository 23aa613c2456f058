"""`ModelRequest`: the fields of a point that decide which model a source builds (hashable)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

OVERRIDES = ("vocab_size", "d_model", "d_ff", "num_layers", "num_heads")
"""Size overrides (--vocab-size, --d-model, ...): presets and hf configs take them all; a factory
takes those its signature names."""


@dataclass(frozen=True, kw_only=True)
class ModelRequest:
    """Which model to build: the source string, size overrides and the model-shaping options."""

    name: str
    """--model: a preset, hf:<model_type or config.json>, or <module or file.py>:<factory>."""
    vocab_size: int | None = None
    d_model: int | None = None
    d_ff: int | None = None
    num_layers: int | None = None
    num_heads: int | None = None
    context_length: int = 128
    """The model's context length (--model-context-length, default --context-length)."""
    model_context_length: int | None = None
    """--model-context-length when given (an explicit limit)."""
    attention: str = "naive"
    fast: bool = False
    peer: str = "none"
    precision: str = "fp32"
    optimizer_in_backward: bool = False

    @classmethod
    def of(cls, spec: Any) -> ModelRequest:
        """The request of a ModelPointSpec (any object with its fields)."""
        return cls(
            name=spec.size, **{name: getattr(spec, name) for name in OVERRIDES},
            context_length=spec.model_context_length or spec.context_length,
            model_context_length=spec.model_context_length, attention=spec.attention, fast=spec.fast,
            peer=getattr(spec, "peer", "none"), precision=spec.precision,
            optimizer_in_backward=spec.optimizer_in_backward,
        )

    def overrides(self) -> dict[str, int]:
        """The size overrides given (not None)."""
        return {name: value for name in OVERRIDES if (value := getattr(self, name)) is not None}
