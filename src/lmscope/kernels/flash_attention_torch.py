"""FlashAttention-2 tiled in plain PyTorch: forward and backward, CPU or GPU.

The algorithm of the Triton kernels in ``flash_attention/triton_kernels.py``, written with torch
tensor ops so it can be read, stepped through and run anywhere:

- forward: for each query tile, loop over key tiles keeping a running row maximum ``m``, a
  running denominator ``l`` and an unnormalised output accumulator (online softmax); the output
  is ``acc / l`` and the saved log-sum-exp is ``L = m + log(l)`` (natural log);
- backward: recompute the probabilities ``P = exp(S - L)`` tile by tile from Q, K and L, with
  ``D = rowsum(dO * O)`` precomputed, so no (n_queries, n_keys) matrix is ever stored. For each
  key tile the loop over query tiles accumulates dK and dV, and adds into dQ.

Shapes: q (..., n_queries, d), k and v (..., n_keys, d) with identical leading dims (batch,
heads, or none); leading dims are flattened internally. n_queries may differ from n_keys, and
neither needs to be a multiple of the tile size.

Causal: query i attends keys j <= i, the top-left convention of
``torch.nn.functional.scaled_dot_product_attention(is_causal=True)``, also when
n_queries != n_keys. Key tiles entirely above the diagonal are skipped; only tiles that cross it
are masked.

Dtypes: float16, bfloat16, float32 compute in float32 (the output is cast back to the input
dtype); float64 computes in float64 (for gradcheck). The saved L is float32 (float64 for float64
inputs), shape (..., n_queries).

Caveats: a reference implementation, not a fast one. Tiles are processed by Python loops over
(n_queries / block_q) * (n_keys / block_k) steps, each a batched matmul over all heads at once;
memory is O(n * d) per head plus one (block_q, block_k) tile per head.
"""

from __future__ import annotations

import math

import torch

from lmscope.kernels.attention_reference import check_attention_inputs

__all__ = [
    "FlashAttentionTorch",
    "flash_attention_torch",
    "flash_attention_torch_backward",
    "flash_attention_torch_forward",
]

DEFAULT_BLOCK_Q = 64
DEFAULT_BLOCK_K = 64


def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _flat(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(..., n, d) -> (batch*heads, n, d) in ``dtype``."""
    return x.reshape(-1, x.shape[-2], x.shape[-1]).to(dtype)


def _diag_mask(qs: int, qe: int, ks: int, ke: int, device: torch.device) -> torch.Tensor | None:
    """True where key j > query i inside the tile [qs, qe) x [ks, ke); None if no such pair."""
    if ke - 1 <= qs:
        return None
    i = torch.arange(qs, qe, device=device)[:, None]
    j = torch.arange(ks, ke, device=device)[None, :]
    return j > i


def flash_attention_torch_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = False,
    block_q: int = DEFAULT_BLOCK_Q,
    block_k: int = DEFAULT_BLOCK_K,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Tiled forward pass. Returns (O in q's dtype, L of shape (..., n_queries))."""
    check_attention_inputs(q, k, v)
    if block_q < 1 or block_k < 1:
        raise ValueError(f"tile sizes must be positive; got block_q={block_q}, block_k={block_k}")
    acc = _acc_dtype(q.dtype)
    lead, n_q, d = q.shape[:-2], q.shape[-2], q.shape[-1]
    n_k = k.shape[-2]
    qf, kf, vf = _flat(q, acc), _flat(k, acc), _flat(v, acc)
    bh = qf.shape[0]
    scale = 1.0 / math.sqrt(d)
    out = torch.empty(bh, n_q, d, dtype=acc, device=q.device)
    lse = torch.empty(bh, n_q, dtype=acc, device=q.device)
    for qs in range(0, n_q, block_q):
        qe = min(qs + block_q, n_q)
        qi = qf[:, qs:qe]
        m_i = torch.full((bh, qe - qs), float("-inf"), dtype=acc, device=q.device)
        l_i = torch.zeros((bh, qe - qs), dtype=acc, device=q.device)
        acc_i = torch.zeros((bh, qe - qs, d), dtype=acc, device=q.device)
        # Causal: the last query of the tile is qe - 1, so keys >= qe are never attended.
        k_end = min(n_k, qe) if causal else n_k
        for ks in range(0, k_end, block_k):
            ke = min(ks + block_k, k_end)
            s = torch.matmul(qi, kf[:, ks:ke].transpose(1, 2)) * scale
            if causal:
                mask = _diag_mask(qs, qe, ks, ke, q.device)
                if mask is not None:
                    s = s.masked_fill(mask, float("-inf"))
            # Key 0 is visible to every row, so m_new is finite from the first tile on.
            m_new = torch.maximum(m_i, s.amax(dim=-1))
            p = torch.exp(s - m_new.unsqueeze(-1))
            alpha = torch.exp(m_i - m_new)
            l_i = alpha * l_i + p.sum(dim=-1)
            acc_i = alpha.unsqueeze(-1) * acc_i + torch.matmul(p, vf[:, ks:ke])
            m_i = m_new
        out[:, qs:qe] = acc_i / l_i.unsqueeze(-1)
        lse[:, qs:qe] = m_i + torch.log(l_i)
    return out.to(q.dtype).reshape(*lead, n_q, d), lse.reshape(*lead, n_q)


def flash_attention_torch_backward(
    do: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    o: torch.Tensor,
    lse: torch.Tensor,
    causal: bool = False,
    block_q: int = DEFAULT_BLOCK_Q,
    block_k: int = DEFAULT_BLOCK_K,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Tiled backward by recomputation. Returns (dQ, dK, dV) in the inputs' dtype."""
    acc = _acc_dtype(q.dtype)
    lead, n_q, d = q.shape[:-2], q.shape[-2], q.shape[-1]
    n_k = k.shape[-2]
    qf, kf, vf = _flat(q, acc), _flat(k, acc), _flat(v, acc)
    dof, of = _flat(do, acc), _flat(o, acc)
    lf = lse.reshape(-1, n_q).to(acc)
    scale = 1.0 / math.sqrt(d)
    # D_i = rowsum(dO_i * O_i) = sum_j P_ij dP_ij. dS = P * (dP - D) cancels when dP ~ D, so D
    # is summed in float64: an O(n d) op that keeps fp32 gradients as accurate as PyTorch's own.
    delta = (dof.to(torch.float64) * of.to(torch.float64)).sum(dim=-1).to(acc)
    dq = torch.zeros_like(qf)
    dk = torch.zeros_like(kf)
    dv = torch.zeros_like(vf)
    for ks in range(0, n_k, block_k):
        ke = min(ks + block_k, n_k)
        kj, vj = kf[:, ks:ke], vf[:, ks:ke]
        dk_j = torch.zeros_like(kj)
        dv_j = torch.zeros_like(vj)
        # Causal: keys >= ks are attended only by queries i >= ks.
        q_start = (ks // block_q) * block_q if causal else 0
        for qs in range(q_start, n_q, block_q):
            qe = min(qs + block_q, n_q)
            qi, doi = qf[:, qs:qe], dof[:, qs:qe]
            s = torch.matmul(qi, kj.transpose(1, 2)) * scale
            p = torch.exp(s - lf[:, qs:qe].unsqueeze(-1))
            if causal:
                mask = _diag_mask(qs, qe, ks, ke, q.device)
                if mask is not None:
                    p = p.masked_fill(mask, 0.0)
            dv_j += torch.matmul(p.transpose(1, 2), doi)
            dp = torch.matmul(doi, vj.transpose(1, 2))
            ds = p * (dp - delta[:, qs:qe].unsqueeze(-1))
            dq[:, qs:qe] += torch.matmul(ds, kj) * scale
            dk_j += torch.matmul(ds.transpose(1, 2), qi) * scale
        dk[:, ks:ke] = dk_j
        dv[:, ks:ke] = dv_j
    return (
        dq.to(q.dtype).reshape(*lead, n_q, d),
        dk.to(k.dtype).reshape(*lead, n_k, d),
        dv.to(v.dtype).reshape(*lead, n_k, d),
    )


class FlashAttentionTorch(torch.autograd.Function):
    """Tiled FlashAttention-2 in PyTorch. ``FlashAttentionTorch.apply(q, k, v, is_causal=False)``.

    Saves Q, K, V, O and one float32 log-sum-exp tensor L of shape (..., n_queries) for backward.
    """

    @staticmethod
    def forward(
        ctx,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        is_causal: bool = False,
        block_q: int = DEFAULT_BLOCK_Q,
        block_k: int = DEFAULT_BLOCK_K,
    ) -> torch.Tensor:
        o, lse = flash_attention_torch_forward(q, k, v, bool(is_causal), block_q, block_k)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.is_causal = bool(is_causal)
        ctx.blocks = (block_q, block_k)
        return o

    @staticmethod
    def backward(ctx, do: torch.Tensor):
        q, k, v, o, lse = ctx.saved_tensors
        dq, dk, dv = flash_attention_torch_backward(
            do.contiguous(), q, k, v, o, lse, ctx.is_causal, *ctx.blocks
        )
        return dq, dk, dv, None, None, None


def flash_attention_torch(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = False,
    *,
    block_q: int = DEFAULT_BLOCK_Q,
    block_k: int = DEFAULT_BLOCK_K,
) -> torch.Tensor:
    """softmax(q k^T / sqrt(d)) v by the tiled PyTorch FlashAttention-2; differentiable."""
    return FlashAttentionTorch.apply(q, k, v, causal, block_q, block_k)
