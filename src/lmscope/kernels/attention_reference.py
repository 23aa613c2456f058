"""Naive (untiled) attention used as the ground truth for the flash-attention kernels.

``attention_reference`` computes in float64 by default and returns both the output O and the
per-row log-sum-exp L = logsumexp_j(q_i . k_j / sqrt(d)), the quantity the flash kernels save for
their backward pass. ``attention_naive`` runs the same formula in the inputs' own dtype (as a
plain PyTorch user would write it); tests use its error against the float64 reference to set
their per-dtype tolerance.

Causal masking is top-left aligned, like ``torch.nn.functional.scaled_dot_product_attention``
with ``is_causal=True``: query i attends keys j <= i, whatever n_queries and n_keys are.
Every query row then sees at least key 0, so no row is empty.

Shapes: q (..., n_queries, d); k, v (..., n_keys, d) with the same leading dims.
"""

from __future__ import annotations

import math

import torch

__all__ = [
    "attention_naive",
    "attention_reference",
    "causal_mask",
    "reference_with_grads",
    "relative_error",
]


def causal_mask(n_queries: int, n_keys: int, device: torch.device | str | None = None) -> torch.Tensor:
    """Boolean (n_queries, n_keys) mask, True where query i may attend key j (j <= i)."""
    i = torch.arange(n_queries, device=device)[:, None]
    j = torch.arange(n_keys, device=device)[None, :]
    return j <= i


def _check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    if q.ndim < 2 or k.ndim != q.ndim or v.ndim != q.ndim:
        raise ValueError(
            f"q, k, v need the same number (>= 2) of dims; got {tuple(q.shape)}, "
            f"{tuple(k.shape)}, {tuple(v.shape)}"
        )
    if k.shape != v.shape or q.shape[:-2] != k.shape[:-2] or q.shape[-1] != k.shape[-1]:
        raise ValueError(
            f"expected q (..., n_queries, d) and k, v (..., n_keys, d); got {tuple(q.shape)}, "
            f"{tuple(k.shape)}, {tuple(v.shape)}"
        )


def attention_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = False,
    dtype: torch.dtype = torch.float64,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return (O, L) computed naively in ``dtype`` (float64 by default).

    O has q's shape and ``dtype``; L has shape (..., n_queries) and ``dtype``. Differentiable,
    so ``torch.autograd.grad`` through it gives reference dQ, dK, dV.
    """
    _check(q, k, v)
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    scale = 1.0 / math.sqrt(q.shape[-1])
    s = torch.matmul(q, k.transpose(-2, -1)) * scale
    if causal:
        s = s.masked_fill(~causal_mask(q.shape[-2], k.shape[-2], q.device), float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse.unsqueeze(-1))
    return torch.matmul(p, v), lse


def attention_naive(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False
) -> torch.Tensor:
    """Naive attention entirely in the inputs' dtype: softmax(q k^T / sqrt(d)) v."""
    _check(q, k, v)
    scale = 1.0 / math.sqrt(q.shape[-1])
    s = torch.matmul(q, k.transpose(-2, -1)) * scale
    if causal:
        s = s.masked_fill(~causal_mask(q.shape[-2], k.shape[-2], q.device), float("-inf"))
    return torch.matmul(torch.softmax(s, dim=-1), v)


def relative_error(x: torch.Tensor, ref: torch.Tensor) -> float:
    """||x - ref|| / ||ref|| in float64 (Frobenius norms); inf if x has a NaN or inf."""
    x64, ref64 = x.detach().double(), ref.detach().double()
    if not torch.isfinite(x64).all():
        return float("inf")
    return ((x64 - ref64).norm() / ref64.norm().clamp_min(1e-300)).item()


def reference_with_grads(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    do: torch.Tensor,
    causal: bool = False,
) -> tuple[torch.Tensor, ...]:
    """(O, L, dQ, dK, dV), all float64, from float64 copies of the inputs.

    The gradients are taken with respect to float64 leaves, so they are not rounded back to the
    inputs' dtype (as autograd would do for low-precision leaves).
    """
    q64, k64, v64 = (t.detach().to(torch.float64).requires_grad_(True) for t in (q, k, v))
    with torch.enable_grad():
        o, lse = attention_reference(q64, k64, v64, causal)
        dq, dk, dv = torch.autograd.grad(o, (q64, k64, v64), do.to(torch.float64))
    return o.detach(), lse.detach(), dq, dk, dv


def check_attention_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """Refuse q (..., n_queries, d), k, v (..., n_keys, d) that do not fit together, or are empty."""
    if q.ndim < 2 or k.ndim != q.ndim or v.ndim != q.ndim:
        raise ValueError(
            "q, k, v need the same number (>= 2) of dims, shaped (..., n, d); got "
            f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    if k.shape != v.shape or q.shape[:-2] != k.shape[:-2] or q.shape[-1] != k.shape[-1]:
        raise ValueError(
            "expected q (..., n_queries, d) and k, v (..., n_keys, d) with equal leading dims and d;"
            f" got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    if q.shape[-2] == 0 or k.shape[-2] == 0 or q.shape[-1] == 0:
        raise ValueError(f"empty sequence or head dim: q {tuple(q.shape)}, k {tuple(k.shape)}")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k, v dtypes differ: {q.dtype}, {k.dtype}, {v.dtype}")
    if q.dtype not in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        raise ValueError(f"unsupported dtype {q.dtype}; use float16, bfloat16, float32 or float64")
