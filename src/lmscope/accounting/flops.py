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


def forward_flops_by_component(config: ModelConfig, batch_size: int, seq_len: int) -> dict[str, float]:
    """Forward FLOPs split by the matmuls that do them; the values add up to `forward_flops` total.

    attention_proj: Q, K, V and output projections; attention_scores: Q K^T; attention_values: P V;
    ffn: the three SwiGLU matmuls; lm_head: the vocabulary projection.
    """
    d, layers, tokens = config.d_model, config.num_layers, batch_size * seq_len
    square = 2.0 * layers * batch_size * seq_len * seq_len * d
    return {
        "attention_proj": 2.0 * layers * 4 * d * d * tokens,
        "attention_scores": square,
        "attention_values": square,
        "ffn": 2.0 * layers * 3 * d * config.d_ff * tokens,
        "lm_head": 2.0 * d * config.vocab_size * tokens,
    }


def phase_flops(config: ModelConfig, batch_size: int, seq_len: int, mode: str) -> dict[str, float]:
    """FLOPs of each phase of a step: forward, backward (2x forward, 0 in forward mode), step."""
    step = step_flops(config, batch_size, seq_len, mode)
    forward = forward_flops(config, batch_size, seq_len)["total"]
    return {"forward": forward, "backward": step - forward, "step": step}


def step_flops(config: ModelConfig, batch_size: int, seq_len: int, mode: str) -> float:
    """FLOPs of one step in `mode`: forward is 1x, with backward 3x the forward FLOPs."""
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}: choose one of {', '.join(MODES)}")
    factor = 1.0 if mode == "forward" else 3.0
    return factor * forward_flops(config, batch_size, seq_len)["total"]
