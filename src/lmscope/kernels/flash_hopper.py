"""FlashAttention kernels for Hopper (sm_90): TMA tiles and Triton's warp specialisation.

What: the forward and dK/dV kernels of ``flash_attention`` (same algorithm and outputs: O and the
log-sum-exp L, dK, dV in the same layouts), with Q, K, V and dO tiles read through host tensor
descriptors (TMA copies; zero fill past the sequence) and each kernel's
loop a ``tl.range(..., warp_specialize=...)``: with 4 warps Triton's Hopper pass splits a program
into a producer warp group that issues the copies and two consumer warp groups (64 rows of the
resident tile each) that run the dots and the softmax, registers moved to the consumers. The
autotuner also gets uniform-warp configs of the same kernels, where specialisation may lose.

Why: at long context ours trailed cuDNN, whose Hopper kernels are built this way, at head dim 128
in both directions; the uniform-warp kernels wait for every tile's copies and dots in turn.
Prediction and rows: docs/kernels/flash_attention_backward_notes.md, variant 6.

Where: chosen at run time, per input signature (``serves``: a compute capability 9.x GPU, a Triton
with host tensor descriptors and ``warp_specialize``, fp16/bf16, head dims 64 and 128, 4-d inputs
whose strides TMA accepts, at least ``MIN_SEQ`` queries and keys) and per call (``aligned``:
16-byte aligned pointers, dO's strides too). Shorter calls are bound by the host, where the
default kernels' direct and C++ launch paths matter more. ``LMSCOPE_FLASH_HOPPER_FWD=0`` and
``LMSCOPE_FLASH_HOPPER_BWD=0`` turn either direction off; the atomic dQ mode keeps its kernels.

What Triton 3.6's Hopper specialisation compiles (checked offline with sm_90 builds): one loop
per kernel (it fails on a kernel with a second loop after the specialised one), so diagonal and
ragged tiles are not split off and every tile applies its mask (one compare and select per
score). It fails on the dQ kernel's loop ("Unexpected op" in its data partitioning, with D
computed in the kernel or loaded), so dQ and D stay with the default dQ kernel; TMA alone did
not help that kernel before (variant 4 of the notes).
"""

from __future__ import annotations

import inspect

import torch
import triton
import triton.language as tl

from lmscope.envflags import env_flag
from lmscope.kernels.tuning import short_bench_kwargs

__all__ = ["MIN_SEQ", "aligned", "dkdv", "forward", "serves"]

FORWARD = env_flag("LMSCOPE_FLASH_HOPPER_FWD", default=True)
BACKWARD = env_flag("LMSCOPE_FLASH_HOPPER_BWD", default=True)
MIN_SEQ = 4096  # queries and keys; below it the default kernels' launch paths win on host time
_HEAD_DIMS = (64, 128)
LOG2E = 1.4426950408889634

try:  # host tensor descriptors (Triton >= 3.4)
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover - older Triton
    TensorDescriptor = None

_HAS_WS = "warp_specialize" in inspect.signature(tl.range.__init__).parameters
_KEY = ["HEAD_DIM", "CAUSAL", "NQ_BUCKET", "NK_BUCKET"]
_NO_SPEC = ["H", "n_q", "n_k", "NQ_BUCKET", "NK_BUCKET"]


# --------------------------------------------------------------------------------------------
# which calls, descriptors, configs
# --------------------------------------------------------------------------------------------


def _tma_strides(x: torch.Tensor) -> bool:
    size = x.element_size()
    return x.stride(-1) == 1 and all(s * size % 16 == 0 for s in x.stride()[:-1])


def serves(q4: torch.Tensor, k4: torch.Tensor, v4: torch.Tensor) -> bool:
    """Whether these kernels serve 4-d (B, H, n, d) inputs of these shapes, strides and dtype on
    their GPU with this Triton (what a plan can fix; ``aligned`` checks each call)."""
    if not (_HAS_WS and TensorDescriptor is not None and q4.is_cuda):
        return False
    if q4.dtype not in (torch.float16, torch.bfloat16) or q4.shape[-1] not in _HEAD_DIMS:
        return False
    if min(q4.shape[2], k4.shape[2]) < MIN_SEQ or q4.shape[0] * q4.shape[1] > 65535:
        return False
    if torch.cuda.get_device_capability(q4.device)[0] != 9:
        return False
    return all(_tma_strides(x) for x in (q4, k4, v4))


def aligned(*tensors: torch.Tensor) -> bool:
    """TMA's per-call rules: 16-byte aligned pointers (and strides, for dO, whose layout is the
    caller's)."""
    return all(x.data_ptr() % 16 == 0 and _tma_strides(x) for x in tensors)


def _descriptor(x: torch.Tensor) -> TensorDescriptor:
    """A 4-d descriptor of x; its tile shape is set per config (``_tiles``)."""
    return TensorDescriptor(x, list(x.shape), list(x.stride()), [1, 1, 16, x.shape[-1]])


def _tiles(rows: dict[str, str]):
    """Autotune pre-hook: each descriptor argument's tile takes the rows of its config block."""

    def hook(nargs: dict) -> None:
        for desc, block in rows.items():
            nargs[desc].block_shape = [1, 1, nargs[block], nargs["HEAD_DIM"]]

    return hook


def _configs(names: tuple[str, str], rows: dict[str, str], table: list[tuple]) -> list[triton.Config]:
    """(tile0, tile1, num_warps, num_stages, warp specialised). Specialised configs name 4 warps:
    the compiler adds the producer and the second consumer group (12 warps in all)."""
    hook = _tiles(rows)
    return [triton.Config({names[0]: a, names[1]: b, "WS": ws}, num_warps=w, num_stages=s, pre_hook=hook)
            for a, b, w, s, ws in table]  # fmt: skip


# --------------------------------------------------------------------------------------------
# forward
# --------------------------------------------------------------------------------------------

_FWD_ROWS = {"desc_q": "BLOCK_M", "desc_k": "BLOCK_N", "desc_v": "BLOCK_N"}
_FWD = _configs(("BLOCK_M", "BLOCK_N"), _FWD_ROWS, [
    (128, 128, 4, 2, True), (128, 64, 4, 2, True), (128, 64, 4, 3, True),
    (128, 128, 8, 2, False), (128, 64, 8, 3, False),
])  # fmt: skip


@triton.autotune(configs=_FWD, key=_KEY, **short_bench_kwargs())
@triton.jit(do_not_specialize=_NO_SPEC)
def _attn_fwd_hopper(
    desc_q, desc_k, desc_v, O, LSE,
    stride_oz, stride_oh, stride_om,
    H, n_q, n_k, qk_scale, NQ_BUCKET, NK_BUCKET,
    HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, WS: tl.constexpr,
):  # fmt: skip
    # batch*heads on grid axis 0, query tiles reversed: every head's heaviest causal tiles first
    pid_m = tl.num_programs(1) - 1 - tl.program_id(1)
    off_bh = tl.program_id(0)
    off_z = off_bh // H
    off_h = off_bh % H
    start_m = pid_m * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_nb = tl.arange(0, BLOCK_N)
    q = desc_q.load([off_z, off_h, start_m, 0]).reshape(BLOCK_M, HEAD_DIM)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    if CAUSAL:  # key j is visible to query i where j <= i (and j < n_k)
        last_key = tl.minimum(offs_m, n_k - 1)
        hi = tl.minimum(start_m + BLOCK_M, n_k)
    else:
        last_key = tl.zeros([BLOCK_M], dtype=tl.int32) + (n_k - 1)
        hi = n_k
    for start_n in tl.range(0, hi, BLOCK_N, warp_specialize=WS):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        k = desc_k.load([off_z, off_h, start_n, 0]).reshape(BLOCK_N, HEAD_DIM)
        qk = tl.dot(q, tl.trans(k))
        keep = (start_n + offs_nb)[None, :] <= last_key[:, None]
        qk = tl.where(keep, qk * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        p = tl.math.exp2(qk - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        v = desc_v.load([off_z, off_h, start_n, 0]).reshape(BLOCK_N, HEAD_DIM)
        acc = tl.dot(p.to(v.dtype), v, acc)
        m_i = m_new
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

    def grid(meta):
        return (b * h, triton.cdiv(n_q, meta["BLOCK_M"]))

    _attn_fwd_hopper[grid](_descriptor(q4), _descriptor(k4), _descriptor(v4), o4, lse, *o_strides, h, n_q,
                           k4.shape[2], qk_scale, *buckets, HEAD_DIM=d, CAUSAL=causal)  # fmt: skip


# --------------------------------------------------------------------------------------------
# backward: dK/dV (dQ and D come from the default dQ kernel, which runs first)
# --------------------------------------------------------------------------------------------

_DKDV_ROWS = {"desc_q": "BLOCK_M1", "desc_do": "BLOCK_M1", "desc_k": "BLOCK_N1", "desc_v": "BLOCK_N1"}
_DKDV = _configs(("BLOCK_M1", "BLOCK_N1"), _DKDV_ROWS, [
    (64, 128, 4, 2, True), (32, 128, 4, 2, True), (64, 128, 4, 3, True), (32, 128, 4, 3, True),
    (64, 128, 8, 2, False), (32, 128, 8, 3, False),
])  # fmt: skip


@triton.autotune(configs=_DKDV, key=_KEY, **short_bench_kwargs())
@triton.jit(do_not_specialize=_NO_SPEC)
def _attn_bwd_dkdv_hopper(
    desc_q, desc_k, desc_v, desc_do, LSE, DELTA, DK, DV,
    H, n_q, n_k, qk_scale, sm_scale, NQ_BUCKET, NK_BUCKET,
    HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr,
    BLOCK_M1: tl.constexpr, BLOCK_N1: tl.constexpr, WS: tl.constexpr,
):  # fmt: skip
    pid_n = tl.program_id(1)  # natural order: under causal masking the first key tiles see most
    off_bh = tl.program_id(0)
    off_z = off_bh // H
    off_h = off_bh % H
    start_n = pid_n * BLOCK_N1
    offs_n = start_n + tl.arange(0, BLOCK_N1)
    offs_mb = tl.arange(0, BLOCK_M1)
    k = desc_k.load([off_z, off_h, start_n, 0]).reshape(BLOCK_N1, HEAD_DIM)
    v = desc_v.load([off_z, off_h, start_n, 0]).reshape(BLOCK_N1, HEAD_DIM)
    dk = tl.zeros([BLOCK_N1, HEAD_DIM], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N1, HEAD_DIM], dtype=tl.float32)
    lse_base = LSE + off_bh.to(tl.int64) * n_q
    delta_base = DELTA + off_bh.to(tl.int64) * n_q
    # queries i >= j see key j (causal): start at the query tile holding this key tile's first
    lo = (start_n // BLOCK_M1) * BLOCK_M1 if CAUSAL else 0
    for start_m in tl.range(lo, n_q, BLOCK_M1, warp_specialize=WS):
        start_m = tl.multiple_of(start_m, BLOCK_M1)
        offs_m = start_m + offs_mb
        m_ok = offs_m < n_q
        q = desc_q.load([off_z, off_h, start_m, 0]).reshape(BLOCK_M1, HEAD_DIM)
        do = desc_do.load([off_z, off_h, start_m, 0]).reshape(BLOCK_M1, HEAD_DIM)
        lse2 = tl.load(lse_base + offs_m, mask=m_ok, other=0.0) * 1.4426950408889634
        delta = tl.load(delta_base + offs_m, mask=m_ok, other=0.0)
        kqT = tl.dot(k, tl.trans(q))  # (BLOCK_N1, BLOCK_M1)
        pT = tl.math.exp2(kqT * qk_scale - lse2[None, :])
        keep = m_ok[None, :]
        if CAUSAL:
            keep = keep & (offs_m[None, :] >= offs_n[:, None])
        pT = tl.where(keep, pT, 0.0)
        dv = tl.dot(pT.to(do.dtype), do, dv)
        dpT = tl.dot(v, tl.trans(do))
        dsT = (pT * (dpT - delta[None, :])).to(q.dtype)
        dk = tl.dot(dsT, q, dk)
    offs_d = tl.arange(0, HEAD_DIM)
    rows = off_bh.to(tl.int64) * n_k * HEAD_DIM + offs_n[:, None] * HEAD_DIM  # contiguous dK, dV
    n_ok = offs_n[:, None] < n_k
    tl.store(DK + rows + offs_d[None, :], (dk * sm_scale).to(DK.dtype.element_ty), mask=n_ok)
    tl.store(DV + rows + offs_d[None, :], dv.to(DV.dtype.element_ty), mask=n_ok)


def dkdv(
    q4: torch.Tensor, k4: torch.Tensor, v4: torch.Tensor, do4: torch.Tensor, lse: torch.Tensor,
    delta: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor, causal: bool, scalars: tuple,
) -> None:  # fmt: skip
    """Write dK and dV (contiguous) for inputs ``serves`` and ``aligned`` accepted (dO too), from
    L (``lse``) and D (``delta``), both flat (B*H, n_q); ``scalars`` is the plan's (H, n_q, n_k,
    qk_scale, sm_scale, NQ_BUCKET, NK_BUCKET)."""
    b, h, _, d = q4.shape

    def grid(meta):
        return (b * h, triton.cdiv(k4.shape[2], meta["BLOCK_N1"]))

    _attn_bwd_dkdv_hopper[grid](_descriptor(q4), _descriptor(k4), _descriptor(v4), _descriptor(do4), lse,
                                delta, dk, dv, *scalars, HEAD_DIM=d, CAUSAL=causal)  # fmt: skip
