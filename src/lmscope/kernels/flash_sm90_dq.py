"""FlashAttention backward's dQ (and D = rowsum(dO * O)) for Hopper (sm_90) in Gluon,
warp-specialised like ``flash_sm90``'s forward.

One program holds ``BLOCK_M`` query rows: two consumer warpgroups own 64 rows each (their Q, dO
tiles stay in shared memory, their fp32 dQ accumulator in registers) and a load warp streams
``BLOCK_N``-key tiles of K and V through a ring of ``STAGES`` buffers. Each warpgroup first
computes D for its rows from its O and dO tiles and stores it for the dK/dV kernel, which runs
next. Per key tile it issues ``S = Q K^T`` and ``dP = dO V^T`` for the next tile together with
``dQ += dS K`` for this one, waits for the first two only, and forms the next tile's
``P = exp2(S c - L log2 e)`` and ``dS = P (dP - D)`` while ``dS K`` is still on the tensor cores.

It is the Triton dQ kernel's contract (``flash_attention.triton_kernels._attn_bwd_dq``): L from the forward,
D stored at ``DELTA``, both indexed (batch*head, row); dQ written contiguous (..., n_q, d).
"""

from __future__ import annotations

import torch

from lmscope.envflags import env_flag
from lmscope.kernels import flash_sm90
from lmscope.kernels.flash_sm90 import HAVE_GLUON

ENABLED = env_flag("LMSCOPE_FLASH_SM90_DQ", default=True)  # off: the Triton dQ kernel
BLOCK_M = 128  # query rows per program: two warpgroups of 64
BLOCK_N = 64  # keys per step
STAGES = 3  # K/V ring depth
NUM_WARPS = 4  # the default partition: the first consumer warpgroup

if HAVE_GLUON:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared,
        mbarrier,
        tma,
        warpgroup_mma,
        warpgroup_mma_wait,
    )

    from lmscope.kernels.flash_sm90 import (
        REGS_CONSUMER,
        REGS_LOADER,
        _barriers,
        _free_ring,
        _invalidate,
        _key_tiles,
        _mma_layout,
        _query_block,
        _ring,
        _tile,
        _tiles,
        _tma_load,
        _tma_store,
        _warps_barrier,
    )

    @gluon.jit
    def _loader(q_desc, k_desc, v_desc, do_desc, o_desc, q_smem, do_smem, o_smem, k_smem, v_smem, rows_bar,
                ready, empty, z, h, start_m, n_tiles, TOKEN_MAJOR: gl.constexpr, DO_TOKEN_MAJOR: gl.constexpr,
                O_TOKEN_MAJOR: gl.constexpr, ROWS: gl.constexpr, BLOCK_N: gl.constexpr,
                STAGES: gl.constexpr):  # fmt: skip
        """The load warp: both warpgroups' Q, dO and O tiles once, then K and V tile j into
        stage j % STAGES once both warpgroups have released what that stage held."""
        nbytes: gl.constexpr = q_desc.block_type.nbytes + do_desc.block_type.nbytes + o_desc.block_type.nbytes
        mbarrier.expect(rows_bar, 2 * nbytes)
        for wg in gl.static_range(2):
            row = start_m + wg * ROWS
            _tma_load(q_desc, _tile(q_desc, z, h, row, TOKEN_MAJOR), rows_bar, q_smem.index(wg))
            _tma_load(do_desc, _tile(do_desc, z, h, row, DO_TOKEN_MAJOR), rows_bar, do_smem.index(wg))
            _tma_load(o_desc, _tile(o_desc, z, h, row, O_TOKEN_MAJOR), rows_bar, o_smem.index(wg))
        for j in range(n_tiles):
            stage = j % STAGES
            mbarrier.wait(empty.index(stage), ((j // STAGES) - 1) & 1, pred=j >= STAGES)
            bar = ready.index(stage)
            mbarrier.expect(bar, k_desc.block_type.nbytes + v_desc.block_type.nbytes)
            _tma_load(k_desc, _tile(k_desc, z, h, j * BLOCK_N, TOKEN_MAJOR), bar, k_smem.index(stage))
            _tma_load(v_desc, _tile(v_desc, z, h, j * BLOCK_N, TOKEN_MAJOR), bar, v_smem.index(stage))

    @gluon.jit
    def _scores(q, do, k_smem, v_smem, ready, j, s_zero, STAGES: gl.constexpr, BLOCK_N: gl.constexpr,
                HEAD_DIM: gl.constexpr):  # fmt: skip
        """Issue S_j = Q K_j^T and dP_j = dO V_j^T (asynchronous; returns their tokens)."""
        stage = j % STAGES
        mbarrier.wait(ready.index(stage), (j // STAGES) & 1)
        k = k_smem.index(stage).reshape([BLOCK_N, HEAD_DIM])
        v = v_smem.index(stage).reshape([BLOCK_N, HEAD_DIM])
        s_tok = warpgroup_mma(q, k.permute((1, 0)), s_zero, use_acc=False, is_async=True)
        dp_tok = warpgroup_mma(do, v.permute((1, 0)), s_zero, use_acc=False, is_async=True)
        return s_tok, dp_tok

    @gluon.jit
    def _grad_scores(s, dp, lse2, delta, offs_m, start_n, full_hi, n_k, qk_scale, CAUSAL: gl.constexpr,
                     BLOCK_N: gl.constexpr, s_layout: gl.constexpr):  # fmt: skip
        """dS = P (dP - D) of one key tile, P recomputed from S and L; masked past full_hi."""
        p = gl.exp2(s * qk_scale - gl.expand_dims(lse2, 1))
        if start_n >= full_hi:
            offs_n = start_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
            keep = gl.expand_dims(offs_n, 0) < n_k
            if CAUSAL:
                keep = keep & (gl.expand_dims(offs_n, 0) <= gl.expand_dims(offs_m, 1))
            p = gl.where(keep, p, 0.0)
        return p * (dp - gl.expand_dims(delta, 1))

    @gluon.jit
    def _consumer(q_smem, do_smem, o_smem, k_smem, v_smem, rows_bar, ready, empty, dq_desc, LSE, DELTA, z, h,
                  off_bh, start_m, n_tiles, full_hi, n_q, n_k, qk_scale, sm_scale, WG: gl.constexpr,
                  HEAD_DIM: gl.constexpr, CAUSAL: gl.constexpr, ROWS: gl.constexpr, BLOCK_N: gl.constexpr,
                  STAGES: gl.constexpr):  # fmt: skip
        """One warpgroup's ROWS query rows: D, then dQ over the key tiles, stored by TMA."""
        num_warps: gl.constexpr = gl.num_warps()
        dtype: gl.constexpr = dq_desc.dtype
        s_layout: gl.constexpr = _mma_layout(num_warps, BLOCK_N)
        acc_layout: gl.constexpr = _mma_layout(num_warps, HEAD_DIM)
        op_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)
        row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
        rows_layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [num_warps, 1], [1, 0])

        row0 = start_m + WG * ROWS
        q = q_smem.index(WG).reshape([ROWS, HEAD_DIM])
        do = do_smem.index(WG).reshape([ROWS, HEAD_DIM])
        offs_m = row0 + gl.arange(0, ROWS, layout=row_s)
        m_ok = offs_m < n_q
        rows = off_bh.to(gl.int64) * n_q + offs_m
        lse2 = gl.load(LSE + rows, mask=m_ok, other=0.0) * 1.4426950408889634

        mbarrier.wait(rows_bar, 0)
        # D = rowsum(dO * O) for these rows, kept for the dK/dV kernel
        o_rows = o_smem.index(WG).reshape([ROWS, HEAD_DIM]).load(rows_layout).to(gl.float32)
        do_rows = do.load(rows_layout).to(gl.float32)
        delta = gl.convert_layout(gl.sum(o_rows * do_rows, axis=1), row_s)
        gl.store(DELTA + rows, delta, mask=m_ok)

        dq = gl.zeros([ROWS, HEAD_DIM], gl.float32, layout=acc_layout)
        s_zero = gl.zeros([ROWS, BLOCK_N], gl.float32, layout=s_layout)
        s_tok, dp_tok = _scores(q, do, k_smem, v_smem, ready, 0, s_zero, STAGES, BLOCK_N, HEAD_DIM)
        s, dp = warpgroup_mma_wait(num_outstanding=0, deps=(s_tok, dp_tok))
        ds = _grad_scores(s, dp, lse2, delta, offs_m, 0, full_hi, n_k, qk_scale, CAUSAL, BLOCK_N, s_layout)
        for j in range(0, n_tiles - 1):
            # S, dP of tile j+1 with dQ += dS_j K_j; the next dS is formed while dS_j K_j runs.
            s_tok, dp_tok = _scores(q, do, k_smem, v_smem, ready, j + 1, s_zero, STAGES, BLOCK_N, HEAD_DIM)
            k_cur = k_smem.index(j % STAGES).reshape([BLOCK_N, HEAD_DIM])
            ds_op = gl.convert_layout(ds.to(dtype), op_layout)
            dq_tok = warpgroup_mma(ds_op, k_cur, dq, is_async=True)
            s, dp = warpgroup_mma_wait(num_outstanding=1, deps=(s_tok, dp_tok))
            ds = _grad_scores(s, dp, lse2, delta, offs_m, (j + 1) * BLOCK_N, full_hi, n_k, qk_scale, CAUSAL,
                              BLOCK_N, s_layout)  # fmt: skip
            dq, ds_op = warpgroup_mma_wait(num_outstanding=0, deps=(dq_tok, ds_op))
            _warps_barrier()  # this warpgroup's four warps are past tile j: release its stage
            mbarrier.arrive(empty.index(j % STAGES))
        last = n_tiles - 1
        k_last = k_smem.index(last % STAGES).reshape([BLOCK_N, HEAD_DIM])
        ds_op = gl.convert_layout(ds.to(dtype), op_layout)
        dq_tok = warpgroup_mma(ds_op, k_last, dq, is_async=True)
        dq, ds_op = warpgroup_mma_wait(num_outstanding=0, deps=(dq_tok, ds_op))

        # dQ through this warpgroup's Q buffer (no longer read), clipped at n_q.
        q.store((dq * sm_scale).to(dtype))
        fence_async_shared()
        _tma_store(dq_desc, [z, h, row0, 0], q.reshape(dq_desc.block_type.shape))
        tma.store_wait(pendings=0)

    @gluon.jit
    def _attn_bwd_dq_sm90(
        q_desc, k_desc, v_desc, do_desc, o_desc, dq_desc, LSE, DELTA,
        H, n_q, n_k, qk_scale, sm_scale,
        HEAD_DIM: gl.constexpr, CAUSAL: gl.constexpr, TOKEN_MAJOR: gl.constexpr,
        DO_TOKEN_MAJOR: gl.constexpr, O_TOKEN_MAJOR: gl.constexpr, BLOCK_M: gl.constexpr,
        BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
    ):  # fmt: skip
        off_bh, z, h, start_m = _query_block(H, BLOCK_M)
        ROWS: gl.constexpr = BLOCK_M // 2

        q_smem = _tiles(q_desc, 2)
        do_smem = _tiles(do_desc, 2)
        o_smem = _tiles(o_desc, 2)
        k_smem = _tiles(k_desc, STAGES)
        v_smem = _tiles(v_desc, STAGES)
        rows_bars = _barriers(1, 1)
        rows_bar = rows_bars.index(0)
        ready, empty = _ring(STAGES)

        n_tiles, full_hi = _key_tiles(start_m, n_k, BLOCK_M, BLOCK_N, CAUSAL)

        gl.warp_specialize(
            [
                (_consumer, (q_smem, do_smem, o_smem, k_smem, v_smem, rows_bar, ready, empty, dq_desc, LSE,
                             DELTA, z, h, off_bh, start_m, n_tiles, full_hi, n_q, n_k, qk_scale, sm_scale, 0,
                             HEAD_DIM, CAUSAL, ROWS, BLOCK_N, STAGES)),
                (_consumer, (q_smem, do_smem, o_smem, k_smem, v_smem, rows_bar, ready, empty, dq_desc, LSE,
                             DELTA, z, h, off_bh, start_m, n_tiles, full_hi, n_q, n_k, qk_scale, sm_scale, 1,
                             HEAD_DIM, CAUSAL, ROWS, BLOCK_N, STAGES)),
                (_loader, (q_desc, k_desc, v_desc, do_desc, o_desc, q_smem, do_smem, o_smem, k_smem, v_smem,
                           rows_bar, ready, empty, z, h, start_m, n_tiles, TOKEN_MAJOR, DO_TOKEN_MAJOR,
                           O_TOKEN_MAJOR, ROWS, BLOCK_N, STAGES)),
            ],
            [4, 1],
            [REGS_CONSUMER, REGS_LOADER],
        )  # fmt: skip

        _invalidate(rows_bars, 1)
        _free_ring(ready, empty, STAGES)


def dq_launch(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, do: torch.Tensor, o: torch.Tensor,
              lse: torch.Tensor, delta: torch.Tensor, dq_out: torch.Tensor, causal: bool, qk_scale: float,
              sm_scale: float) -> tuple[tuple[int, int], dict]:  # fmt: skip
    """(grid, every argument by name) of the dQ kernel's launch for these (Z, H, n, d) tensors."""
    z, h, n_q, d = q.shape
    rows = BLOCK_M // 2
    describe, token_major = flash_sm90.describe, flash_sm90.token_major
    args = dict(q_desc=describe(q, rows), k_desc=describe(k, BLOCK_N), v_desc=describe(v, BLOCK_N),
                do_desc=describe(do, rows), o_desc=describe(o, rows), dq_desc=describe(dq_out, rows),
                LSE=lse, DELTA=delta, H=h, n_q=n_q, n_k=k.shape[2], qk_scale=qk_scale, sm_scale=sm_scale,
                HEAD_DIM=d, CAUSAL=bool(causal), TOKEN_MAJOR=token_major(q), DO_TOKEN_MAJOR=token_major(do),
                O_TOKEN_MAJOR=token_major(o), BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N,
                STAGES=STAGES)  # fmt: skip
    return (z * h, (n_q + BLOCK_M - 1) // BLOCK_M), args


def dq(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, do: torch.Tensor, o: torch.Tensor,
       lse: torch.Tensor, delta: torch.Tensor, dq_out: torch.Tensor, causal: bool, qk_scale: float,
       sm_scale: float) -> None:  # fmt: skip
    """dQ of (Z, H, n, d) q, k, v, do, o into contiguous (Z, H, n_q, d) dq_out, and D into
    delta; lse and delta float32 with (Z*H*n_q) at their heads."""
    grid, args = dq_launch(q, k, v, do, o, lse, delta, dq_out, causal, qk_scale, sm_scale)
    _attn_bwd_dq_sm90[grid](**args, num_warps=NUM_WARPS)
