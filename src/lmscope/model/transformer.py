"""The reference "basics" Transformer LM of the CS336 systems study.

Token embedding, `num_layers` pre-norm blocks (RMSNorm -> causal MHA with RoPE -> residual;
RMSNorm -> SwiGLU -> residual), final RMSNorm, untied LM head, no biases.
"""

from __future__ import annotations

import torch
from torch import nn

from lmscope.config import ModelConfig
from lmscope.model.attention import CausalSelfAttention
from lmscope.model.rope import RotaryEmbedding


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * gain, computed in fp32 and returned in the input dtype."""

    def __init__(self, d_model: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (normed * self.weight).to(x.dtype)


class SwiGLU(nn.Module):
    """w2(silu(w1 x) * w3 x), no biases."""

    def __init__(self, d_model: int, d_ff: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(d_model, d_ff, bias=False)
        self.w2 = nn.Linear(d_ff, d_model, bias=False)
        self.w3 = nn.Linear(d_model, d_ff, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(nn.functional.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    """Pre-norm block: x + attn(norm(x)), then + ffn(norm(.))."""

    def __init__(self, config: ModelConfig, rope: RotaryEmbedding, attention: str) -> None:
        super().__init__()
        self.ln1 = RMSNorm(config.d_model)
        self.attn = CausalSelfAttention(config.d_model, config.num_heads, rope, attention)
        self.ln2 = RMSNorm(config.d_model)
        self.ffn = SwiGLU(config.d_model, config.d_ff)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.ffn(self.ln2(x))


class TransformerLM(nn.Module):
    """Decoder-only LM: token ids (batch, seq) -> logits (batch, seq, vocab)."""

    block_class: type[TransformerBlock] = TransformerBlock
    """The block each layer is (a subclass may run the same parameters another way)."""

    def __init__(self, config: ModelConfig, attention: str = "naive") -> None:
        super().__init__()
        self.config = config
        rope = RotaryEmbedding(config.head_dim, config.context_length, config.rope_theta)
        self.token_embeddings = nn.Embedding(config.vocab_size, config.d_model)
        self.layers = nn.ModuleList(
            self.block_class(config, rope, attention) for _ in range(config.num_layers)
        )
        self.ln_final = RMSNorm(config.d_model)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Truncated-normal init: linear std sqrt(2/(fan_in+fan_out)), embedding std 1."""
        for module in self.modules():
            if isinstance(module, nn.Linear):
                fan_out, fan_in = module.weight.shape
                std = (2.0 / (fan_in + fan_out)) ** 0.5
                nn.init.trunc_normal_(module.weight, std=std, a=-3 * std, b=3 * std)
            elif isinstance(module, nn.Embedding):
                nn.init.trunc_normal_(module.weight, std=1.0, a=-3.0, b=3.0)

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        seq = token_ids.shape[-1]
        if seq > self.config.context_length:
            raise ValueError(
                f"sequence length {seq} exceeds the model's context_length "
                f"{self.config.context_length}: build the model with a larger context_length"
            )
        x = self.token_embeddings(token_ids)
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(self.ln_final(x))
