"""Causal multi-head self-attention and the registry of attention backends.

A backend is a function `(q, k, v) -> out` on (batch, heads, seq, head_dim) tensors computing
causal softmax(q k^T / sqrt(d)) v. Backends register by name; kernels that need Triton are
imported only when first used, so importing the model never touches a GPU compiler.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from lmscope.measure.ranges import phase
from lmscope.model.rope import RotaryEmbedding

AttentionFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]

_BACKENDS: dict[str, AttentionFn | str] = {}
"""name -> function, or 'module:function' resolved on first use."""


def register_attention(name: str, fn: AttentionFn | str) -> None:
    """Add a backend: a function, or a lazy 'package.module:function' path."""
    _BACKENDS[name] = fn


def attention_backends() -> list[str]:
    """Names of the registered backends."""
    return list(_BACKENDS)


def get_attention(name: str) -> AttentionFn:
    """The backend called `name`; unknown names list the known ones."""
    if name not in _BACKENDS:
        raise ValueError(f"unknown attention backend {name!r}: choose one of {', '.join(_BACKENDS)}")
    fn = _BACKENDS[name]
    if isinstance(fn, str):
        module, attr = fn.split(":")
        fn = getattr(importlib.import_module(module), attr)
        _BACKENDS[name] = fn
    return fn


def naive_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Scores -> causal mask -> softmax -> output matmul, each step in its own named range."""
    seq = q.shape[-2]
    with phase("attention/scores"):
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    with phase("attention/mask"):
        future = torch.triu(torch.ones(seq, seq, dtype=torch.bool, device=q.device), diagonal=1)
        scores = scores.masked_fill(future, float("-inf"))
    with phase("attention/softmax"):
        probs = torch.softmax(scores, dim=-1)
    with phase("attention/output"):
        return probs @ v


def sdpa_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """torch's scaled_dot_product_attention, causal; torch picks its fastest kernel."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


register_attention("naive", naive_attention)
register_attention("sdpa", sdpa_attention)
register_attention("flash", "lmscope.kernels.flash_attention:causal_flash_attention")
register_attention("flash-torch", "lmscope.kernels.flash_attention_torch:causal_flash_attention_torch")


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention with RoPE on queries and keys, no biases."""

    def __init__(self, d_model: int, num_heads: int, rope: RotaryEmbedding, backend: str) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.q_proj = nn.Linear(d_model, d_model, bias=False)
        self.k_proj = nn.Linear(d_model, d_model, bias=False)
        self.v_proj = nn.Linear(d_model, d_model, bias=False)
        self.output_proj = nn.Linear(d_model, d_model, bias=False)
        self.rope = rope
        self.backend = backend
        self._attend = get_attention(backend)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        return x.view(batch, seq, self.num_heads, -1).transpose(1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, d_model = x.shape
        q = self.rope(self._heads(self.q_proj(x)))
        k = self.rope(self._heads(self.k_proj(x)))
        v = self._heads(self.v_proj(x))
        out = self._attend(q, k, v)
        return self.output_proj(out.transpose(1, 2).reshape(batch, seq, d_model))
