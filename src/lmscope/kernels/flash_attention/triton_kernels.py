"""FlashAttention-2 forward and backward in Triton, with its autograd.Function.

API
    ``flash_attention(q, k, v, causal=False)`` (differentiable), or
    ``FlashAttentionTriton.apply(q, k, v, is_causal=False)``;
    ``flash_attention_forward(q, k, v, causal)`` -> (O, L) and ``flash_attention_backward`` for
    tests and benchmarks.

Shapes
    q (..., n_queries, d); k, v (..., n_keys, d); identical leading dims (batch, heads, ... or
    none). Inputs may be strided views, e.g. (B, T, H, d).transpose(1, 2): a 4-d input is read in
    place through its strides as long as its last dim is contiguous; other layouts are copied.
    n_queries != n_keys and sequence lengths that are not multiples of the tiles are supported.
    O has q's shape. For inputs of 4 or more dims, (..., H, n_queries, d), O is laid out in
    (..., n_queries, H, d) memory order (the strides of ``torch.empty(B, T, H, d).transpose(1,
    2)`` for (B, H, T, d), but a tensor of its own, not a view): the model's next step,
    ``o.transpose(1, 2).reshape(B, T, H * d)`` before the output projection, is then a free
    view instead of a copy kernel per layer. Inputs of 2 or 3 dims
    (no head dim) get a contiguous O, as before. The backward reads O and dO through their
    strides (dO usually arrives as the same kind of view of a contiguous (B, T, H*d) gradient),
    so neither is copied.
    Head dims 1..128; powers of two >= 16 (16, 32, 64, 128) are one column tile. Other sizes
    are two tiles where those are narrower than the next power of two (``split_head_dim``: 80 =
    64 + 16, 96 = 64 + 32, the tail tile's extra columns masked), else one zero-padded tile
    (masked loads); ``LMSCOPE_FLASH_SPLIT=0`` pads every size to one tile.

Dtypes
    float16 and bfloat16 (tensor-core dots, fp32 accumulators and softmax statistics) and
    float32 (dots in IEEE fp32, not TF32, so results match PyTorch's default fp32 matmul).
    O has the input dtype; the saved log-sum-exp L = m + log(l) (natural log) is float32 with
    shape (..., n_queries).

Causal
    Query i attends keys j <= i: top-left alignment, the same as
    ``torch.nn.functional.scaled_dot_product_attention(is_causal=True)``, also when
    n_queries != n_keys (with n_queries > n_keys the later queries see every key; with
    n_queries < n_keys the later keys are seen by nobody and get zero gradients).
    Tiles above the diagonal are skipped; key loops are split into an unmasked part (tiles fully
    below the diagonal and inside the sequence) and a masked part (diagonal and ragged tail).

Kernels
    forward: grid over (query tiles, batch*heads) -- in either order, an autotuned choice --
    with the query-tile id reversed so the heaviest causal tiles start first; online softmax in
    the log2 domain (scores pre-scaled by log2(e)/sqrt(d), ``exp2``); writes O and L.
    backward: (1) dQ kernel: one query tile resident, loop over key tiles (no atomics); it
    also computes D = rowsum(dO * O) for its rows (fp64 sum for fp32 inputs: dP - D cancels)
    and stores it; (2) dK/dV kernel: one key/value tile resident, loop over query tiles,
    recompute P^T = exp2(K Q^T * c - L2), reading D. ``DQ_MODE = "atomic"`` instead computes D
    in a preprocess kernel and adds dQ from the dK/dV kernel into a zeroed float32 buffer (two
    fewer matmuls per tile pair): per-element atomics in the Triton kernel, which measured
    slower, TMA reduce-adds in the Gluon sm_90 one, which measured faster at head dims 64 and
    128; the default ``"auto"`` takes the latter where it serves and the separate mode elsewhere
    (docs/kernels/flash_attention_backward_notes.md, variants 2, 9 and 10).
    Tile sizes, warps and pipeline stages are autotuned from a small list per head dim, keyed on
    head dim, causal, dtype and power-of-two buckets of the sequence lengths. Once the
    autotuner has chosen for a key, the kernels are launched with its choice, skipping
    ``Autotuner.run``'s per-call work (``_Launcher``), and once Triton has compiled a kernel for
    the arguments' specialisation, its launcher is called directly, skipping
    ``JITFunction.run``'s binder and cache lookup (lmscope.kernels.triton_launch, which falls
    back to ``JITFunction.run`` wherever it cannot be exact or launch hooks are installed). O is
    written through its strides, dQ, dK, dV are allocated contiguous and indexed without stride
    arguments. What the launches need besides the tensors (checks, strides, scalars, launch
    keys, fixed launch arguments) is a ``_Plan`` kept per signature of q, k, v and causal
    (``_plan_for``; only plain tensors' plans are kept), so a repeated call skips the checks;
    the autograd Function keeps it for the backward and allocates the backward's float32
    scratch with L. Once a plan's three kernels have been launched directly, ``flash_attention``
    hands the plan to a C++ autograd Function (lmscope.kernels.flash_native: the same binaries,
    arguments and grids, launched with cuLaunchKernel; ``LMSCOPE_FLASH_NATIVE=0`` turns it off;
    ``python_path()`` keeps the Python Function for a block). Host cost per call, beside
    SDPA's: docs/kernels/flash_attention.md and docs/kernels/flash_attention_host_notes.md
    (rows in benchmarks/results/attention/).

Hardware
    Tuned on an NVIDIA H100 80GB HBM3 (sm_90) with Triton 3.6 and PyTorch 2.11 at batch 1, 16
    heads, seq 16384, d 64, bf16, causal. Its times against SDPA's FlashAttention-2 and cuDNN
    backends are measured rows, not quoted here: benchmarks/results/attention/ (README.md there
    holds the table generated from the rows, with their git sha). Runs on any GPU Triton
    supports; other GPUs get the same config lists (the autotuner skips configs that do not fit).

Caveats
    No dropout, no attention bias, no sliding window, no GQA head broadcasting; softmax scale is
    fixed at 1/sqrt(d). Under ``TRITON_INTERPRET=1`` (CPU, for tests) the kernels run in
    Triton's interpreter with one small tile config; the variable must be set before this module
    is imported (Triton reads it when the kernels are decorated); there dots are upcast to fp32
    and fp32 -> bf16 is rounded by hand (the interpreter's bf16 dot and rounding are wrong).
    The first call at a new (head dim, causal, dtype, length bucket) spends a few seconds
    autotuning. Where it is faster or slower than SDPA's backends by sequence length and head
    dim: the rows in benchmarks/results/attention/ (tflops.jsonl, classic.jsonl).
"""

from __future__ import annotations

import contextlib
import inspect
import math
import os
import warnings
from collections.abc import Iterator
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from lmscope.envflags import env_flag
from lmscope.kernels import flash_native, flash_sm90, flash_sm90_dkdv, flash_sm90_dq
from lmscope.kernels.attention_reference import check_attention_inputs
from lmscope.kernels.triton_launch import DirectLaunch, FixedArgs

__all__ = [
    "DQ_MODE",
    "FlashAttentionTriton",
    "flash_attention",
    "flash_attention_backward",
    "flash_attention_forward",
]

LOG2E = 1.4426950408889634  # log2(e)
LN2 = 0.6931471805599453  # ln(2)
MAX_HEAD_DIM = 128

# "separate": dQ by its own kernel (no atomics); "atomic": dQ accumulated by the dK/dV kernel
# (the Triton kernel: per-element fp32 atomics; the Gluon sm_90 kernel: one TMA reduce-add per
# query tile and key block); "auto": atomic where the Gluon dK/dV kernel serves with its
# reduce-adds (faster there at every head dim it serves), separate elsewhere
# (docs/kernels/flash_attention_backward_notes.md, variants 2, 9 and 10).
DQ_MODE = os.environ.get("LMSCOPE_FLASH_DQ", "auto")
# Head dims that are not powers of two (80, 96, ...) as two column tiles, not one padded tile
# (split_head_dim); LMSCOPE_FLASH_SPLIT=0: one padded tile, the kernels' earlier layout.
SPLIT_HEAD_DIM = env_flag("LMSCOPE_FLASH_SPLIT", default=True)
_DQ_MODES = ("auto", "separate", "atomic")

_INTERPRET = env_flag("TRITON_INTERPRET")
# Triton's CPU interpreter mis-computes bfloat16 dots (seen with Triton 3.9): there, dot operands
# are upcast to float32 after the same roundings the GPU path does, so results stay comparable.
_UPCAST_DOTS = tl.constexpr(_INTERPRET)
# Benchmark hook (benchmarks/flash_tune.py warms Triton's disk cache in parallel processes):
# pin every autotuned kernel to the config with this index in its list.
_ONLY_CONFIG = (
    int(os.environ["LMSCOPE_FLASH_ONLY_CONFIG"]) if os.environ.get("LMSCOPE_FLASH_ONLY_CONFIG") else None
)


# --------------------------------------------------------------------------------------------
# autotuning configs
# --------------------------------------------------------------------------------------------


def _cfg(names: tuple[str, str], t: tuple) -> triton.Config:
    b0, b1, warps, stages, *rest = t
    head_major = bool(rest[0]) if rest else False
    return triton.Config(
        {names[0]: b0, names[1]: b1, "HEAD_MAJOR": head_major}, num_warps=warps, num_stages=stages
    )


def _key(c: triton.Config, names: tuple[str, str]) -> tuple:
    k = (c.kwargs[names[0]], c.kwargs[names[1]], c.num_warps, c.num_stages)
    return (*k, True) if c.kwargs["HEAD_MAJOR"] else k


# (tile0, tile1, num_warps, num_stages[, HEAD_MAJOR]) per kernel; "small" for head dims <= 64,
# "large" above; fp32 gets one config (IEEE dots run on the FMA units: correctness, not speed).
# Picked from register/spill reports of sm_90 builds (4-warp variants of the larger tiles spill)
# and from timings on an H100 (docs/kernels/flash_attention.md). A fifth entry True means
# HEAD_MAJOR grid order: batch*heads on grid axis 0, so every head's heavy tiles start first.
_FWD = {
    "small": [(128, 64, 8, 3, True), (64, 64, 4, 3, True), (64, 64, 4, 3), (128, 64, 8, 3)],
    "large": [(128, 64, 8, 3), (128, 64, 8, 3, True), (128, 64, 8, 2), (64, 64, 4, 3),
              (64, 64, 4, 3, True), (128, 128, 8, 2)],  # fmt: skip
    "fp32": [(32, 32, 4, 2)],
    "interp": [(16, 16, 1, 1, True)],
}
_DKDV = {  # (BLOCK_M1 queries per step, BLOCK_N1 resident keys)
    "small": [(64, 64, 4, 3), (64, 64, 4, 3, True), (32, 128, 4, 5), (64, 128, 8, 3)],
    "large": [(32, 128, 8, 3), (32, 128, 8, 2), (16, 128, 8, 3), (64, 128, 8, 2),
              (32, 64, 4, 3), (64, 128, 8, 3)],  # the last two: the wide lists' d 128 picks
    "fp32": [(16, 64, 8, 2)],
    "interp": [(16, 32, 1, 1)],
}
_DQ = {  # (BLOCK_M2 resident queries, BLOCK_N2 keys per step)
    "small": [(64, 64, 4, 3, True), (64, 128, 4, 3), (64, 64, 4, 3), (128, 32, 4, 5)],
    "large": [(128, 32, 8, 3), (128, 32, 8, 3, True), (128, 64, 8, 2), (64, 32, 4, 3),
              (64, 32, 4, 3, True), (128, 16, 8, 3), (128, 64, 8, 3)],  # fmt: skip
    "fp32": [(32, 16, 4, 2)],
    "interp": [(32, 16, 1, 1, True)],
}
# LMSCOPE_FLASH_WIDE=1: the longer head-dim <= 64 lists the lists above were chosen from
# (benchmarks/flash_tune.py run with it; numbers in docs/kernels/flash_attention.md), and longer
# head-dim > 64 backward lists with larger query and key tiles, measured at d 128 where the
# backward trails cuDNN (docs/kernels/flash_attention_backward_notes.md).
if env_flag("LMSCOPE_FLASH_WIDE"):
    _DKDV["large"] = [*_DKDV["large"], (64, 64, 4, 3), (64, 64, 4, 2), (32, 128, 4, 3),
                      (64, 64, 8, 3), (32, 128, 8, 4)]  # fmt: skip
    _DQ["large"] = [*_DQ["large"], (64, 64, 4, 3), (64, 64, 4, 2), (64, 128, 8, 2), (128, 128, 8, 2),
                    (64, 64, 8, 3), (128, 32, 8, 4)]  # fmt: skip
    _FWD["small"] = [(128, 64, 8, 3), (128, 64, 8, 4), (128, 64, 8, 2), (64, 64, 4, 3),
                     (64, 128, 4, 3), (128, 32, 8, 3), (64, 64, 4, 4), (128, 64, 4, 4),
                     (128, 64, 8, 3, True), (64, 64, 4, 3, True)]  # fmt: skip
    _DKDV["small"] = [(32, 128, 4, 5), (64, 64, 4, 3), (64, 64, 4, 4), (64, 64, 4, 2),
                      (32, 64, 4, 3), (32, 64, 4, 4), (64, 128, 8, 4), (32, 128, 4, 4),
                      (32, 128, 4, 5, True), (64, 64, 4, 3, True)]  # fmt: skip
    _DQ["small"] = [(64, 64, 4, 3), (64, 64, 4, 4), (64, 64, 4, 2), (64, 32, 4, 3),
                    (64, 32, 4, 4), (64, 128, 4, 3), (128, 64, 8, 4), (32, 64, 4, 3),
                    (64, 64, 4, 3, True), (128, 64, 8, 3, True)]  # fmt: skip


def _configs(table: dict, names: tuple[str, str]) -> list[triton.Config]:
    if _INTERPRET:
        return [_cfg(names, t) for t in table["interp"]]
    seen: list[tuple] = []
    for group in ("small", "large", "fp32"):
        for t in table[group]:
            if t not in seen:
                seen.append(t)
    return [_cfg(names, t) for t in seen]


def _pruner(table: dict, names: tuple[str, str]):
    """Keep the configs listed for this launch's head dim and dtype."""

    def prune(configs, named_args, **kwargs):
        if _INTERPRET:
            return configs
        args = {**named_args, **kwargs}
        head_dim = int(args["HEAD_DIM"])
        is_fp32 = args["Q"].dtype == torch.float32
        group = "fp32" if is_fp32 else ("small" if head_dim <= 64 else "large")
        wanted = set(table[group])
        kept = [c for c in configs if _key(c, names) in wanted]
        q = args["Q"]
        if q.shape[0] * q.shape[1] > 65535:  # batch*heads must go on grid axis 0
            kept = [c for c in kept if c.kwargs["HEAD_MAJOR"]] or [
                _cfg(names, (*_key(kept[0] if kept else configs[0], names)[:4], True))
            ]
        kept = kept or configs[:1]
        if _ONLY_CONFIG is not None:  # benchmark warm-up: compile exactly one config
            return [kept[_ONLY_CONFIG % len(kept)]]
        return kept

    return prune


def _autotune_kwargs() -> dict:
    # Shorter benchmarking than Triton's default (25 ms warm-up, 100 ms repeats) so a first call
    # at a new shape tunes in seconds; medians of ~20 launches separate these configs well.
    params = inspect.signature(triton.autotune).parameters
    if "do_bench" in params:

        def bench(fn, quantiles=None):
            return triton.testing.do_bench(fn, warmup=5, rep=25, quantiles=quantiles)

        return {"do_bench": bench}
    return {}


_TUNE_KEY = ["HEAD_DIM", "CAUSAL", "NQ_BUCKET", "NK_BUCKET"]  # dtypes are added by Triton
# Sequence lengths and head counts are not specialised on (divisibility by 16, == 1): one binary
# per (head dim, dtype, causal, config) serves every length, so tuning compiles each config once.
_NO_SPEC = ["H", "n_q", "n_k", "NQ_BUCKET", "NK_BUCKET"]


# --------------------------------------------------------------------------------------------
# shared helpers
# --------------------------------------------------------------------------------------------


@triton.jit
def _load(ptrs, row_ok, col_ok, ROW_MASK: tl.constexpr, COL_MASK: tl.constexpr):
    """Load a tile, masking rows and/or columns (zero fill) only where asked."""
    if ROW_MASK and COL_MASK:
        x = tl.load(ptrs, mask=row_ok & col_ok, other=0.0)
    elif ROW_MASK:
        x = tl.load(ptrs, mask=row_ok, other=0.0)
    elif COL_MASK:
        x = tl.load(ptrs, mask=col_ok, other=0.0)
    else:
        x = tl.load(ptrs)
    return x


@triton.jit
def _cast(x, dtype: tl.constexpr):
    """x.to(dtype). Triton's interpreter rounds fp32 -> bf16 towards zero where the GPU rounds
    to nearest even; there the rounding is done by hand (the value stays in fp32, exact in bf16)."""
    if _UPCAST_DOTS:
        if dtype == tl.bfloat16:
            bits = x.to(tl.uint32, bitcast=True)
            bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
            y = bits.to(tl.float32, bitcast=True)
        else:
            y = x.to(dtype)
    else:
        y = x.to(dtype)
    return y


@triton.jit
def _dot(a, b, DOT_PREC: tl.constexpr):
    if _UPCAST_DOTS:
        a = a.to(tl.float32)
        b = b.to(tl.float32)
    return tl.dot(a, b, input_precision=DOT_PREC)


@triton.jit
def _dot_acc(a, b, acc, DOT_PREC: tl.constexpr):
    if _UPCAST_DOTS:
        a = a.to(tl.float32)
        b = b.to(tl.float32)
    return tl.dot(a, b, acc, input_precision=DOT_PREC)


# --------------------------------------------------------------------------------------------
# forward
# --------------------------------------------------------------------------------------------


@triton.jit
def _fwd_inner(
    acc, acc_t, l_i, m_i, q, q_t,
    k_base, v_base, stride_kn, stride_vn,
    offs_m, offs_d, offs_t, lo, hi, n_k, qk_scale,
    BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, D_MAIN: tl.constexpr, D_TAIL: tl.constexpr,
    MASKED: tl.constexpr, CAUSAL: tl.constexpr, DOT_PREC: tl.constexpr,
):  # fmt: skip
    offs_nb = tl.arange(0, BLOCK_N)
    d_ok = offs_d[None, :] < HEAD_DIM
    t_ok = offs_t[None, :] < HEAD_DIM
    for start_n in range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        offs_n = start_n + offs_nb
        n_ok = offs_n[:, None] < n_k
        k = _load(k_base + offs_n[:, None] * stride_kn + offs_d[None, :], n_ok, d_ok,
                  MASKED, D_MAIN > HEAD_DIM)  # fmt: skip
        qk = _dot(q, tl.trans(k), DOT_PREC)
        if D_TAIL > 0:  # the head dim's tail columns (split head dim, module docstring)
            k_t = _load(k_base + offs_n[:, None] * stride_kn + offs_t[None, :], n_ok, t_ok,
                        MASKED, D_MAIN + D_TAIL > HEAD_DIM)  # fmt: skip
            qk = _dot_acc(q_t, tl.trans(k_t), qk, DOT_PREC)
        if MASKED:
            keep = offs_n[None, :] < n_k
            if CAUSAL:
                keep = keep & (offs_n[None, :] <= offs_m[:, None])
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
        v = _load(v_base + offs_n[:, None] * stride_vn + offs_d[None, :], n_ok, d_ok,
                  MASKED, D_MAIN > HEAD_DIM)  # fmt: skip
        p = _cast(p, v.dtype)
        acc = _dot_acc(p, v, acc, DOT_PREC)
        if D_TAIL > 0:
            acc_t = acc_t * alpha[:, None]
            v_t = _load(v_base + offs_n[:, None] * stride_vn + offs_t[None, :], n_ok, t_ok,
                        MASKED, D_MAIN + D_TAIL > HEAD_DIM)  # fmt: skip
            acc_t = _dot_acc(p, v_t, acc_t, DOT_PREC)
        m_i = m_new
    return acc, acc_t, l_i, m_i


@triton.autotune(
    configs=_configs(_FWD, ("BLOCK_M", "BLOCK_N")),
    key=_TUNE_KEY,
    prune_configs_by={"early_config_prune": _pruner(_FWD, ("BLOCK_M", "BLOCK_N"))},
    **_autotune_kwargs(),
)
@triton.jit(do_not_specialize=_NO_SPEC)
def _attn_fwd(
    Q, K, V, O, LSE,
    stride_qz, stride_qh, stride_qm,
    stride_kz, stride_kh, stride_kn,
    stride_vz, stride_vh, stride_vn,
    stride_oz, stride_oh, stride_om,
    H, n_q, n_k, qk_scale, NQ_BUCKET, NK_BUCKET,
    HEAD_DIM: tl.constexpr, D_MAIN: tl.constexpr, D_TAIL: tl.constexpr,
    CAUSAL: tl.constexpr, DOT_PREC: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_MAJOR: tl.constexpr,
):  # fmt: skip
    # Reverse the query-tile order: under causal masking the last tiles do the most work.
    # HEAD_MAJOR puts batch*heads on grid axis 0 (launched first): the heavy tiles of every
    # head then start before any light one.
    if HEAD_MAJOR:
        pid_m = tl.num_programs(1) - 1 - tl.program_id(1)
        off_bh = tl.program_id(0)
    else:
        pid_m = tl.num_programs(0) - 1 - tl.program_id(0)
        off_bh = tl.program_id(1)
    off_z = (off_bh // H).to(tl.int64)
    off_h = (off_bh % H).to(tl.int64)
    q_base = Q + off_z * stride_qz + off_h * stride_qh
    k_base = K + off_z * stride_kz + off_h * stride_kh
    v_base = V + off_z * stride_vz + off_h * stride_vh
    o_base = O + off_z * stride_oz + off_h * stride_oh  # (B, T, H, d) memory for 4-d inputs

    start_m = pid_m * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D_MAIN)
    m_ok = offs_m[:, None] < n_q
    d_ok = offs_d[None, :] < HEAD_DIM
    q = _load(q_base + offs_m[:, None] * stride_qm + offs_d[None, :], m_ok, d_ok, True, D_MAIN > HEAD_DIM)
    acc = tl.zeros([BLOCK_M, D_MAIN], dtype=tl.float32)
    if D_TAIL > 0:
        offs_t = D_MAIN + tl.arange(0, D_TAIL)
        t_ok = offs_t[None, :] < HEAD_DIM
        q_t = _load(q_base + offs_m[:, None] * stride_qm + offs_t[None, :], m_ok, t_ok, True,
                    D_MAIN + D_TAIL > HEAD_DIM)  # fmt: skip
        acc_t = tl.zeros([BLOCK_M, D_TAIL], dtype=tl.float32)
    else:  # stand-ins, never used
        offs_t, q_t, acc_t = offs_d, q, acc

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)

    # Keys [0, full_hi) are visible to every row of this tile and inside the sequence: no mask.
    # Keys [full_hi, hi) cross the diagonal and/or the end of the sequence: masked.
    if CAUSAL:
        full_hi = tl.minimum(start_m, n_k)
        hi = tl.minimum(start_m + BLOCK_M, n_k)
    else:
        full_hi = n_k
        hi = n_k
    full_hi = (full_hi // BLOCK_N) * BLOCK_N
    acc, acc_t, l_i, m_i = _fwd_inner(acc, acc_t, l_i, m_i, q, q_t, k_base, v_base, stride_kn, stride_vn,
                                      offs_m, offs_d, offs_t, 0, full_hi, n_k, qk_scale,
                                      BLOCK_N, HEAD_DIM, D_MAIN, D_TAIL, False, CAUSAL, DOT_PREC)  # fmt: skip
    acc, acc_t, l_i, m_i = _fwd_inner(acc, acc_t, l_i, m_i, q, q_t, k_base, v_base, stride_kn, stride_vn,
                                      offs_m, offs_d, offs_t, full_hi, hi, n_k, qk_scale,
                                      BLOCK_N, HEAD_DIM, D_MAIN, D_TAIL, True, CAUSAL, DOT_PREC)  # fmt: skip

    acc = acc / l_i[:, None]
    tl.store(o_base + offs_m[:, None] * stride_om + offs_d[None, :],
             _cast(acc, O.dtype.element_ty), mask=m_ok & d_ok)  # fmt: skip
    if D_TAIL > 0:
        acc_t = acc_t / l_i[:, None]
        tl.store(o_base + offs_m[:, None] * stride_om + offs_t[None, :],
                 _cast(acc_t, O.dtype.element_ty), mask=m_ok & t_ok)  # fmt: skip
    # m_i is in log2 units of the scaled scores: L = ln(2) * (m + log2(l)).
    lse = (m_i + tl.math.log2(l_i)) * 0.6931471805599453
    tl.store(LSE + off_bh.to(tl.int64) * n_q + offs_m, lse, mask=offs_m < n_q)


# --------------------------------------------------------------------------------------------
# backward
# --------------------------------------------------------------------------------------------


@triton.jit
def _row_dot(o, do, ACC64: tl.constexpr):
    """D = rowsum(dO * O) in float32. dS = P * (dP - D) cancels where dP ~ D; for fp32 inputs
    (ACC64) D is summed in fp64 so the fp32 gradients stay as accurate as PyTorch's own fp32
    computation (an O(n d) op: cheap)."""
    if ACC64:
        return tl.sum(o.to(tl.float64) * do.to(tl.float64), axis=1).to(tl.float32)
    return tl.sum(o.to(tl.float32) * do.to(tl.float32), axis=1)


@triton.jit(do_not_specialize=["H", "n_q"])
def _bwd_preprocess(
    O, DO, DELTA, DQ_ACC,
    stride_oz, stride_oh, stride_om,
    stride_dz, stride_dh, stride_dm,
    H, n_q,
    HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, BLOCK_M: tl.constexpr, ACC64: tl.constexpr,
):  # fmt: skip
    off_bh = tl.program_id(1)
    off_z = (off_bh // H).to(tl.int64)
    off_h = (off_bh % H).to(tl.int64)
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D_PAD)
    mask = (offs_m[:, None] < n_q) & (offs_d[None, :] < HEAD_DIM)
    o = tl.load(O + off_z * stride_oz + off_h * stride_oh
                + offs_m[:, None] * stride_om + offs_d[None, :], mask=mask, other=0.0)  # fmt: skip
    do = tl.load(DO + off_z * stride_dz + off_h * stride_dh
                 + offs_m[:, None] * stride_dm + offs_d[None, :], mask=mask, other=0.0)  # fmt: skip
    delta = _row_dot(o, do, ACC64)
    rows = off_bh.to(tl.int64) * n_q + offs_m
    tl.store(DELTA + rows, delta, mask=offs_m < n_q)
    # the atomic-mode dQ accumulator's rows zeroed here: no memset launch of its own
    tl.store(DQ_ACC + rows[:, None] * D_PAD + offs_d[None, :], tl.zeros([BLOCK_M, D_PAD], tl.float32),
             mask=offs_m[:, None] < n_q)  # fmt: skip


@triton.jit
def _dkdv_inner(
    dk, dv, dk_t, dv_t, k, v, k_t, v_t, q_base, do_base, lse_base, delta_base, dq_base,
    stride_qm, stride_dom, offs_n, offs_d, offs_t, start_m, n_steps, n_q, qk_scale,
    BLOCK_M1: tl.constexpr, HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr,
    D_MAIN: tl.constexpr, D_TAIL: tl.constexpr,
    MASKED: tl.constexpr, CAUSAL: tl.constexpr, DOT_PREC: tl.constexpr,
    ATOMIC_DQ: tl.constexpr,
):  # fmt: skip
    """dK, dV over ``n_steps`` query tiles from ``start_m``; with ATOMIC_DQ also adds each tile's
    dQ into the float32 accumulator, per element."""
    offs_mb = tl.arange(0, BLOCK_M1)
    d_row = offs_d[:, None] < HEAD_DIM
    d_col = offs_d[None, :] < HEAD_DIM
    t_row = offs_t[:, None] < HEAD_DIM
    t_col = offs_t[None, :] < HEAD_DIM
    MASK_D: tl.constexpr = D_MAIN > HEAD_DIM
    MASK_T: tl.constexpr = D_MAIN + D_TAIL > HEAD_DIM
    curr_m = start_m
    for _ in range(n_steps):
        offs_m = curr_m + offs_mb
        m_ok = offs_m < n_q
        # Q^T tile (D, BLOCK_M1) and dO tile (BLOCK_M1, D).
        qT = _load(q_base + offs_m[None, :] * stride_qm + offs_d[:, None], m_ok[None, :], d_row,
                   MASKED, MASK_D)  # fmt: skip
        do = _load(do_base + offs_m[:, None] * stride_dom + offs_d[None, :], m_ok[:, None],
                   d_col, MASKED, MASK_D)  # fmt: skip
        if D_TAIL > 0:
            qT_t = _load(q_base + offs_m[None, :] * stride_qm + offs_t[:, None], m_ok[None, :], t_row,
                         MASKED, MASK_T)  # fmt: skip
            do_t = _load(do_base + offs_m[:, None] * stride_dom + offs_t[None, :], m_ok[:, None],
                         t_col, MASKED, MASK_T)  # fmt: skip
        if MASKED:
            lse2 = tl.load(lse_base + offs_m, mask=m_ok, other=0.0) * 1.4426950408889634
            delta = tl.load(delta_base + offs_m, mask=m_ok, other=0.0)
        else:
            lse2 = tl.load(lse_base + offs_m) * 1.4426950408889634
            delta = tl.load(delta_base + offs_m)
        kqT = _dot(k, qT, DOT_PREC)  # (BLOCK_N1, BLOCK_M1)
        if D_TAIL > 0:
            kqT = _dot_acc(k_t, qT_t, kqT, DOT_PREC)
        pT = tl.math.exp2(kqT * qk_scale - lse2[None, :])
        if MASKED:
            keep = m_ok[None, :]
            if CAUSAL:
                keep = keep & (offs_m[None, :] >= offs_n[:, None])
            pT = tl.where(keep, pT, 0.0)
        pT_lo = _cast(pT, do.dtype)
        dv = _dot_acc(pT_lo, do, dv, DOT_PREC)
        dpT = _dot(v, tl.trans(do), DOT_PREC)
        if D_TAIL > 0:
            dv_t = _dot_acc(pT_lo, do_t, dv_t, DOT_PREC)
            dpT = _dot_acc(v_t, tl.trans(do_t), dpT, DOT_PREC)
        dsT = _cast(pT * (dpT - delta[None, :]), qT.dtype)
        dk = _dot_acc(dsT, tl.trans(qT), dk, DOT_PREC)
        if D_TAIL > 0:
            dk_t = _dot_acc(dsT, tl.trans(qT_t), dk_t, DOT_PREC)
        if ATOMIC_DQ:
            dq = _dot(tl.trans(dsT), k, DOT_PREC)  # (BLOCK_M1, D), unscaled
            dq_ptrs = dq_base + offs_m[:, None] * D_PAD + offs_d[None, :]
            tl.atomic_add(dq_ptrs, dq, mask=m_ok[:, None], sem="relaxed")
            if D_TAIL > 0:
                dq_t = _dot(tl.trans(dsT), k_t, DOT_PREC)
                tl.atomic_add(dq_base + offs_m[:, None] * D_PAD + offs_t[None, :], dq_t,
                              mask=m_ok[:, None], sem="relaxed")  # fmt: skip
        curr_m += BLOCK_M1
    return dk, dv, dk_t, dv_t


@triton.autotune(
    configs=_configs(_DKDV, ("BLOCK_M1", "BLOCK_N1")),
    key=_TUNE_KEY + ["ATOMIC_DQ"],
    prune_configs_by={"early_config_prune": _pruner(_DKDV, ("BLOCK_M1", "BLOCK_N1"))},
    reset_to_zero=["DQ_ACC"],
    **_autotune_kwargs(),
)
@triton.jit(do_not_specialize=_NO_SPEC)
def _attn_bwd_dkdv(
    Q, K, V, DO, LSE, DELTA, DK, DV, DQ_ACC,
    stride_qz, stride_qh, stride_qm,
    stride_kz, stride_kh, stride_kn,
    stride_vz, stride_vh, stride_vn,
    stride_doz, stride_doh, stride_dom,
    H, n_q, n_k, qk_scale, sm_scale, NQ_BUCKET, NK_BUCKET,
    HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, D_MAIN: tl.constexpr, D_TAIL: tl.constexpr,
    CAUSAL: tl.constexpr, DOT_PREC: tl.constexpr,
    ATOMIC_DQ: tl.constexpr, BLOCK_M1: tl.constexpr, BLOCK_N1: tl.constexpr,
    HEAD_MAJOR: tl.constexpr,
):  # fmt: skip
    tl.static_assert(BLOCK_N1 % BLOCK_M1 == 0)
    # Natural order: under causal masking the first key tiles see the most queries.
    if HEAD_MAJOR:
        pid_n = tl.program_id(1)
        off_bh = tl.program_id(0)
    else:
        pid_n = tl.program_id(0)
        off_bh = tl.program_id(1)
    off_z = (off_bh // H).to(tl.int64)
    off_h = (off_bh % H).to(tl.int64)
    q_base = Q + off_z * stride_qz + off_h * stride_qh
    do_base = DO + off_z * stride_doz + off_h * stride_doh
    lse_base = LSE + off_bh.to(tl.int64) * n_q
    delta_base = DELTA + off_bh.to(tl.int64) * n_q
    dq_base = DQ_ACC + off_bh.to(tl.int64) * n_q * D_PAD

    start_n = pid_n * BLOCK_N1
    offs_n = start_n + tl.arange(0, BLOCK_N1)
    offs_d = tl.arange(0, D_MAIN)
    n_ok = offs_n[:, None] < n_k
    d_ok = offs_d[None, :] < HEAD_DIM
    k_rows = K + off_z * stride_kz + off_h * stride_kh + offs_n[:, None] * stride_kn
    v_rows = V + off_z * stride_vz + off_h * stride_vh + offs_n[:, None] * stride_vn
    k = _load(k_rows + offs_d[None, :], n_ok, d_ok, True, D_MAIN > HEAD_DIM)
    v = _load(v_rows + offs_d[None, :], n_ok, d_ok, True, D_MAIN > HEAD_DIM)
    dk = tl.zeros([BLOCK_N1, D_MAIN], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N1, D_MAIN], dtype=tl.float32)
    if D_TAIL > 0:
        offs_t = D_MAIN + tl.arange(0, D_TAIL)
        t_ok = offs_t[None, :] < HEAD_DIM
        k_t = _load(k_rows + offs_t[None, :], n_ok, t_ok, True, D_MAIN + D_TAIL > HEAD_DIM)
        v_t = _load(v_rows + offs_t[None, :], n_ok, t_ok, True, D_MAIN + D_TAIL > HEAD_DIM)
        dk_t = tl.zeros([BLOCK_N1, D_TAIL], dtype=tl.float32)
        dv_t = tl.zeros([BLOCK_N1, D_TAIL], dtype=tl.float32)
    else:  # stand-ins, never used
        offs_t, k_t, v_t, dk_t, dv_t = offs_d, k, v, dk, dv

    # Query blocks: [start_n, start_n + BLOCK_N1) crosses the diagonal (causal, masked);
    # [full_lo, full_hi) is fully visible and inside the sequence (unmasked);
    # [tail_lo, n_q) is the ragged end of the sequence (masked).
    if CAUSAL:
        diag_hi = tl.minimum(start_n + BLOCK_N1, n_q)
        n_diag = tl.maximum(diag_hi - start_n, 0)
        n_diag = (n_diag + BLOCK_M1 - 1) // BLOCK_M1
        dk, dv, dk_t, dv_t = _dkdv_inner(
            dk, dv, dk_t, dv_t, k, v, k_t, v_t, q_base, do_base, lse_base, delta_base, dq_base,
            stride_qm, stride_dom, offs_n, offs_d, offs_t, start_n, n_diag, n_q, qk_scale,
            BLOCK_M1, HEAD_DIM, D_PAD, D_MAIN, D_TAIL, True, CAUSAL, DOT_PREC, ATOMIC_DQ)
        full_lo = start_n + BLOCK_N1
    else:
        full_lo = 0
    full_hi = (n_q // BLOCK_M1) * BLOCK_M1
    n_full = tl.maximum(full_hi - full_lo, 0) // BLOCK_M1
    dk, dv, dk_t, dv_t = _dkdv_inner(
        dk, dv, dk_t, dv_t, k, v, k_t, v_t, q_base, do_base, lse_base, delta_base, dq_base,
        stride_qm, stride_dom, offs_n, offs_d, offs_t, full_lo, n_full, n_q, qk_scale,
        BLOCK_M1, HEAD_DIM, D_PAD, D_MAIN, D_TAIL, False, CAUSAL, DOT_PREC, ATOMIC_DQ)
    tail_lo = tl.maximum(full_lo, full_hi)
    n_tail = (tl.maximum(n_q - tail_lo, 0) + BLOCK_M1 - 1) // BLOCK_M1
    dk, dv, dk_t, dv_t = _dkdv_inner(
        dk, dv, dk_t, dv_t, k, v, k_t, v_t, q_base, do_base, lse_base, delta_base, dq_base,
        stride_qm, stride_dom, offs_n, offs_d, offs_t, tail_lo, n_tail, n_q, qk_scale,
        BLOCK_M1, HEAD_DIM, D_PAD, D_MAIN, D_TAIL, True, CAUSAL, DOT_PREC, ATOMIC_DQ)

    # dK and dV are contiguous (allocated by the host function): one offset serves both.
    out_rows = off_bh.to(tl.int64) * n_k * HEAD_DIM + offs_n[:, None] * HEAD_DIM
    tl.store(DK + out_rows + offs_d[None, :], _cast(dk * sm_scale, DK.dtype.element_ty), mask=n_ok & d_ok)
    tl.store(DV + out_rows + offs_d[None, :], _cast(dv, DV.dtype.element_ty), mask=n_ok & d_ok)
    if D_TAIL > 0:
        tl.store(DK + out_rows + offs_t[None, :], _cast(dk_t * sm_scale, DK.dtype.element_ty),
                 mask=n_ok & t_ok)  # fmt: skip
        tl.store(DV + out_rows + offs_t[None, :], _cast(dv_t, DV.dtype.element_ty), mask=n_ok & t_ok)


@triton.jit
def _dq_inner(
    dq, dq_t, q, q_t, do, do_t, lse2, delta, k_base, v_base, stride_kn, stride_vn,
    offs_m, offs_d, offs_t, lo, hi, n_k, qk_scale,
    BLOCK_N2: tl.constexpr, HEAD_DIM: tl.constexpr, D_MAIN: tl.constexpr, D_TAIL: tl.constexpr,
    MASKED: tl.constexpr, CAUSAL: tl.constexpr, DOT_PREC: tl.constexpr,
):  # fmt: skip
    offs_nb = tl.arange(0, BLOCK_N2)
    d_ok = offs_d[None, :] < HEAD_DIM
    t_ok = offs_t[None, :] < HEAD_DIM
    for start_n in range(lo, hi, BLOCK_N2):
        start_n = tl.multiple_of(start_n, BLOCK_N2)
        offs_n = start_n + offs_nb
        n_ok = offs_n[:, None] < n_k
        k = _load(k_base + offs_n[:, None] * stride_kn + offs_d[None, :], n_ok, d_ok,
                  MASKED, D_MAIN > HEAD_DIM)  # fmt: skip
        v = _load(v_base + offs_n[:, None] * stride_vn + offs_d[None, :], n_ok, d_ok,
                  MASKED, D_MAIN > HEAD_DIM)  # fmt: skip
        qk = _dot(q, tl.trans(k), DOT_PREC)  # (BLOCK_M2, BLOCK_N2)
        dp = _dot(do, tl.trans(v), DOT_PREC)
        if D_TAIL > 0:
            k_t = _load(k_base + offs_n[:, None] * stride_kn + offs_t[None, :], n_ok, t_ok,
                        MASKED, D_MAIN + D_TAIL > HEAD_DIM)  # fmt: skip
            v_t = _load(v_base + offs_n[:, None] * stride_vn + offs_t[None, :], n_ok, t_ok,
                        MASKED, D_MAIN + D_TAIL > HEAD_DIM)  # fmt: skip
            qk = _dot_acc(q_t, tl.trans(k_t), qk, DOT_PREC)
            dp = _dot_acc(do_t, tl.trans(v_t), dp, DOT_PREC)
        p = tl.math.exp2(qk * qk_scale - lse2[:, None])
        if MASKED:
            keep = offs_n[None, :] < n_k
            if CAUSAL:
                keep = keep & (offs_n[None, :] <= offs_m[:, None])
            p = tl.where(keep, p, 0.0)
        ds = _cast(p * (dp - delta[:, None]), k.dtype)
        dq = _dot_acc(ds, k, dq, DOT_PREC)
        if D_TAIL > 0:
            dq_t = _dot_acc(ds, k_t, dq_t, DOT_PREC)
    return dq, dq_t


@triton.autotune(
    configs=_configs(_DQ, ("BLOCK_M2", "BLOCK_N2")),
    key=_TUNE_KEY,
    prune_configs_by={"early_config_prune": _pruner(_DQ, ("BLOCK_M2", "BLOCK_N2"))},
    **_autotune_kwargs(),
)
@triton.jit(do_not_specialize=_NO_SPEC)
def _attn_bwd_dq(
    Q, K, V, DO, O, LSE, DELTA, DQ,
    stride_qz, stride_qh, stride_qm,
    stride_kz, stride_kh, stride_kn,
    stride_vz, stride_vh, stride_vn,
    stride_doz, stride_doh, stride_dom,
    stride_oz, stride_oh, stride_om,
    H, n_q, n_k, qk_scale, sm_scale, NQ_BUCKET, NK_BUCKET,
    HEAD_DIM: tl.constexpr, D_MAIN: tl.constexpr, D_TAIL: tl.constexpr,
    CAUSAL: tl.constexpr, DOT_PREC: tl.constexpr,
    ACC64: tl.constexpr, BLOCK_M2: tl.constexpr, BLOCK_N2: tl.constexpr, HEAD_MAJOR: tl.constexpr,
):  # fmt: skip
    # heaviest causal tiles first (see _attn_fwd)
    if HEAD_MAJOR:
        pid_m = tl.num_programs(1) - 1 - tl.program_id(1)
        off_bh = tl.program_id(0)
    else:
        pid_m = tl.num_programs(0) - 1 - tl.program_id(0)
        off_bh = tl.program_id(1)
    off_z = (off_bh // H).to(tl.int64)
    off_h = (off_bh % H).to(tl.int64)
    k_base = K + off_z * stride_kz + off_h * stride_kh
    v_base = V + off_z * stride_vz + off_h * stride_vh

    start_m = pid_m * BLOCK_M2
    offs_m = start_m + tl.arange(0, BLOCK_M2)
    offs_d = tl.arange(0, D_MAIN)
    m_ok = offs_m < n_q
    d_ok = offs_d[None, :] < HEAD_DIM
    q_rows = Q + off_z * stride_qz + off_h * stride_qh + offs_m[:, None] * stride_qm
    do_rows = DO + off_z * stride_doz + off_h * stride_doh + offs_m[:, None] * stride_dom
    o_rows = O + off_z * stride_oz + off_h * stride_oh + offs_m[:, None] * stride_om
    q = _load(q_rows + offs_d[None, :], m_ok[:, None], d_ok, True, D_MAIN > HEAD_DIM)
    do = _load(do_rows + offs_d[None, :], m_ok[:, None], d_ok, True, D_MAIN > HEAD_DIM)
    o = _load(o_rows + offs_d[None, :], m_ok[:, None], d_ok, True, D_MAIN > HEAD_DIM)
    # D = rowsum(dO * O) for this tile's rows, stored for the dK/dV kernel that runs next
    delta = _row_dot(o, do, ACC64)
    dq = tl.zeros([BLOCK_M2, D_MAIN], dtype=tl.float32)
    if D_TAIL > 0:
        offs_t = D_MAIN + tl.arange(0, D_TAIL)
        t_ok = offs_t[None, :] < HEAD_DIM
        tail_mask: tl.constexpr = D_MAIN + D_TAIL > HEAD_DIM
        q_t = _load(q_rows + offs_t[None, :], m_ok[:, None], t_ok, True, tail_mask)
        do_t = _load(do_rows + offs_t[None, :], m_ok[:, None], t_ok, True, tail_mask)
        o_t = _load(o_rows + offs_t[None, :], m_ok[:, None], t_ok, True, tail_mask)
        delta += _row_dot(o_t, do_t, ACC64)
        dq_t = tl.zeros([BLOCK_M2, D_TAIL], dtype=tl.float32)
    else:  # stand-ins, never used
        offs_t, q_t, do_t, dq_t = offs_d, q, do, dq
    row = off_bh.to(tl.int64) * n_q + offs_m
    lse2 = tl.load(LSE + row, mask=m_ok, other=0.0) * 1.4426950408889634
    tl.store(DELTA + row, delta, mask=m_ok)

    if CAUSAL:
        full_hi = tl.minimum(start_m, n_k)
        hi = tl.minimum(start_m + BLOCK_M2, n_k)
    else:
        full_hi = n_k
        hi = n_k
    full_hi = (full_hi // BLOCK_N2) * BLOCK_N2
    dq, dq_t = _dq_inner(dq, dq_t, q, q_t, do, do_t, lse2, delta, k_base, v_base, stride_kn, stride_vn,
                         offs_m, offs_d, offs_t, 0, full_hi, n_k, qk_scale,
                         BLOCK_N2, HEAD_DIM, D_MAIN, D_TAIL, False, CAUSAL, DOT_PREC)  # fmt: skip
    dq, dq_t = _dq_inner(dq, dq_t, q, q_t, do, do_t, lse2, delta, k_base, v_base, stride_kn, stride_vn,
                         offs_m, offs_d, offs_t, full_hi, hi, n_k, qk_scale,
                         BLOCK_N2, HEAD_DIM, D_MAIN, D_TAIL, True, CAUSAL, DOT_PREC)  # fmt: skip
    dq_rows = DQ + off_bh.to(tl.int64) * n_q * HEAD_DIM + offs_m[:, None] * HEAD_DIM  # contiguous
    tl.store(dq_rows + offs_d[None, :], _cast(dq * sm_scale, DQ.dtype.element_ty), mask=m_ok[:, None] & d_ok)
    if D_TAIL > 0:
        tl.store(dq_rows + offs_t[None, :], _cast(dq_t * sm_scale, DQ.dtype.element_ty),
                 mask=m_ok[:, None] & t_ok)  # fmt: skip


# --------------------------------------------------------------------------------------------
# launching: through triton.autotune once per tuning key, then the JIT function directly
# --------------------------------------------------------------------------------------------


class _Launcher:
    """Launches one autotuned kernel, paying for ``triton.autotune`` only until it has chosen.

    The first call at a key goes through the autotuner (``kernel[grid](...)``), which prunes and
    benchmarks the configs, with its ``reset_to_zero`` hooks, and launches the best one. Its
    choice (``kernel.best_config``) is then kept here, and later calls at that key launch the
    JIT function with it directly: the same binary, arguments and launch options that
    ``Autotuner.run`` passes on a cache hit, without its per-call work (naming every argument,
    building its key from them, merging the config's options) or a grid callback. Those
    launches go through ``DirectLaunch`` (lmscope.kernels.triton_launch), which also skips
    ``JITFunction.run``'s binder and cache lookup once Triton has compiled the kernel for the
    arguments' specialisation, and falls back to ``JITFunction.run`` where it cannot.

    ``key`` is (head dim, causal, dtype, n_queries bucket, n_keys bucket, atomic dQ,
    batch*heads > 65535). It decides everything Triton's tuning key holds (its dtypes are q's
    dtype and float32, fixed by q's dtype) and everything the pruner reads from the arguments;
    the constexpr arguments (HEAD_DIM, D_MAIN, D_TAIL, D_PAD, DOT_PREC, CAUSAL, ATOMIC_DQ, ACC64)
    follow from it.
    The kept choices are dropped whenever the autotuner's cache changed size behind our back
    (benchmarks/flash_tune.py clears it to re-tune), and ``kernel.best_config`` is set on every
    launch as the autotuner does. Where this Triton lacks what the direct launch needs (the
    autotuner's ``fn``, ``cache`` and ``best_config``, ``fn.run(*args, grid, warmup, **kw)``),
    or a config has a pre_hook, every call goes through the autotuner.
    """

    def __init__(self, kernel, block: str):
        self.kernel = kernel
        self.block = block  # the tile size along the sequence axis of the grid
        self.atomic_arg = "ATOMIC_DQ" in kernel.arg_names
        self.d_pad_arg = "D_PAD" in kernel.arg_names
        self.acc64_arg = "ACC64" in kernel.arg_names
        run = getattr(getattr(kernel, "fn", None), "run", None)
        try:
            params = inspect.signature(run).parameters if run is not None else {}
        except (TypeError, ValueError):
            params = {}
        usable = hasattr(kernel, "cache") and "grid" in params and "warmup" in params
        self.run = run if usable else None
        # key -> (config, block, head_major, launch kwargs, constexpr tail, compiled kernels)
        self.known: dict[tuple, tuple] = {}
        self.n_tuned = 0  # len(kernel.cache) when self.known was last in step with it
        self.direct_launches = 0  # for tests: launches that bypassed the autotuner
        self.compiled = DirectLaunch(kernel.fn) if self.run is not None else None

    def __call__(self, key: tuple, n: int, bh: int, tensors: tuple, fixed: FixedArgs) -> None:
        """Launch over (cdiv(n, tile), bh) tiles, or (bh, cdiv(n, tile)) for HEAD_MAJOR, with the
        positional arguments ``tensors`` then ``fixed.args``."""
        hit = self.known.get(key)
        if hit is not None and len(self.kernel.cache) == self.n_tuned:
            config, block, head_major, kwargs, tail, compiled = hit
            tiles = -(-n // block)
            self.kernel.best_config = config
            self.direct_launches += 1
            grid = (bh, tiles) if head_major else (tiles, bh)
            if tail is None:
                self.run(*tensors, *fixed.args, grid=grid, warmup=False, **kwargs)
            else:
                self.compiled.launch(compiled, grid, tensors, fixed, tail, kwargs)
            return
        self._autotuned(key, n, bh, (*tensors, *fixed.args))

    def _autotuned(self, key: tuple, n: int, bh: int, args: tuple) -> None:
        """Launch through the autotuner and keep its choice for ``key``."""
        kernel, block = self.kernel, self.block
        cache = getattr(kernel, "cache", None)
        if cache is None:
            cache = {}
        elif len(cache) != self.n_tuned:  # cleared or filled by someone else: learn again
            self.known.clear()
            flash_native.reset()
        d, causal, dtype, _, _, atomic, big = key
        d_main, d_tail = split_head_dim(d)
        consts = {
            "HEAD_DIM": d,
            "D_MAIN": d_main,
            "D_TAIL": d_tail,
            "DOT_PREC": "ieee" if dtype == torch.float32 else "tf32",
            "CAUSAL": causal,
        }
        if self.d_pad_arg:
            consts["D_PAD"] = _bucket(d)
        if self.atomic_arg:
            consts["ATOMIC_DQ"] = atomic
        if self.acc64_arg:
            consts["ACC64"] = dtype == torch.float32
        if big:
            # Triton's key does not hold batch*heads: a config tuned with fewer of them may put
            # them on grid axis 1 (at most 65535). Forget such choices so the pruner runs again.
            for stale in [k for k, c in cache.items() if not c.kwargs.get("HEAD_MAJOR")]:
                del cache[stale]

        def grid(meta):
            tiles = triton.cdiv(n, meta[block])
            return (bh, tiles) if meta["HEAD_MAJOR"] else (tiles, bh)

        kernel[grid](*args, **consts)
        self.n_tuned = len(cache)
        config = getattr(kernel, "best_config", None)
        if self.run is not None and config is not None and config.pre_hook is None:
            kwargs = {**consts, **config.all_kwargs()}
            # the constexprs after the positional arguments, in the kernel's parameter order
            names = getattr(kernel.fn, "arg_names", [])[len(args):]
            tail = tuple(kwargs[a] for a in names) if set(names) <= kwargs.keys() else None
            head_major = bool(config.kwargs["HEAD_MAJOR"])
            self.known[key] = (config, config.kwargs[block], head_major, kwargs, tail, {})

    def kept_kernel(self, key: tuple, fixed: FixedArgs) -> tuple | None:
        """(CompiledKernel, tile, head_major, constexpr tail) of the direct launch at ``key``
        with ``fixed`` and 16-byte aligned tensors on the current device, once one has run; None
        before that, or where launches go through the autotuner or ``JITFunction.run``."""
        hit = self.known.get(key)
        if self.compiled is None or hit is None or hit[4] is None or len(self.kernel.cache) != self.n_tuned:
            return None
        kernel = self.compiled.kept_aligned(hit[5], fixed)
        return None if kernel is None else (kernel, hit[1], hit[2], hit[4])


_FWD_LAUNCH = _Launcher(_attn_fwd, "BLOCK_M")
_DKDV_LAUNCH = _Launcher(_attn_bwd_dkdv, "BLOCK_N1")
_DQ_LAUNCH = _Launcher(_attn_bwd_dq, "BLOCK_M2")
_LAUNCHERS = (_FWD_LAUNCH, _DQ_LAUNCH, _DKDV_LAUNCH)


# --------------------------------------------------------------------------------------------
# host side
# --------------------------------------------------------------------------------------------


def _check_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    check_attention_inputs(q, k, v)  # also: q, k, v have one dtype
    if not 1 <= q.shape[-1] <= MAX_HEAD_DIM:
        raise ValueError(f"head dim {q.shape[-1]} unsupported; use 1..{MAX_HEAD_DIM}")
    if q.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise ValueError(f"unsupported dtype {q.dtype}; use float16, bfloat16 or float32")
    device = q.device
    if not (device == k.device == v.device):
        raise ValueError(f"q, k, v on different devices: {device}, {k.device}, {v.device}")
    if device.type != "cuda" and not _INTERPRET:
        raise ValueError(
            f"Triton flash attention needs CUDA tensors (got {device}): on the CPU use "
            "lmscope.kernels.flash_attention_torch (lmscope: --attention flash-torch)"
        )


def _as4d(x: torch.Tensor) -> torch.Tensor:
    """(..., n, d) -> (Z, H, n, d), a view where possible, with a unit last-dim stride."""
    if x.ndim == 2:
        x = x[None, None]
    elif x.ndim == 3:
        x = x[None]
    elif x.ndim > 4:
        x = x.reshape(-1, *x.shape[-3:])
    if x.stride(-1) != 1 and x.shape[-1] > 1:
        x = x.contiguous()
    return x


def _out_strides(shape: torch.Size) -> tuple[int, ...] | None:
    """O's strides for q's shape: for (..., H, n, d) those of (..., n, H, d) memory (so
    O.transpose(-3, -2) is contiguous); None (contiguous) for 2-d and 3-d inputs."""
    if len(shape) < 4:
        return None
    *lead, h, n, d = shape
    strides, size = [d, h * d, 1], n * h * d  # (H, n, d) over (n, H, d) memory
    for dim in reversed(lead):
        strides.insert(0, size)
        size *= dim
    return tuple(strides)


def split_head_dim(d: int) -> tuple[int, int]:
    """(D_MAIN, D_TAIL): the kernels' column tiles for head dim ``d``. A power of two (at least
    16) is one tile, (max(16, d), 0). Otherwise the tiles are the largest power of two below d
    and the power of two (at least 16) that covers the rest, where those two are narrower than
    one padded tile (80 = 64 + 16, 96 = 64 + 32, 48 = 32 + 16): the dots then do no work on
    padding columns. ``SPLIT_HEAD_DIM`` off: one padded tile, as before."""
    padded = _bucket(d)
    if SPLIT_HEAD_DIM and padded > 16 and d != padded:
        main = padded // 2
        tail = _bucket(d - main)
        if main + tail < padded:
            return main, tail
    return padded, 0


def _bucket(n: int) -> int:
    """The power of two >= max(n, 16) (triton.next_power_of_2 of it, without the call)."""
    return 1 << (max(n, 16) - 1).bit_length()


def _aligned(n: int) -> int:
    """n elements rounded up to a multiple of 64 (>= 128 bytes): views at that offset keep the
    16-byte alignment Triton specialises pointers on."""
    return (n + 63) // 64 * 64


class _Plan(NamedTuple):
    """What the kernels need besides the tensors, fixed by the shapes, strides, dtype and device
    of q, k, v and causal: computed once per such signature (``_plan_for``), kept on the autograd
    context, so the backward only looks at dO."""

    dtype: torch.dtype
    device: torch.device
    q_shape: torch.Size
    k_shape: torch.Size
    l_shape: torch.Size  # L's: q's without d
    l_strides: tuple  # L's, contiguous: the strides of its view of the forward's buffer
    o_strides_nd: tuple | None  # O's strides (``_out_strides``), None: contiguous
    as_is: bool  # q, k, v (and so O) are read as they are: no 4-d view or copy to make
    bh: int  # batch * heads
    n_q: int
    d: int
    d_pad: int
    l_size: int  # L's floats rounded up (``_aligned``): D's offset in the forward's buffer
    strides: tuple  # (z, h, n) strides of Q, K, V as 4-d tensors
    o_strides: tuple  # the same for O
    scalars: tuple  # (H, n_q, n_k, qk_scale, sm_scale, NQ_BUCKET, NK_BUCKET)
    key: tuple  # the launchers' key, atomic dQ off
    fwd: FixedArgs  # the forward launch's arguments after its tensors
    bwd: dict  # dO's strides -> (dQ launch's, dK/dV launch's FixedArgs), a few
    other_o: dict  # O's (z, h, n) strides -> this plan for that O (direct backward calls), a few
    dq_acc: torch.Tensor  # separate mode's dK/dV dQ-accumulator argument (never read or written)
    native: dict  # flash_native.generation() -> attempts to hand this plan to the C++ path; -1 done
    sm90: bool  # the forward is flash_sm90's Gluon kernel where the tensors allow (not handed to C++)


# Plans by (shapes, strides, dtypes, devices of q, k, v; causal): the forward's checks, views
# and arithmetic once per signature. Cleared when full (a few shapes per model in practice).
_PLANS: dict[tuple, _Plan] = {}
_MAX_PLANS = 64
_MAX_LAYOUTS = 4  # dO layouts, and other O layouts, kept per plan (one per model in practice)


def _signature(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> tuple:
    """Everything ``_check_inputs`` and ``_plan`` read from q, k, v and causal."""
    return (q.shape, q.stride(), k.shape, k.stride(), v.shape, v.stride(),
            q.dtype, k.dtype, v.dtype, q.device, k.device, v.device, causal)  # fmt: skip


def _plan_for(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> _Plan:
    """The plan for q, k, v and causal: kept from an earlier call with the same signature, or
    checked (``_check_inputs``: a new signature raises its ValueError every time) and made."""
    signature = _signature(q, k, v, causal)
    plan = _PLANS.get(signature)
    if plan is None:
        _check_inputs(q, k, v)
        plan = _plan(q, k, v, causal)
        # Only plain tensors' plans are kept: a subclass's (a fake tensor while a compiler traces,
        # say) would hold a dQ-accumulator argument of that subclass for later real calls.
        if type(q) is torch.Tensor and type(k) is torch.Tensor and type(v) is torch.Tensor:
            if len(_PLANS) >= _MAX_PLANS:
                _PLANS.clear()
            _PLANS[signature] = plan
    return plan


def _plan(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> _Plan:
    """A new plan for checked q, k, v (views taken here only for their strides; O's from a meta
    tensor of its layout)."""
    q4, k4, v4 = _as4d(q), _as4d(k), _as4d(v)
    o_strides_nd = _out_strides(q.shape)
    o_meta = torch.empty(q.shape, device="meta") if o_strides_nd is None else torch.empty_strided(
        q.shape, o_strides_nd, device="meta")  # fmt: skip
    n_q, d = q.shape[-2], q.shape[-1]
    n_k = k.shape[-2]
    h = q4.shape[1]
    bh = q4.shape[0] * h
    nq_bucket, nk_bucket = _bucket(n_q), _bucket(n_k)
    sm_scale = 1.0 / math.sqrt(d)
    strides = (*q4.stride()[:3], *k4.stride()[:3], *v4.stride()[:3])
    o_strides = _as4d(o_meta).stride()[:3]
    scalars = (h, n_q, n_k, sm_scale * LOG2E, sm_scale, nq_bucket, nk_bucket)
    return _Plan(
        dtype=q.dtype, device=q.device, q_shape=q.shape, k_shape=k.shape, l_shape=q.shape[:-1],
        l_strides=torch.empty(q.shape[:-1], device="meta").stride(),
        o_strides_nd=o_strides_nd, as_is=q4 is q and k4 is k and v4 is v, bh=bh, n_q=n_q, d=d,
        d_pad=_bucket(d),  # max(16, next power of two): no Triton call per call
        l_size=_aligned(bh * n_q), strides=strides, o_strides=o_strides, scalars=scalars,
        key=(d, causal, q.dtype, nq_bucket, nk_bucket, False, bh > 65535),
        fwd=FixedArgs((*strides, *o_strides, h, n_q, n_k, sm_scale * LOG2E, nq_bucket, nk_bucket)),
        bwd={}, other_o={}, dq_acc=_dummy_accumulator(q.device), native={},
        sm90=flash_sm90.serves(q, bh * n_q * n_k * d),
    )  # fmt: skip


def _dummy_accumulator(device: torch.device) -> torch.Tensor:
    """The separate mode's dQ-accumulator argument, which the autotuner zeroes while it tunes:
    a normal tensor even when the plan is made under ``torch.inference_mode`` (an inference
    tensor cannot be zeroed by a later training call's tuning)."""
    with torch.inference_mode(False):
        return torch.empty(4, dtype=torch.float32, device=device)


def _plan_for_o_layout(plan: _Plan, o_strides: tuple) -> _Plan:
    """``plan`` for an O of other (z, h, n) strides than the forward's, kept on the plan (a few
    layouts) so that its launch arguments, and with them the direct launch, are reused."""
    other = plan.other_o.get(o_strides)
    if other is None:
        if len(plan.other_o) >= _MAX_LAYOUTS:
            plan.other_o.clear()
        other = plan.other_o[o_strides] = plan._replace(o_strides=o_strides, bwd={}, other_o={}, native={})
    return other


def _bwd_args(plan: _Plan, do_strides: tuple) -> tuple[FixedArgs, FixedArgs]:
    """The dQ and dK/dV launches' arguments after their tensors, for dO's 4-d strides
    ``do_strides`` (its (z, h, n, d) strides): made once per plan and dO layout."""
    fixed = plan.bwd.get(do_strides)
    if fixed is None:
        if len(plan.bwd) >= _MAX_LAYOUTS:
            plan.bwd.clear()
        strides = (*plan.strides, *do_strides[:3])
        fixed = plan.bwd[do_strides] = (
            FixedArgs((*strides, *plan.o_strides, *plan.scalars)), FixedArgs((*strides, *plan.scalars)))
    return fixed


def _scratch(plan: _Plan, atomic: bool) -> int:
    """Float32 elements the backward needs besides L: D = rowsum(dO * O) (bh, n_q), then the
    atomic-mode dQ accumulator (separate mode passes ``plan.dq_acc``, which its dK/dV kernel
    never touches; only the autotuner zeroes it, reset_to_zero, while benchmarking)."""
    n_rows = plan.bh * plan.n_q
    return (_aligned(n_rows) + n_rows * plan.d_pad) if atomic else n_rows


def _forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scratch: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, tuple, _Plan]:
    """The forward launch. Returns (O, L, buffer, (Q, K, V) as the kernel read them, plan).

    L is float32 (..., n_queries). Without ``scratch``, buffer is None and L a tensor of its own;
    with it, buffer is one flat float32 allocation that holds L at its head (L is a view of it)
    and the separate-mode backward's D at ``plan.l_size``: one allocation fewer per backward."""
    plan = _plan_for(q, k, v, bool(causal))
    if plan.o_strides_nd is None:
        o = torch.empty(plan.q_shape, dtype=plan.dtype, device=plan.device)
    else:  # a tensor of its own with those strides, not a view: callers may modify it in place
        o = torch.empty_strided(plan.q_shape, plan.o_strides_nd, dtype=plan.dtype, device=plan.device)
    if plan.as_is:
        q4, k4, v4, o4 = q, k, v, o
    else:  # merging the dims before H keeps O's memory: o4 is a view
        q4, k4, v4, o4 = _as4d(q), _as4d(k), _as4d(v), _as4d(o)
    # Contiguous: the kernel indexes L by (batch*head, row) without strides.
    if scratch:
        buffer = torch.empty(plan.l_size + _scratch(plan, False), dtype=torch.float32, device=plan.device)
        lse = buffer.as_strided(plan.l_shape, plan.l_strides)
    else:
        buffer, lse = None, torch.empty(plan.l_shape, dtype=torch.float32, device=plan.device)
    if _gluon_serves(plan, q4, k4, v4, o4):
        flash_sm90.forward(q4, k4, v4, o4, lse, plan.key[1], plan.scalars[3])
        _LAST_KERNELS["forward"] = "gluon-sm90"
    else:
        _FWD_LAUNCH(plan.key, plan.n_q, plan.bh, (q4, k4, v4, o4, lse), plan.fwd)
        _LAST_KERNELS["forward"] = "triton"
    return o, lse, buffer, (q4, k4, v4), plan


# Which kernels the last Python-path forward and backward launched (a benchmark row records
# them: the Gluon sm_90 kernels or the Triton ones). The C++ host path serves only plans whose
# kernels are all Triton's, the ones its plan's Python calls recorded here before.
_LAST_KERNELS: dict[str, str] = {}


def last_kernels() -> dict[str, str]:
    """{"forward", "dq", "dkdv"} -> "gluon-sm90" or "triton" (for dQ accumulated by the dK/dV
    kernel: "gluon-sm90-atomic" or "triton-atomic"): what the last forward and backward here
    launched."""
    return dict(_LAST_KERNELS)


def flash_attention_forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Forward kernel only. Returns (O with q's shape and dtype, L float32 (..., n_queries)).

    For inputs of 4+ dims O has (..., n_queries, H, d) memory order (module docstring)."""
    o, lse, _, _, _ = _forward(q, k, v, causal, False)
    return o, lse


def _prepared_do(do: torch.Tensor, plan: _Plan) -> torch.Tensor:
    """dO as the backward kernels read it: the plan's dtype, 4-d, no zero strides."""
    if do.dtype != plan.dtype:
        do = do.to(plan.dtype)
    do4 = _as4d(do)
    if 0 in do4.stride():  # e.g. the expanded gradient of o.sum()
        do4 = do4.contiguous()
    return do4


def _backward(
    do4: torch.Tensor, q4, k4, v4, o, lse: torch.Tensor, f32: torch.Tensor, plan: _Plan, atomic: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The backward launches for ``do4`` (``_prepared_do``). ``o`` is O as the forward returned
    it (any rank: the Triton kernels read it through ``plan.o_strides``). ``lse`` and ``f32``
    are passed by pointer: L at the head of ``lse``, D at the head of ``f32``, which holds
    ``_scratch(plan, atomic)`` floats, 16-byte aligned; ``atomic`` says whether dQ is
    accumulated by the dK/dV kernel."""
    do_strides = do4.stride()
    dq_args, dkdv_args = _bwd_args(plan, do_strides)
    bh, n_q = plan.bh, plan.n_q
    # Contiguous, as the kernels assume (they index dQ, dK, dV without strides). Three tensors of
    # their own, not views of one buffer: each may become a leaf's .grad as it is.
    dq = torch.empty(plan.q_shape, dtype=plan.dtype, device=plan.device)
    dk = torch.empty(plan.k_shape, dtype=plan.dtype, device=plan.device)
    dv = torch.empty(plan.k_shape, dtype=plan.dtype, device=plan.device)
    key = plan.key
    gluon_dkdv = _gluon_dkdv(plan, q4, k4, v4, do4, atomic)
    o_sm90 = None if atomic or not flash_sm90_dq.ENABLED else _sm90_backward_o(plan, q4, k4, v4, do4, o)
    gluon_dq = o_sm90 is not None
    if atomic:
        key = (*key[:5], True, key[6])
        dq_acc = f32[_aligned(bh * n_q) :]
        pre_block = 16 if _INTERPRET else 128
        _bwd_preprocess[(triton.cdiv(n_q, pre_block), bh)](
            o, do4, f32, dq_acc, *plan.o_strides, *do_strides[:3], plan.scalars[0], n_q,
            HEAD_DIM=plan.d, D_PAD=plan.d_pad, BLOCK_M=pre_block, ACC64=plan.dtype == torch.float32,
        )  # fmt: skip
        _LAST_KERNELS["dq"] = "gluon-sm90-atomic" if gluon_dkdv else "triton-atomic"
    else:  # the dQ kernel computes D for its rows and stores it: it runs first
        dq_acc = plan.dq_acc
        if gluon_dq:
            flash_sm90_dq.dq(q4, k4, v4, do4, o_sm90, lse, f32, _as4d(dq), key[1], *plan.scalars[3:5])
        else:
            _DQ_LAUNCH(key, n_q, bh, (q4, k4, v4, do4, o, lse, f32, dq), dq_args)
        _LAST_KERNELS["dq"] = "gluon-sm90" if gluon_dq else "triton"
    if gluon_dkdv:
        # its dQ rows are d floats apart: the Gluon head dims are powers of two (d_pad == d)
        flash_sm90_dkdv.dkdv(q4, k4, v4, do4, lse, f32, _as4d(dk), _as4d(dv), key[1], *plan.scalars[3:5],
                             dq_acc=dq_acc if atomic else None)  # fmt: skip
    else:
        dkdv_tensors = (q4, k4, v4, do4, lse, f32, dk, dv, dq_acc)
        _DKDV_LAUNCH(key, plan.scalars[2], bh, dkdv_tensors, dkdv_args)
    _LAST_KERNELS["dkdv"] = "gluon-sm90" if gluon_dkdv else "triton"
    if atomic:
        acc = dq_acc[: bh * n_q * plan.d_pad].view(bh, n_q, plan.d_pad)[..., : plan.d]
        torch.mul(acc, plan.scalars[4], out=dq.view(acc.shape))  # scaled and cast in one pass
    return dq, dk, dv


def _gluon_serves(plan: _Plan, q4, k4, v4, x: torch.Tensor) -> bool:
    """Whether the Gluon kernels may serve this call (the backward's have their own switches
    too): plans that chose them (``plan.sm90``), tensors TMA can describe. ``x`` is O in the
    forward, dO in the backward; it may have its own axis order."""
    return (plan.sm90 and type(q4) is torch.Tensor and flash_sm90.describable(q4, k4, v4)
            and flash_sm90.describable(x))  # fmt: skip


def _gluon_dkdv(plan: _Plan, q4, k4, v4, do4, atomic: bool) -> bool:
    """Whether the Gluon dK/dV kernel serves this backward (in atomic mode, with dQ's TMA
    reduce-adds, which this Triton must have)."""
    return (flash_sm90_dkdv.ENABLED and _gluon_serves(plan, q4, k4, v4, do4)
            and (not atomic or flash_sm90.HAVE_TMA_REDUCE))  # fmt: skip


def _sm90_backward_o(plan: _Plan, q4, k4, v4, do4, o) -> torch.Tensor | None:
    """O's 4-d view when the Gluon dQ kernel may serve this backward (separate dQ mode), else
    None: it reads O by TMA too, in its own axis order. O comes as it was saved (the Triton
    kernels take it by pointer and the plan's strides); the descriptor needs its view."""
    if not _gluon_serves(plan, q4, k4, v4, do4):
        return None
    o4 = _as4d(o)
    return o4 if flash_sm90.describable(o4) else None


def _dq_mode(dq_mode: str | None) -> str:
    """``dq_mode``, default ``DQ_MODE``; ValueError for an unknown mode."""
    mode = dq_mode or DQ_MODE
    if mode not in _DQ_MODES:
        raise ValueError(f"dq_mode must be one of {', '.join(_DQ_MODES)}, got {mode!r}")
    return mode


def _atomic_dq(mode: str, plan: _Plan, q4, k4, v4, do4) -> bool:
    """Whether this backward accumulates dQ in the dK/dV kernel (``mode`` from ``_dq_mode``)."""
    if mode == "auto":
        return _gluon_dkdv(plan, q4, k4, v4, do4, True)
    return mode == "atomic"


def flash_attention_backward(
    do: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    o: torch.Tensor,
    lse: torch.Tensor,
    causal: bool = False,
    dq_mode: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Backward kernels. Returns (dQ, dK, dV) with the shapes and dtype of q, k, v."""
    mode = _dq_mode(dq_mode)
    if do.shape != o.shape:
        raise ValueError(f"dO shape {tuple(do.shape)} != O shape {tuple(o.shape)}")
    plan = _plan_for(q, k, v, bool(causal))
    o4 = _as4d(o)
    if o4.stride()[:3] != plan.o_strides:  # not the forward's layout: a plan of its own, kept
        plan = _plan_for_o_layout(plan, o4.stride()[:3])
    q4, k4, v4 = (q, k, v) if plan.as_is else (_as4d(q), _as4d(k), _as4d(v))
    if not lse.is_contiguous():  # read as (batch*heads, n_q) rows
        lse = lse.contiguous()
    do4 = _prepared_do(do, plan)
    atomic = _atomic_dq(mode, plan, q4, k4, v4, do4)
    f32 = torch.empty(_scratch(plan, atomic), dtype=torch.float32, device=plan.device)
    return _backward(do4, q4, k4, v4, o4, lse, f32, plan, atomic)


class FlashAttentionTriton(torch.autograd.Function):
    """FlashAttention-2 in Triton. ``FlashAttentionTriton.apply(q, k, v, is_causal=False)``.

    Saves Q, K, V (as the kernels read them), O, and exactly one log-sum-exp tensor L, float32,
    shape (..., n_queries) (docs/kernels/flash_attention.md, "Contract"); unless the dQ mode is
    "atomic", also the flat float32 buffer that L is a view of, whose tail is the separate-mode
    backward's scratch (one allocation for both; an atomic backward allocates its own). The
    strides, scalars and launch keys the forward computed are kept for the backward (``_Plan``).
    """

    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False):
        mode = _dq_mode(None)
        o, lse, buffer, (q4, k4, v4), plan = _forward(q, k, v, is_causal, mode != "atomic")
        if buffer is None:
            ctx.save_for_backward(q4, k4, v4, o, lse)
        else:
            ctx.save_for_backward(q4, k4, v4, o, lse, buffer)
        ctx.plan = plan
        ctx.dq_mode = mode
        return o

    @staticmethod
    def backward(ctx, do: torch.Tensor):
        q4, k4, v4, o, lse, *buffer = ctx.saved_tensors
        plan = _plan_of_saved(ctx.plan, q4, k4, v4, o)
        do4 = _prepared_do(do, plan)
        atomic = _atomic_dq(ctx.dq_mode, plan, q4, k4, v4, do4)
        if atomic:  # its dQ accumulator is not kept from forward to backward
            f32 = torch.empty(_scratch(plan, True), dtype=torch.float32, device=plan.device)
        else:
            f32 = buffer[0][plan.l_size :]
        # the kernels take O and L by pointer: the saved tensors serve as they are
        grads = _backward(do4, q4, k4, v4, o, lse, f32, plan, atomic)
        if plan is not ctx.plan:  # planned for the 4-d views: the inputs' own shapes back
            shapes = (ctx.plan.q_shape, ctx.plan.k_shape, ctx.plan.k_shape)
            grads = tuple(g.view(shape) for g, shape in zip(grads, shapes, strict=True))
        elif not atomic and plan.as_is and flash_native.ENABLED:
            _hand_to_native(plan, q4, k4, v4, do4.stride())
        return (*grads, None)


def _plan_of_saved(
    plan: _Plan, q4: torch.Tensor, k4: torch.Tensor, v4: torch.Tensor, o: torch.Tensor
) -> _Plan:
    """The plan for the saved tensors as the backward got them back: the forward's, unless a
    saved-tensor hook (``torch.autograd.graph.save_on_cpu``, say) unpacked them in another layout,
    whose strides the kernels must be given instead."""
    strides = (*q4.stride()[:3], *k4.stride()[:3], *v4.stride()[:3])
    o_strides = _as4d(o).stride()
    if strides == plan.strides and o_strides[:3] == plan.o_strides and o_strides[3] == 1 and (
            q4.stride(-1) == k4.stride(-1) == v4.stride(-1) == 1):  # fmt: skip
        return plan
    saved = _plan_for(q4, k4, v4, plan.key[1])
    return saved if o_strides[:3] == saved.o_strides else _plan_for_o_layout(saved, o_strides[:3])


# The C++ host path (flash_native): the extension once a plan has been handed over, and how
# many ``python_path()`` blocks are open (the FLOP counter patches the Python Function).
_NATIVE = None
_PYTHON_ONLY = [0]
_NATIVE_TRIES = 4  # Python backwards per plan that may try the hand-over (kernels kept by the 2nd)
# The CompiledKernels whose CUfunctions C++ plans launch: kept alive here for good (newer Tritons
# unload a kernel's module when its CompiledKernel is collected; Triton's own caches hold them too).
_NATIVE_KERNELS: set = set()
# Tensor table indices of csrc/flash_native.cpp (Q K V O L D DO DQ DK DV DQ_ACC), per launch in
# the kernels' argument order.
_FWD_SLOTS = (0, 1, 2, 3, 4)  # Q K V O LSE
_DQ_SLOTS = (0, 1, 2, 6, 3, 4, 5, 7)  # Q K V DO O LSE DELTA DQ
_DKDV_SLOTS = (0, 1, 2, 6, 4, 5, 8, 9, 10)  # Q K V DO LSE DELTA DK DV DQ_ACC


def _hand_to_native(
    plan: _Plan, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, do_strides: tuple
) -> None:
    """Give ``plan`` to the C++ host path once all three of its kernels have been launched
    directly (kept), for dO of ``do_strides``; a few tries per plan and ``flash_native``
    generation, then no more."""
    global _NATIVE
    generation = flash_native.generation()
    tries = plan.native.get(generation, 0)
    if tries < 0 or tries >= _NATIVE_TRIES or type(q) is not torch.Tensor or not q.is_cuda or plan.sm90:
        return
    if not (plan.bh and plan.n_q and plan.scalars[2]):
        return  # nothing to launch
    plan.native.clear()
    plan.native[generation] = tries + 1
    dq_args, dkdv_args = _bwd_args(plan, do_strides)
    launches, kernels = [], []
    for launcher, fixed, n, slots in (
        (_FWD_LAUNCH, plan.fwd, plan.n_q, _FWD_SLOTS),
        (_DQ_LAUNCH, dq_args, plan.n_q, _DQ_SLOTS),
        (_DKDV_LAUNCH, dkdv_args, plan.scalars[2], _DKDV_SLOTS),
    ):
        kept = launcher.kept_kernel(plan.key, fixed)
        if kept is None:
            return
        compiled, block, head_major, tail = kept
        params = flash_native.param_slots(compiled, slots, (*fixed.args, *tail))
        if params is None:
            plan.native[generation] = _NATIVE_TRIES
            return
        tiles = -(-n // block)
        grid = (plan.bh, tiles) if head_major else (tiles, plan.bh)
        meta = compiled.metadata
        launches.append((compiled.function, *grid, 32 * meta.num_warps, meta.shared, *params))
        kernels.append(compiled)
    ext = flash_native.extension()
    if ext is None:
        plan.native[generation] = _NATIVE_TRIES
        return
    _NATIVE_KERNELS.update(kernels)
    try:
        ext.add_plan(q, k, v, plan.key[1], list(plan.o_strides_nd or ()), plan.l_size + _scratch(plan, False),
                     plan.l_size, list(do_strides), plan.dq_acc, *launches)  # fmt: skip
    except RuntimeError as error:  # e.g. the CUDA driver's entry points not found: stay on Python
        plan.native[generation] = _NATIVE_TRIES
        warnings.warn(f"lmscope flash attention: the C++ host path refused a plan ({error}); "
                      "this shape stays on the Python path", stacklevel=2)  # fmt: skip
        return
    plan.native[generation] = -1
    _NATIVE = ext


@contextlib.contextmanager
def python_path() -> Iterator[None]:
    """Inside, every ``flash_attention`` call goes through ``FlashAttentionTriton`` (Python), not
    the C++ host path: for code that patches or observes the Python Function (FLOP counting)."""
    _PYTHON_ONLY[0] += 1
    try:
        yield
    finally:
        _PYTHON_ONLY[0] -= 1


def _native_allowed() -> bool:
    """Whether the C++ path may launch now: nobody asked for the Python path, no compiler is
    tracing, the dQ mode is not the atomic one (its plans were made in separate mode, which
    "auto" is for every plan it hands over: the Gluon kernels' plans stay in Python), no
    autotuner's cache was cleared since (re-tuning: the Python path learns again and resets the
    C++ plans), and Triton would launch the kept kernels as they are (no launch or pre-run
    hooks, default debug and instrumentation knobs)."""
    return (
        not _PYTHON_ONLY[0]
        and DQ_MODE != "atomic"
        and not torch.compiler.is_compiling()
        and all(len(launcher.kernel.cache) == launcher.n_tuned for launcher in _LAUNCHERS)
        and _FWD_LAUNCH.compiled.unhooked()
        and not getattr(_DQ_LAUNCH.kernel.fn, "pre_run_hooks", None)
        and not getattr(_DKDV_LAUNCH.kernel.fn, "pre_run_hooks", None)
    )


def flash_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False
) -> torch.Tensor:
    """softmax(q k^T / sqrt(d)) v with the Triton FlashAttention-2 kernels; differentiable.

    Once a signature of q, k, v has run forward and backward a few times through the Python
    Function, later calls take the C++ host path (lmscope.kernels.flash_native): the same
    kernels and arguments, less host time per call."""
    if _NATIVE is not None and _native_allowed():
        o = _NATIVE.apply(q, k, v, bool(causal))
        if o is not None:
            return o
    return FlashAttentionTriton.apply(q, k, v, causal)
