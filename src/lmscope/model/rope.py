"""Rotary position embedding (RoPE) on adjacent pairs of features."""

from __future__ import annotations

import torch
from torch import nn


class RotaryEmbedding(nn.Module):
    """Rotates feature pairs (2i, 2i+1) of position p by angle p * theta^(-2i/d).

    The cos/sin tables are buffers that are not saved in the state dict; they are built in fp32
    and applied in the input's dtype.
    """

    def __init__(self, head_dim: int, max_seq_len: int, theta: float = 10_000.0) -> None:
        super().__init__()
        if head_dim % 2:
            raise ValueError(f"RoPE needs an even head dimension, got {head_dim}")
        inv_freq = theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
        angles = torch.outer(torch.arange(max_seq_len, dtype=torch.float32), inv_freq)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, x: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        """Rotate x (..., seq, head_dim); positions default to 0..seq-1."""
        seq = x.shape[-2]
        cos = self.cos[:seq] if positions is None else self.cos[positions]
        sin = self.sin[:seq] if positions is None else self.sin[positions]
        cos, sin = cos.to(x.dtype), sin.to(x.dtype)
        even, odd = x[..., 0::2], x[..., 1::2]
        rotated = torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1)
        return rotated.flatten(-2)
