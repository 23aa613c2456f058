"""HF transformers' Llama at the sizes of a ModelConfig: the peer that `bench --peer hf` measures.

Llama is the same architecture as the reference model (pre-norm RMSNorm, RoPE, SwiGLU, no
biases, untied head when asked), so with num_key_value_heads = num_heads the parameter count is
identical; the builder checks that. It differs only in details that cost the same: RoPE rotates
the two halves of each head instead of adjacent pairs, and the init is normal(0, 0.02).
Attention is torch's SDPA (``attn_implementation="sdpa"``). transformers is the optional extra
``lmscope[hf]``.
"""

from __future__ import annotations

import torch
from torch import nn

from lmscope.accounting.flops import parameter_counts
from lmscope.config import ModelConfig


def llama_config_kwargs(config: ModelConfig) -> dict:
    """LlamaConfig arguments that give the reference model's sizes (untied, no biases, SDPA)."""
    return {
        "vocab_size": config.vocab_size,
        "hidden_size": config.d_model,
        "intermediate_size": config.d_ff,
        "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_heads,
        "num_key_value_heads": config.num_heads,
        "max_position_embeddings": config.context_length,
        "rms_norm_eps": 1e-5,
        "rope_theta": config.rope_theta,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "mlp_bias": False,
        "use_cache": False,
        "attn_implementation": "sdpa",
    }


class HFLlamaPeer(nn.Module):
    """transformers' LlamaForCausalLM as `llama`; forward(token_ids) -> logits, like TransformerLM."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        try:
            from transformers import LlamaConfig, LlamaForCausalLM
        except ImportError:
            raise ValueError(
                "--peer hf needs HF transformers: install lmscope[hf] (pip install 'lmscope[hf]')"
            ) from None
        self.config = config
        self.llama = LlamaForCausalLM(LlamaConfig(**llama_config_kwargs(config)))
        ours = parameter_counts(config)["total"]
        theirs = sum(p.numel() for p in self.parameters())
        if theirs != ours:
            raise RuntimeError(f"HF Llama has {theirs:,} parameters, lmscope's model {ours:,}")

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        """Logits (batch, seq, vocab)."""
        return self.llama(input_ids=token_ids).logits
