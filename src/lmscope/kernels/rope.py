"""RoPE on packed q|k|v projections in Triton: rotate q and k, split out v, in one pass.

API
    ``rope_qkv(qkv, cos, sin, num_heads)`` (differentiable) -> (q, k, v), each
    (batch, heads, seq, head_dim) and contiguous, ready for attention. ``qkv`` (batch, seq, 3*d)
    is the output of one matmul against the stacked weights [Wq; Wk; Wv]; feature h*head_dim + j
    of each third belongs to head h (the head split of ``lmscope.model.attention``).
    ``rope_qkv_reference`` is the PyTorch math it reproduces: feature pairs (2i, 2i+1) at position
    p are rotated by angle p * theta^(-2i/head_dim), i.e. ``lmscope.model.rope.RotaryEmbedding``;
    ``cos``/``sin`` are that module's (max_seq, head_dim/2) float32 tables.

Shapes and dtypes
    head_dim even (any size); float16, bfloat16, float32 or float64. The rotation runs in float32
    (float64 for float64) and is rounded once to the input dtype (the eager module rounds the
    tables and each product to the input dtype instead; the difference is within rounding).

Kernels
    forward: one launch per q|k|v, one program per (32 tokens, head, batch) loading and storing
    whole head_dim rows, the (even, odd) pairs split and joined in registers; v is copied.
    Earlier layouts (one program per token with stride-2 even/odd loads; whole rows plus a
    gathered pair-partner load) were slower in the xl fast step: benchmarks/results/fast/
    README.md, "Where the time went" (profiles of runs 2-graphs and 3-fused-optimizer).
    backward: the same launches; rotate dq and dk back by -angle and copy dv into one packed
    d(qkv) buffer, so autograd never adds up three sliced gradients. Nothing is saved but the
    tables.

Hardware
    Written for NVIDIA H100 (sm_90); memory bound (reads 3d and writes 3d values per token).

Caveats
    Positions are 0..seq-1 (no offsets, no KV cache). Under ``TRITON_INTERPRET=1`` (CPU, tests)
    the variable must be set before this module is imported.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["RoPEQKVFunction", "rope_qkv", "rope_qkv_reference"]


def rope_qkv_reference(
    qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, num_heads: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The PyTorch math of the kernel (float32, float64 kept), returning (q, k, v) per head."""
    batch, seq, width = qkv.shape
    acc = torch.float64 if qkv.dtype == torch.float64 else torch.float32
    heads = qkv.to(acc).view(batch, seq, 3, num_heads, width // (3 * num_heads)).permute(2, 0, 3, 1, 4)
    c, s = cos[:seq].to(acc), sin[:seq].to(acc)

    def rotate(x: torch.Tensor) -> torch.Tensor:
        even, odd = x[..., 0::2], x[..., 1::2]
        return torch.stack((even * c - odd * s, even * s + odd * c), dim=-1).flatten(-2)

    q, k, v = rotate(heads[0]), rotate(heads[1]), heads[2]
    return tuple(t.to(qkv.dtype).contiguous() for t in (q, k, v))  # type: ignore[return-value]


@triton.jit
def _rope_kernel(
    SRC, DST, COS, SIN,
    src_sb, src_st, src_sh, dst_sb, dst_st, dst_sh,
    seq, head_dim, sign,
    ROTATE: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr, ACC: tl.constexpr,
):  # fmt: skip
    """One head of BLOCK_T tokens: rotate by sign * angle (ROTATE) or copy.

    Rows of head_dim values are loaded and stored whole (vectorized); the (even, odd) feature
    pairs are separated in registers (reshape + split) and put back together (join + reshape).
    """
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)[:, None]
    h = tl.program_id(1).to(tl.int64)
    b = tl.program_id(2).to(tl.int64)
    d = tl.arange(0, BLOCK_D)[None, :]
    mask = (t < seq) & (d < head_dim)
    t = t.to(tl.int64)
    src = SRC + b * src_sb + h * src_sh + t * src_st
    dst = DST + b * dst_sb + h * dst_sh + t * dst_st
    x = tl.load(src + d, mask=mask, other=0.0)
    if ROTATE:
        even, odd = tl.split(tl.reshape(x.to(ACC), (BLOCK_T, BLOCK_D // 2, 2)))
        half = head_dim // 2
        i = tl.arange(0, BLOCK_D // 2)[None, :]
        table = t * half + i
        table_mask = (t < seq) & (i < half)
        c = tl.load(COS + table, mask=table_mask, other=1.0).to(ACC)
        s = tl.load(SIN + table, mask=table_mask, other=0.0).to(ACC) * sign
        rotated = tl.reshape(tl.join(even * c - odd * s, even * s + odd * c), (BLOCK_T, BLOCK_D))
        tl.store(dst + d, rotated.to(DST.dtype.element_ty), mask=mask)
    else:
        tl.store(dst + d, x.to(DST.dtype.element_ty), mask=mask)


_BLOCK_T = 32  # tokens per program: 32 x head_dim values, ~4 KiB of bf16 per load


def _launch(
    src: torch.Tensor, dst: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, sign: float, rotate: bool
) -> None:
    """src and dst are (batch, seq, heads, head_dim) views with a unit last stride."""
    batch, seq, heads, head_dim = src.shape
    _rope_kernel[(triton.cdiv(seq, _BLOCK_T), heads, batch)](
        src, dst, cos, sin, *src.stride()[:3], *dst.stride()[:3], seq, head_dim, sign,
        ROTATE=rotate, BLOCK_T=_BLOCK_T, BLOCK_D=triton.next_power_of_2(head_dim),
        ACC=tl.float64 if src.dtype == torch.float64 else tl.float32, num_warps=4,
    )  # fmt: skip


def _unit_last(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


class RoPEQKVFunction(torch.autograd.Function):
    """``RoPEQKVFunction.apply(qkv, cos, sin, num_heads)`` -> (q, k, v); saves only the tables."""

    @staticmethod
    def forward(ctx, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, num_heads: int):
        batch, seq, width = qkv.shape
        if width % (3 * num_heads) or (width // (3 * num_heads)) % 2:
            raise ValueError(
                f"qkv width {width} must be 3 * num_heads ({num_heads}) * an even head_dim"
            )
        head_dim = width // (3 * num_heads)
        if cos.shape[0] < seq or cos.shape[-1] != head_dim // 2 or sin.shape != cos.shape:
            raise ValueError(
                f"cos/sin tables {tuple(cos.shape)} must be (>= {seq}, {head_dim // 2})"
            )
        cos, sin = cos.contiguous(), sin.contiguous()
        slots = _unit_last(qkv).view(batch, seq, 3, num_heads, head_dim).unbind(2)
        outs = []
        for slot, src in enumerate(slots):
            out = torch.empty(batch, num_heads, seq, head_dim, dtype=qkv.dtype, device=qkv.device)
            if out.numel():
                _launch(src, out.transpose(1, 2), cos, sin, 1.0, rotate=slot < 2)
            outs.append(out)
        ctx.save_for_backward(cos, sin)
        ctx.num_heads = num_heads
        ctx.dtype = qkv.dtype
        return tuple(outs)

    @staticmethod
    def backward(ctx, *grads: torch.Tensor):
        cos, sin = ctx.saved_tensors
        given = next(g for g in grads if g is not None)
        batch, heads, seq, head_dim = given.shape
        dqkv = torch.empty(batch, seq, 3, heads, head_dim, dtype=ctx.dtype, device=given.device)
        for slot, (grad, dst) in enumerate(zip(grads, dqkv.unbind(2), strict=True)):
            if grad is None:
                dst.zero_()
            elif grad.numel():
                _launch(_unit_last(grad.to(ctx.dtype)).transpose(1, 2), dst, cos, sin, -1.0,
                        rotate=slot < 2)
        return dqkv.view(batch, seq, 3 * heads * head_dim), None, None, None


def rope_qkv(
    qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, num_heads: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Split packed (batch, seq, 3*d) projections into heads and rotate q and k; differentiable."""
    return RoPEQKVFunction.apply(qkv, cos, sin, num_heads)
