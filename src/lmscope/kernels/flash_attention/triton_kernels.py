"""The Triton FlashAttention-2 kernels (the portable family: any GPU Triton supports).

forward (``_attn_fwd``): grid over (query tiles, batch*heads) -- in either order, an autotuned
choice -- with the query-tile id reversed so the heaviest causal tiles start first; online softmax
in the log2 domain (scores pre-scaled by log2(e)/sqrt(d), ``exp2``); writes O and L.
backward: (1) dQ kernel (``_attn_bwd_dq``): one query tile resident, loop over key tiles (no
atomics); it also computes D = rowsum(dO * O) for its rows (fp64 sum for fp32 inputs: dP - D
cancels) and stores it; (2) dK/dV kernel (``_attn_bwd_dkdv``): one key/value tile resident, loop
over query tiles, recompute P^T = exp2(K Q^T * c - L2), reading D. The atomic dQ mode instead
computes D in ``_bwd_preprocess`` and adds dQ from the dK/dV kernel into a zeroed float32 buffer
(per-element atomics). O is written through its strides; dQ, dK, dV are contiguous and indexed
without stride arguments. Causal key loops are split into an unmasked part (tiles fully below the
diagonal and inside the sequence) and a masked part (diagonal and ragged tail).

Under ``TRITON_INTERPRET=1`` dots are upcast to fp32 and fp32 -> bf16 is rounded by hand (the
interpreter's bf16 dot and rounding are wrong); the variable must be set before import.
"""

from __future__ import annotations

import triton
import triton.language as tl

from lmscope.kernels.flash_attention.tuning import (
    _DKDV,
    _DQ,
    _FWD,
    _INTERPRET,
    _NO_SPEC,
    _TUNE_KEY,
    _autotune_kwargs,
    _configs,
    _pruner,
)

# Triton's CPU interpreter mis-computes bfloat16 dots (seen with Triton 3.9): there, dot operands
# are upcast to float32 after the same roundings the GPU path does, so results stay comparable.
_UPCAST_DOTS = tl.constexpr(_INTERPRET)


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
