"""FlashAttention forward with TMA tiles (Hopper, sm_90) for long sequences.

What: the forward of ``flash_attention`` (same algorithm, outputs and layouts: O through its
strides, the log-sum-exp L flat (B*H, n_q)), with Q, K and V tiles read through host tensor
descriptors (TMA copies into shared memory, zero fill past the sequence) instead of pointer loads.
Same uniform warps and software pipelining as the default kernel, same split of the key loop
into tiles below the diagonal (no mask) and the diagonal and ragged tiles (masked).

Why: offline sm_90 builds (docs/kernels/flash_attention_backward_notes.md, variants 6 and 7)
showed the pointer-load forward at head dim 128 spilling registers at the 128 x 128 tile, the
tile cuDNN-class kernels use there, and the descriptor-load forward not: TMA computes the
addresses, so the warps keep fewer registers per tile. Whether that buys time is what the rows
of variant 7 measure.

Where: chosen per input signature (``serves``: compute capability 9.x, a Triton with host tensor
descriptors, fp16/bf16, head dims 64 and 128, 4-d inputs whose strides TMA accepts, at least
``MIN_SEQ`` queries and keys) and per call (``aligned``: 16-byte aligned pointers). Shorter calls
are bound by the host, where the default kernel's direct and C++ launch paths matter more.
``LMSCOPE_FLASH_TMA_FWD=0`` turns it off.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from lmscope.envflags import env_flag
from lmscope.kernels.tuning import short_bench_kwargs

__all__ = ["ENABLED", "MIN_SEQ", "aligned", "forward", "serves"]

ENABLED = env_flag("LMSCOPE_FLASH_TMA_FWD", default=True)
MIN_SEQ = 4096  # queries and keys; below it the default kernel's launch paths win on host time
_HEAD_DIMS = (64, 128)

try:  # host tensor descriptors (Triton >= 3.4)
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover - older Triton
    TensorDescriptor = None


def _tma_strides(x: torch.Tensor) -> bool:
    size = x.element_size()
    return x.stride(-1) == 1 and all(s * size % 16 == 0 for s in x.stride()[:-1])


def serves(q4: torch.Tensor, k4: torch.Tensor, v4: torch.Tensor) -> bool:
    """Whether ``forward`` serves 4-d (B, H, n, d) inputs of these shapes, strides and dtype on
    their GPU with this Triton (what a plan can fix; ``aligned`` checks each call)."""
    if not (ENABLED and TensorDescriptor is not None and q4.is_cuda):
        return False
    if q4.dtype not in (torch.float16, torch.bfloat16) or q4.shape[-1] not in _HEAD_DIMS:
        return False
    if min(q4.shape[2], k4.shape[2]) < MIN_SEQ or q4.shape[0] * q4.shape[1] > 65535:
        return False
    if torch.cuda.get_device_capability(q4.device)[0] != 9:
        return False
    return all(_tma_strides(x) for x in (q4, k4, v4))


def aligned(q4: torch.Tensor, k4: torch.Tensor, v4: torch.Tensor) -> bool:
    """TMA's per-call rule: 16-byte aligned base pointers."""
    return q4.data_ptr() % 16 == 0 and k4.data_ptr() % 16 == 0 and v4.data_ptr() % 16 == 0


def _tiles(nargs: dict) -> None:
    """Autotune pre-hook: the descriptors' tiles follow the config's (also on the final launch)."""
    d = nargs["HEAD_DIM"]
    nargs["desc_q"].block_shape = [1, 1, nargs["BLOCK_M"], d]
    nargs["desc_k"].block_shape = [1, 1, nargs["BLOCK_N"], d]
    nargs["desc_v"].block_shape = [1, 1, nargs["BLOCK_N"], d]


# (BLOCK_M, BLOCK_N, num_warps, num_stages): the default kernel's picks at long context and the
# 128 x 128 tile that builds without spills here (the shared memory of each fits an H100's).
_TILES = [(128, 128, 8, 2), (128, 64, 8, 3), (128, 64, 8, 2), (128, 128, 8, 3)]
_CONFIGS = [triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=w, num_stages=s, pre_hook=_tiles)
            for m, n, w, s in _TILES]  # fmt: skip


@triton.jit
def _inner(
    acc, l_i, m_i, q, desc_k, desc_v, off_z, off_h, offs_m, lo, hi, n_k, qk_scale,
    BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr,
):  # fmt: skip
    offs_nb = tl.arange(0, BLOCK_N)
    for start_n in range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        k = desc_k.load([off_z, off_h, start_n, 0]).reshape(BLOCK_N, HEAD_DIM)
        qk = tl.dot(q, tl.trans(k))
        if MASKED:
            keep = (start_n + offs_nb)[None, :] < n_k
            if CAUSAL:
                keep = keep & ((start_n + offs_nb)[None, :] <= offs_m[:, None])
            qk = tl.where(keep, qk * qk_scale, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(qk, 1))
            qk = qk - m_new[:, None]
        else:
            m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
            qk = qk * qk_scale - m_new[:, None]
        p = tl.math.exp2(qk)
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        v = desc_v.load([off_z, off_h, start_n, 0]).reshape(BLOCK_N, HEAD_DIM)
        acc = tl.dot(p.to(v.dtype), v, acc)
        m_i = m_new
    return acc, l_i, m_i


@triton.autotune(configs=_CONFIGS, key=["HEAD_DIM", "CAUSAL", "NQ_BUCKET", "NK_BUCKET"],
                 **short_bench_kwargs())  # fmt: skip
@triton.jit(do_not_specialize=["H", "n_q", "n_k", "NQ_BUCKET", "NK_BUCKET"])
def _attn_fwd_tma(
    desc_q, desc_k, desc_v, O, LSE,
    stride_oz, stride_oh, stride_om,
    H, n_q, n_k, qk_scale, NQ_BUCKET, NK_BUCKET,
    HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    # batch*heads on grid axis 0, query tiles reversed: every head's heaviest causal tiles first
    pid_m = tl.num_programs(1) - 1 - tl.program_id(1)
    off_bh = tl.program_id(0)
    off_z = off_bh // H
    off_h = off_bh % H
    start_m = pid_m * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    q = desc_q.load([off_z, off_h, start_m, 0]).reshape(BLOCK_M, HEAD_DIM)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    # keys [0, full_hi): visible to every row and inside the sequence; [full_hi, hi): masked
    if CAUSAL:
        full_hi = tl.minimum(start_m, n_k)
        hi = tl.minimum(start_m + BLOCK_M, n_k)
    else:
        full_hi = n_k
        hi = n_k
    full_hi = (full_hi // BLOCK_N) * BLOCK_N
    acc, l_i, m_i = _inner(acc, l_i, m_i, q, desc_k, desc_v, off_z, off_h, offs_m, 0, full_hi, n_k, qk_scale,
                           BLOCK_N, HEAD_DIM, False, CAUSAL)  # fmt: skip
    acc, l_i, m_i = _inner(acc, l_i, m_i, q, desc_k, desc_v, off_z, off_h, offs_m, full_hi, hi, n_k, qk_scale,
                           BLOCK_N, HEAD_DIM, True, CAUSAL)  # fmt: skip
    acc = acc / l_i[:, None]
    offs_d = tl.arange(0, HEAD_DIM)
    o_base = O + off_z.to(tl.int64) * stride_oz + off_h.to(tl.int64) * stride_oh
    tl.store(o_base + offs_m[:, None] * stride_om + offs_d[None, :], acc.to(O.dtype.element_ty),
             mask=offs_m[:, None] < n_q)  # fmt: skip
    lse = (m_i + tl.math.log2(l_i)) * 0.6931471805599453  # L = ln(2) * (m + log2(l))
    tl.store(LSE + off_bh.to(tl.int64) * n_q + offs_m, lse, mask=offs_m < n_q)


def forward(
    q4: torch.Tensor, k4: torch.Tensor, v4: torch.Tensor, o4: torch.Tensor, lse: torch.Tensor,
    causal: bool, qk_scale: float, o_strides: tuple, buckets: tuple[int, int],
) -> None:  # fmt: skip
    """Write O (through ``o_strides``, its (z, h, n) strides) and L (flat, (B*H, n_q)) for 4-d
    inputs ``serves`` and ``aligned`` accepted; ``qk_scale`` is log2(e)/sqrt(d)."""
    b, h, n_q, d = q4.shape
    descs = [TensorDescriptor(x, list(x.shape), list(x.stride()), [1, 1, 16, d]) for x in (q4, k4, v4)]

    def grid(meta):
        return (b * h, triton.cdiv(n_q, meta["BLOCK_M"]))

    _attn_fwd_tma[grid](*descs, o4, lse, *o_strides, h, n_q, k4.shape[2], qk_scale, *buckets,
                        HEAD_DIM=d, CAUSAL=causal)  # fmt: skip
