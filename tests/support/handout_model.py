"""A Transformer LM built the way the CS336 handout has students build it: its own Linear,
Embedding and RMSNorm classes (not torch's), SwiGLU registering w1, w2, w3 but running w1, w3,
w2, and a causal attention written out by hand. Tiny, for CPU tests of FSDP's class policies."""

from __future__ import annotations

import math

import torch
from torch import nn


class Linear(nn.Module):
    """y = x W^T, no bias (the handout's Linear)."""

    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__()
        std = math.sqrt(2 / (in_features + out_features))
        self.weight = nn.Parameter(nn.init.trunc_normal_(torch.empty(out_features, in_features), std=std,
                                                         a=-3 * std, b=3 * std))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.einsum("...i,oi->...o", x, self.weight)


class Embedding(nn.Module):
    """Rows of a (vocab, dim) table."""

    def __init__(self, num_embeddings: int, embedding_dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(nn.init.trunc_normal_(torch.empty(num_embeddings, embedding_dim),
                                                         a=-3, b=3))

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        return self.weight[token_ids]


class RMSNorm(nn.Module):
    """x / rms(x) * gain in fp32, returned in the input dtype; the gain starts away from one."""

    def __init__(self, d_model: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(1 + 0.1 * torch.randn(d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        rms = torch.sqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (x32 / rms * self.weight).to(x.dtype)


class SwiGLU(nn.Module):
    """w2(silu(w1 x) * w3 x): registered w1, w2, w3; run w1, w3, w2."""

    def __init__(self, d_model: int, d_ff: int) -> None:
        super().__init__()
        self.w1 = Linear(d_model, d_ff)
        self.w2 = Linear(d_ff, d_model)
        self.w3 = Linear(d_model, d_ff)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = self.w1(x)
        return self.w2(gate * torch.sigmoid(gate) * self.w3(x))


class CausalAttention(nn.Module):
    """Multi-head causal softmax attention, written out."""

    def __init__(self, d_model: int, num_heads: int) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.q_proj, self.k_proj, self.v_proj = (Linear(d_model, d_model) for _ in range(3))
        self.output_proj = Linear(d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        *batch, seq, d_model = x.shape
        heads = [p(x).view(*batch, seq, self.num_heads, -1).transpose(-3, -2)
                 for p in (self.q_proj, self.k_proj, self.v_proj)]
        q, k, v = heads
        scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
        future = torch.ones(seq, seq, dtype=torch.bool, device=x.device).triu(1)
        weights = torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1)
        return self.output_proj((weights @ v).transpose(-3, -2).reshape(*batch, seq, d_model))


class Block(nn.Module):
    """Pre-norm: x + attn(ln1(x)), then + ffn(ln2(.))."""

    def __init__(self, d_model: int, num_heads: int, d_ff: int) -> None:
        super().__init__()
        self.ln1 = RMSNorm(d_model)
        self.attn = CausalAttention(d_model, num_heads)
        self.ln2 = RMSNorm(d_model)
        self.ffn = SwiGLU(d_model, d_ff)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.ffn(self.ln2(x))


class HandoutLM(nn.Module):
    """Embedding, blocks, final RMSNorm, LM head: token ids -> logits."""

    def __init__(self, vocab_size: int = 31, d_model: int = 12, num_heads: int = 2, d_ff: int = 19,
                 num_layers: int = 2) -> None:
        super().__init__()
        self.token_embeddings = Embedding(vocab_size, d_model)
        self.layers = nn.ModuleList(Block(d_model, num_heads, d_ff) for _ in range(num_layers))
        self.ln_final = RMSNorm(d_model)
        self.lm_head = Linear(d_model, vocab_size)

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        x = self.token_embeddings(token_ids)
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(self.ln_final(x))
