"""A custom decoder-only language model, measured by lmscope as ``--model examples/own_lm.py:build``.

The model is plain PyTorch (pre-norm blocks: LayerNorm, causal attention through
``F.scaled_dot_product_attention``, GELU MLP; learned positions; tied embedding and head): the
kind of model someone already has. ``build`` is the factory: it takes the size overrides lmscope
passes (--d-model, --num-layers, --num-heads, --d-ff, --vocab-size; context_length always) and
returns a `lmscope.sources.UserModel`. See docs/own_model.md.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from lmscope.sources import UserModel


class Block(nn.Module):
    """Pre-norm block: x + attention(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, d_model: int, num_heads: int, d_ff: int) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.norm1, self.norm2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, d_ff), nn.GELU(), nn.Linear(d_ff, d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, width = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(batch, seq, 3, self.num_heads, -1).unbind(2)
        attended = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        x = x + self.proj(attended.transpose(1, 2).reshape(batch, seq, width))
        return x + self.mlp(self.norm2(x))


class TinyGPT(nn.Module):
    """Token and position embeddings, `num_layers` blocks, final norm, head tied to the embedding."""

    def __init__(self, *, vocab_size: int, context_length: int, d_model: int, num_layers: int,
                 num_heads: int, d_ff: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab_size, d_model)
        self.positions = nn.Embedding(context_length, d_model)
        self.blocks = nn.ModuleList(Block(d_model, num_heads, d_ff) for _ in range(num_layers))
        self.norm = nn.LayerNorm(d_model)

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(token_ids.shape[1], device=token_ids.device)
        x = self.embed(token_ids) + self.positions(positions)
        for block in self.blocks:
            x = block(x)
        return self.norm(x) @ self.embed.weight.T  # logits (batch, seq, vocab)


def build(*, d_model: int = 768, num_layers: int = 12, num_heads: int = 12, d_ff: int | None = None,
          vocab_size: int = 32_000, context_length: int = 1024) -> UserModel:
    """The factory: the model, random token batches, and next-token cross-entropy."""
    model = TinyGPT(vocab_size=vocab_size, context_length=context_length, d_model=d_model,
                    num_layers=num_layers, num_heads=num_heads, d_ff=d_ff or 4 * d_model)

    def make_batch(batch_size: int, context_length: int, device: torch.device) -> torch.Tensor:
        # one extra token: inputs are tokens[:, :-1], targets tokens[:, 1:]
        return torch.randint(0, vocab_size, (batch_size, context_length + 1), device=device)

    def loss(model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
        logits = model(tokens[:, :-1])
        return F.cross_entropy(logits.float().flatten(0, 1), tokens[:, 1:].flatten())

    return UserModel(model=model, make_batch=make_batch, loss=loss, unit="tokens", blocks=model.blocks)
