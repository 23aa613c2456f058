"""The saved-tensor contract of the FlashAttention Functions (docs/kernels/flash_attention.md,
"Contract"): among the tensors the forward saves there is exactly one log-sum-exp tensor
L = logsumexp(q k^T / sqrt(d)) of shape (..., n_queries), float32, which a harness such as the
CS336 handout's finds by shape in ``o.grad_fn.saved_tensors``."""

from __future__ import annotations

import math

import torch


def lse_reference(q: torch.Tensor, k: torch.Tensor, causal: bool) -> torch.Tensor:
    """The float64 log-sum-exp of the scaled scores per query (top-left causal mask)."""
    scores = q.double() @ k.double().transpose(-2, -1) / math.sqrt(q.shape[-1])
    if causal:
        n_q, n_k = scores.shape[-2:]
        above = torch.ones(n_q, n_k, dtype=torch.bool, device=scores.device).triu(1)
        scores = scores.masked_fill(above, float("-inf"))
    return torch.logsumexp(scores, dim=-1)


def the_saved_lse(saved: tuple[torch.Tensor, ...], q: torch.Tensor) -> torch.Tensor:
    """The one saved tensor of shape (..., n_queries); fails unless there is exactly one."""
    matches = [t for t in saved if t is not None and t.shape == q.shape[:-1]]
    shapes = [None if t is None else tuple(t.shape) for t in saved]
    assert len(matches) == 1, f"want one saved tensor of shape {tuple(q.shape[:-1])}, saved: {shapes}"
    return matches[0]


def assert_saves_lse(saved: tuple[torch.Tensor, ...], q: torch.Tensor, k: torch.Tensor, causal: bool,
                     dtype: torch.dtype = torch.float32, atol: float = 1e-4) -> None:  # fmt: skip
    """``saved`` (the forward's saved tensors) holds exactly one (..., n_queries) tensor, of
    ``dtype``, equal to the float64 log-sum-exp within ``atol``."""
    lse = the_saved_lse(saved, q)
    assert lse.dtype == dtype, lse.dtype
    error = (lse.double() - lse_reference(q, k, causal)).abs().max().item()
    assert error < atol, f"saved L differs from the float64 log-sum-exp by {error:.2e}"
