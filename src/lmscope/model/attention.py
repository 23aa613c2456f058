"""Causal multi-head self-attention and the registry of attention backends.

A backend is a function `(q, k, v) -> out` on (batch, heads, seq, head_dim) tensors computing
causal softmax(q k^T / sqrt(d)) v. Backends register by name; kernels that need Triton are
imported inside the backend function, so importing the model never touches a GPU compiler.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from lmscope.measure.ranges import phase
from lmscope.model.rope import RotaryEmbedding

AttentionFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]

_BACKENDS: dict[str, AttentionFn] = {}
"""name -> function."""


def register_attention(name: str, fn: AttentionFn) -> None:
    """Add a backend under `name`."""
    _BACKENDS[name] = fn


def attention_backends() -> list[str]:
    """Names of the registered backends."""
    return list(_BACKENDS)


def get_attention(name: str) -> AttentionFn:
    """The backend called `name`; unknown names list the known ones."""
    if name not in _BACKENDS:
        raise ValueError(f"unknown attention backend {name!r}: choose one of {', '.join(_BACKENDS)}")
    return _BACKENDS[name]


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


def sdpa_cudnn_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """torch's scaled_dot_product_attention pinned to cuDNN's fused kernel, causal (CUDA only):
    the fastest backward at long context on Hopper, a peer the fast path can also run on."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def flash_attention_triton(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """lmscope's FlashAttention-2 Triton kernels, causal (imported on first use)."""
    from lmscope.kernels.flash_attention import flash_attention

    return flash_attention(q, k, v, causal=True)


def flash_attention_tiled_torch(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """lmscope's tiled PyTorch FlashAttention-2, causal (slow; it teaches and checks)."""
    from lmscope.kernels.flash_attention_torch import flash_attention_torch

    return flash_attention_torch(q, k, v, causal=True)


register_attention("naive", naive_attention)
register_attention("sdpa", sdpa_attention)
register_attention("sdpa-cudnn", sdpa_cudnn_attention)
register_attention("flash", flash_attention_triton)
register_attention("flash-torch", flash_attention_tiled_torch)


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
