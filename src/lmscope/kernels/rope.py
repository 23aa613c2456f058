"""RoPE on packed q|k|v projections in Triton: rotate q and k, split out v, in one pass.

API
    ``rope_qkv(qkv, cos, sin, num_heads, kv_heads=None, halves=False)`` (differentiable) ->
    (q, k, v), each (batch, num_heads, seq, head_dim) and contiguous, ready for attention.
    ``qkv`` (batch, seq, (num_heads + 2 * kv_heads) * head_dim) is the output of one matmul
    against the stacked weights [Wq; Wk; Wv]; feature h*head_dim + j of each part belongs to
    head h (the head split of ``lmscope.model.attention`` and of transformers' attention).
    ``kv_heads`` (default num_heads) below num_heads is grouped-query attention: k and v come
    out repeated to the query heads (query head h reads key/value head h // (num_heads /
    kv_heads), as transformers' ``repeat_kv``), so an attention kernel without GQA support reads
    them as they are; the backward sums each group's gradients back into its key/value head.
    ``halves=False`` rotates adjacent feature pairs (2i, 2i+1) (``lmscope.model.rope``);
    ``halves=True`` rotates (i, i + head_dim/2), transformers' ``rotate_half`` layout (Llama,
    Qwen2, Mistral). Pair i at position p turns by the angle whose cosine and sine are
    ``cos[p, i]`` and ``sin[p, i]``: tables of (max_seq, head_dim/2), or (1 or batch, >= seq,
    head_dim/2) for positions that differ per sequence (any strides with a unit last one, e.g.
    the first half of transformers' (batch, seq, head_dim) cos/sin). ``rope_qkv_reference`` is
    the PyTorch math it reproduces.

Shapes and dtypes
    head_dim even (any size); float16, bfloat16, float32 or float64. The rotation runs in float32
    (float64 for float64) and is rounded once to the input dtype (the eager module rounds the
    tables and each product to the input dtype instead; the difference is within rounding).

Kernels
    forward: one launch per q|k|v, one program per (32 tokens, output head, batch) loading and
    storing whole head_dim rows (halves: the two half rows), the (even, odd) pairs split and
    joined in registers; v is copied. Earlier layouts (one program per token with stride-2
    even/odd loads; whole rows plus a gathered pair-partner load) were slower in the xl fast
    step: benchmarks/results/fast/README.md, "Where the time went" (profiles of runs 2-graphs and
    3-fused-optimizer).
    backward: the same launches over the input's heads; rotate dq and dk back by -angle (each
    key head's gradient summed over its query-head group first, in float32) and copy dv into one
    packed d(qkv) buffer, so autograd never adds up three sliced gradients. Nothing is saved but
    the tables.

Hardware
    Written for NVIDIA H100 (sm_90); memory bound (reads 3d and writes 3d values per token).

Caveats
    No KV cache (queries and keys have the same positions). Under ``TRITON_INTERPRET=1`` (CPU,
    tests) the variable must be set before this module is imported.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["RoPEQKVFunction", "rope_qkv", "rope_qkv_reference"]


def _head_counts(width: int, num_heads: int, kv_heads: int | None) -> tuple[int, int, int]:
    """(num_heads, kv_heads, head_dim) of a packed width; ValueError when they do not fit."""
    kv = num_heads if kv_heads is None else kv_heads
    if kv < 1 or num_heads % kv:
        raise ValueError(f"num_heads ({num_heads}) must be a multiple of kv_heads ({kv})")
    parts = num_heads + 2 * kv
    if width % parts or (width // parts) % 2:
        raise ValueError(f"qkv width {width} must be (num_heads + 2 * kv_heads) ({parts}) * an even "
                         "head_dim")
    return num_heads, kv, width // parts


def _table_view(table: torch.Tensor, seq: int) -> torch.Tensor:
    """A (max_seq, half) or (1 or batch, max_seq, half) table as (1 or batch, seq, half)."""
    return (table if table.ndim == 3 else table.unsqueeze(0))[:, :seq]


def rope_qkv_reference(
    qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, num_heads: int,
    kv_heads: int | None = None, halves: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """The PyTorch math of the kernel (float32, float64 kept), returning (q, k, v) per query head."""
    batch, seq, width = qkv.shape
    heads, kv, head_dim = _head_counts(width, num_heads, kv_heads)
    acc = torch.float64 if qkv.dtype == torch.float64 else torch.float32
    parts = qkv.to(acc).split([heads * head_dim, kv * head_dim, kv * head_dim], dim=-1)
    q, k, v = (p.unflatten(-1, (-1, head_dim)).transpose(1, 2) for p in parts)
    c, s = (_table_view(t, seq).to(acc).unsqueeze(1) for t in (cos, sin))

    def rotate(x: torch.Tensor) -> torch.Tensor:
        if halves:
            first, second = x.chunk(2, dim=-1)
            return torch.cat((first * c - second * s, second * c + first * s), dim=-1)
        even, odd = x[..., 0::2], x[..., 1::2]
        return torch.stack((even * c - odd * s, even * s + odd * c), dim=-1).flatten(-2)

    group = heads // kv
    q, k, v = rotate(q), rotate(k).repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    return tuple(t.to(qkv.dtype).contiguous() for t in (q, k, v))  # type: ignore[return-value]


@triton.jit
def _load_rows(ptrs, mask, head_stride, GROUP_SUM: tl.constexpr, ACC: tl.constexpr):
    """The values at `ptrs`; with GROUP_SUM > 1 the sum (in ACC) over GROUP_SUM consecutive heads."""
    x = tl.load(ptrs, mask=mask, other=0.0)
    if GROUP_SUM > 1:
        x = x.to(ACC)
        for g in tl.static_range(1, GROUP_SUM):
            x += tl.load(ptrs + g * head_stride, mask=mask, other=0.0).to(ACC)
    return x


@triton.jit
def _rope_kernel(
    SRC, DST, COS, SIN,
    src_sb, src_st, src_sh, dst_sb, dst_st, dst_sh, cos_sb, cos_st,
    seq, head_dim, src_div, sign,
    ROTATE: tl.constexpr, HALVES: tl.constexpr, GROUP_SUM: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr, ACC: tl.constexpr,
):  # fmt: skip
    """Output head h of BLOCK_T tokens: rotate by sign * angle (ROTATE) or copy.

    It reads input head h // src_div (the key/value head of a query head), or the sum of input
    heads h * GROUP_SUM ... h * GROUP_SUM + GROUP_SUM - 1 (a group's gradients). Rows are loaded
    and stored whole (vectorized); in the pairs layout the (even, odd) features are separated in
    registers (reshape + split) and put back together (join + reshape); in the halves layout the
    two half rows are loaded and stored apart.
    """
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)[:, None]
    h = tl.program_id(1).to(tl.int64)
    b = tl.program_id(2).to(tl.int64)
    t_ok = t < seq
    t = t.to(tl.int64)
    src = SRC + b * src_sb + (h // src_div) * GROUP_SUM * src_sh + t * src_st
    dst = DST + b * dst_sb + h * dst_sh + t * dst_st
    if ROTATE:
        half = head_dim // 2
        i = tl.arange(0, BLOCK_D // 2)[None, :]
        i_ok = t_ok & (i < half)
        table = b * cos_sb + t * cos_st + i
        c = tl.load(COS + table, mask=i_ok, other=1.0).to(ACC)
        s = tl.load(SIN + table, mask=i_ok, other=0.0).to(ACC) * sign
        if HALVES:
            first = _load_rows(src + i, i_ok, src_sh, GROUP_SUM, ACC).to(ACC)
            second = _load_rows(src + half + i, i_ok, src_sh, GROUP_SUM, ACC).to(ACC)
            tl.store(dst + i, (first * c - second * s).to(DST.dtype.element_ty), mask=i_ok)
            tl.store(dst + half + i, (second * c + first * s).to(DST.dtype.element_ty), mask=i_ok)
        else:
            d = tl.arange(0, BLOCK_D)[None, :]
            x = _load_rows(src + d, t_ok & (d < head_dim), src_sh, GROUP_SUM, ACC).to(ACC)
            even, odd = tl.split(tl.reshape(x, (BLOCK_T, BLOCK_D // 2, 2)))
            rotated = tl.reshape(tl.join(even * c - odd * s, even * s + odd * c), (BLOCK_T, BLOCK_D))
            tl.store(dst + d, rotated.to(DST.dtype.element_ty), mask=t_ok & (d < head_dim))
    else:
        d = tl.arange(0, BLOCK_D)[None, :]
        x = _load_rows(src + d, t_ok & (d < head_dim), src_sh, GROUP_SUM, ACC)
        tl.store(dst + d, x.to(DST.dtype.element_ty), mask=t_ok & (d < head_dim))


_BLOCK_T = 32  # tokens per program: 32 x head_dim values, ~4 KiB of bf16 per load


def _launch(
    src: torch.Tensor, dst: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, sign: float,
    rotate: bool, halves: bool, group_sum: int = 1,
) -> None:  # fmt: skip
    """One launch over dst's heads. src and dst are (batch, seq, heads, head_dim) views with a unit
    last stride, cos/sin (1 or batch, seq, half). Output head h reads src head h // (dst heads /
    src heads), or with group_sum > 1 sums src heads h * group_sum + g (a key/value group's
    gradients)."""
    batch, seq, heads, head_dim = dst.shape
    src_div = heads * group_sum // src.shape[2]
    _rope_kernel[(triton.cdiv(seq, _BLOCK_T), heads, batch)](
        src, dst, cos, sin, *src.stride()[:3], *dst.stride()[:3],
        cos.stride(0) if cos.shape[0] > 1 else 0, cos.stride(1), seq, head_dim, src_div, sign,
        ROTATE=rotate, HALVES=halves, GROUP_SUM=group_sum, BLOCK_T=_BLOCK_T,
        BLOCK_D=triton.next_power_of_2(head_dim),
        ACC=tl.float64 if src.dtype == torch.float64 else tl.float32, num_warps=4,
    )  # fmt: skip


def _unit_last(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


def _tables(cos: torch.Tensor, sin: torch.Tensor, batch: int, seq: int, half: int):
    """cos and sin as (1 or batch, seq, half) views with one shared set of strides."""
    if cos.ndim not in (2, 3) or cos.shape[-2] < seq or cos.shape[-1] != half or sin.shape != cos.shape \
            or (cos.ndim == 3 and cos.shape[0] not in (1, batch)):
        raise ValueError(f"cos/sin tables {tuple(cos.shape)} must be (>= {seq}, {half}) or "
                         f"(1 or {batch}, >= {seq}, {half})")
    cos, sin = _table_view(_unit_last(cos), seq), _table_view(_unit_last(sin), seq)
    if cos.stride() != sin.stride():
        cos, sin = cos.contiguous(), sin.contiguous()
    return cos, sin


class RoPEQKVFunction(torch.autograd.Function):
    """``RoPEQKVFunction.apply(qkv, cos, sin, num_heads, kv_heads, halves)`` -> (q, k, v); saves
    only the tables."""

    @staticmethod
    def forward(ctx, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, num_heads: int,
                kv_heads: int | None = None, halves: bool = False):  # fmt: skip
        batch, seq, width = qkv.shape
        heads, kv, head_dim = _head_counts(width, num_heads, kv_heads)
        cos, sin = _tables(cos, sin, batch, seq, head_dim // 2)
        parts = _unit_last(qkv).split([heads * head_dim, kv * head_dim, kv * head_dim], dim=-1)
        outs = []
        for slot, part in enumerate(parts):
            out = torch.empty(batch, heads, seq, head_dim, dtype=qkv.dtype, device=qkv.device)
            if out.numel():
                _launch(part.unflatten(-1, (-1, head_dim)), out.transpose(1, 2), cos, sin, sign=1.0,
                        rotate=slot < 2, halves=halves)
            outs.append(out)
        ctx.save_for_backward(cos, sin)
        ctx.layout = (heads, kv, head_dim, halves, qkv.dtype)
        return tuple(outs)

    @staticmethod
    def backward(ctx, *grads: torch.Tensor):
        cos, sin = ctx.saved_tensors
        heads, kv, head_dim, halves, dtype = ctx.layout
        given = next(g for g in grads if g is not None)
        batch, _, seq, _ = given.shape
        dqkv = torch.empty(batch, seq, (heads + 2 * kv) * head_dim, dtype=dtype, device=given.device)
        parts = dqkv.split([heads * head_dim, kv * head_dim, kv * head_dim], dim=-1)
        for slot, (grad, part) in enumerate(zip(grads, parts, strict=True)):
            if grad is None:
                part.zero_()
            elif grad.numel():
                _launch(_unit_last(grad.to(dtype)).transpose(1, 2), part.unflatten(-1, (-1, head_dim)),
                        cos, sin, sign=-1.0, rotate=slot < 2, halves=halves,
                        group_sum=1 if slot == 0 else heads // kv)
        return dqkv, None, None, None, None, None


def rope_qkv(
    qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, num_heads: int,
    kv_heads: int | None = None, halves: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """Split packed (batch, seq, (num_heads + 2 kv_heads) * head_dim) projections into per-query-head
    q, k, v and rotate q and k (see the module docstring); differentiable."""
    return RoPEQKVFunction.apply(qkv, cos, sin, num_heads, kv_heads, halves)
