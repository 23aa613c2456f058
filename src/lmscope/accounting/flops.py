"""Parameter counts and FLOPs of the reference Transformer LM.

FLOPs count multiply-adds as 2 and include only matrix products, the convention of the
Chinchilla/PaLM MFU accounting:

* dense matmuls: 2 * N_matmul * tokens forward, where N_matmul are the weights that take part
  in a matmul (attention projections 4*d^2, SwiGLU 3*d*d_ff per layer, LM head d*V); the token
  embedding is a lookup and the RMSNorm gains are elementwise, so neither counts;
* attention: Q K^T and P V are each 2 * T^2 * d per sequence per layer forward (the full square,
  as naive attention computes it; a causal kernel that skips masked tiles does about half);
* backward = 2 x forward, so a training step is 3 x forward: 6 * N_matmul * tokens + 3 x attention.
"""

from __future__ import annotations

from lmscope.config import ModelConfig

MODES = ("forward", "forward-backward", "train-step")
"""What a step runs: forward only; forward + backward; forward + loss + backward + optimizer."""


def parameter_counts(config: ModelConfig) -> dict[str, int]:
    """Parameters by component and their total; equals `sum(p.numel())` of TransformerLM."""
    d, layers = config.d_model, config.num_layers
    counts = {
        "embedding": config.vocab_size * d,
        "attention": layers * 4 * d * d,
        "ffn": layers * 3 * d * config.d_ff,
        "norms": layers * 2 * d + d,
        "lm_head": d * config.vocab_size,
    }
    counts["total"] = sum(counts.values())
    return counts


def matmul_parameters(config: ModelConfig) -> int:
    """Weights that take part in a matrix product (all but the embedding and the norm gains)."""
    counts = parameter_counts(config)
    return counts["attention"] + counts["ffn"] + counts["lm_head"]


def forward_flops(config: ModelConfig, batch_size: int, seq_len: int) -> dict[str, float]:
    """Forward FLOPs of one batch: dense matmuls, attention scores+output, and the total."""
    tokens = batch_size * seq_len
    dense = 2.0 * matmul_parameters(config) * tokens
    attention = config.num_layers * batch_size * 4.0 * seq_len * seq_len * config.d_model
    return {"dense": dense, "attention": attention, "total": dense + attention}


def step_flops(config: ModelConfig, batch_size: int, seq_len: int, mode: str) -> float:
    """FLOPs of one step in `mode`: forward is 1x, with backward 3x the forward FLOPs."""
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}: choose one of {', '.join(MODES)}")
    factor = 1.0 if mode == "forward" else 3.0
    return factor * forward_flops(config, batch_size, seq_len)["total"]
