"""Parameter counts and FLOPs of the reference Transformer LM.

FLOPs count multiply-adds as 2 and include only matrix products, the convention of the
Chinchilla/PaLM MFU accounting:

* dense matmuls: 2 * N_matmul * tokens forward, where N_matmul are the weights that take part
  in a matmul (attention projections 4*d^2, SwiGLU 3*d*d_ff per layer, LM head d*V); the token
  embedding is a lookup and the RMSNorm gains are elementwise, so neither counts;
* attention: Q K^T and P V are each 2 * P * d per sequence per layer forward, where P are the
  (query, key) pairs a causal model attends: P = T (T + 1) / 2, half the square and its diagonal
  (`causal_pairs`). These are model FLOPs: what a causal kernel that skips masked tiles must at
  least compute. Naive attention computes the full T x T square and masks half of it away; that
  hardware count is `full_square=True`, never the MFU convention;
* backward = 2 x forward, so a training step is 3 x forward: 6 * N_matmul * tokens + 3 x attention.

MFU is model FLOPs of the whole step (train-step: forward, backward and optimizer, which does no
matmul) over its measured time: the headline of every table. A forward+backward MFU (the step's
FLOPs over the forward and backward phases' time only) is labelled "fwd+bwd MFU" wherever shown.
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


def causal_pairs(n_queries: int, n_keys: int) -> int:
    """Unmasked (query, key) pairs of top-left causal attention: sum_i min(i + 1, n_keys)."""
    if n_queries <= n_keys:
        return n_queries * (n_queries + 1) // 2
    return n_keys * (n_keys + 1) // 2 + (n_queries - n_keys) * n_keys


def attention_pairs(seq_len: int, full_square: bool = False) -> int:
    """(query, key) pairs one head of one sequence attends: causal (model FLOPs), or the full square."""
    return seq_len * seq_len if full_square else causal_pairs(seq_len, seq_len)


def forward_flops(
    config: ModelConfig, batch_size: int, seq_len: int, *, full_square: bool = False
) -> dict[str, float]:
    """Forward FLOPs of one batch: dense matmuls, attention scores+output, and the total.

    Attention counts the causal pairs (model FLOPs); `full_square` counts the T x T square that
    naive attention computes instead.
    """
    tokens = batch_size * seq_len
    dense = 2.0 * matmul_parameters(config) * tokens
    pairs = attention_pairs(seq_len, full_square)
    attention = config.num_layers * batch_size * 4.0 * pairs * config.d_model
    return {"dense": dense, "attention": attention, "total": dense + attention}


def forward_flops_by_component(
    config: ModelConfig, batch_size: int, seq_len: int, *, full_square: bool = False
) -> dict[str, float]:
    """Forward FLOPs split by the matmuls that do them; the values add up to `forward_flops` total.

    attention_proj: Q, K, V and output projections; attention_scores: Q K^T; attention_values: P V
    (both over the causal pairs, or the full square with `full_square`); ffn: the three SwiGLU
    matmuls; lm_head: the vocabulary projection.
    """
    d, layers, tokens = config.d_model, config.num_layers, batch_size * seq_len
    scores = 2.0 * layers * batch_size * attention_pairs(seq_len, full_square) * d
    return {
        "attention_proj": 2.0 * layers * 4 * d * d * tokens,
        "attention_scores": scores,
        "attention_values": scores,
        "ffn": 2.0 * layers * 3 * d * config.d_ff * tokens,
        "lm_head": 2.0 * d * config.vocab_size * tokens,
    }


def phase_flops(config: ModelConfig, batch_size: int, seq_len: int, mode: str) -> dict[str, float]:
    """FLOPs of each phase of a step: forward, backward (2x forward, 0 in forward mode), step."""
    step = step_flops(config, batch_size, seq_len, mode)
    forward = forward_flops(config, batch_size, seq_len)["total"]
    return {"forward": forward, "backward": step - forward, "step": step}


def step_flops(
    config: ModelConfig, batch_size: int, seq_len: int, mode: str, *, full_square: bool = False
) -> float:
    """FLOPs of one step in `mode`: forward is 1x, with backward 3x the forward FLOPs."""
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}: choose one of {', '.join(MODES)}")
    factor = 1.0 if mode == "forward" else 3.0
    return factor * forward_flops(config, batch_size, seq_len, full_square=full_square)["total"]


def mfu(flops: float, ms: float, peak_tflops: float | None) -> float | None:
    """Model FLOPs utilization: `flops` done in `ms` against a dense peak (None without a peak)."""
    if not peak_tflops or not ms:
        return None
    return flops / (ms / 1e3) / 1e12 / peak_tflops
