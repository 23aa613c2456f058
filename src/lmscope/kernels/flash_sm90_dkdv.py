"""FlashAttention backward's dK, dV for Hopper (sm_90) in Gluon, warp-specialised like the
forward in ``flash_sm90``.

One program holds a block of ``BLOCK_N`` keys: two consumer warpgroups own 64 keys each (their
K and V tiles stay in shared memory, their fp32 dK, dV accumulators in registers) and a load
warp streams the ``BLOCK_M``-query tiles of Q and dO through a ring of ``STAGES`` buffers. Per
query tile each warpgroup issues ``S^T = K Q^T`` and ``dP^T = V dO^T`` together, forms
``P^T = exp2(S^T c - L log2 e)`` as soon as S^T is done and issues ``dV += P^T dO`` before it
waits for dP^T, then forms ``dS^T = P^T (dP^T - D)`` while dV runs and issues ``dK += dS^T Q``;
P^T and dS^T are register operands. The tile's buffers are released once those two are done.
The two warpgroups run out of step, so one's exponentials overlap the other's dots.
(Software pipelining across query tiles was measured and dropped: at head dim 128 it spills;
``docs/kernels/flash_attention_backward_notes.md``, variant 8.)

It is the Triton dK/dV kernel's contract (``flash_attention.triton_kernels._attn_bwd_dkdv``): L and
D = rowsum(dO * O) come from the forward and the dQ kernel (or the preprocess kernel), indexed
(batch*head, row); dK and dV are written contiguous (..., n_keys, d). Chosen with the Gluon
forward (``flash_sm90.serves``) where the tensors allow (``flash_sm90.describable``).

With a dQ accumulator (``ATOMIC_DQ``, flash_attention's atomic and auto dQ modes) it is the
five-matmul backward: each warpgroup writes its dS^T rows to shared memory, and per query tile
the warpgroup whose turn it is multiplies both warpgroups' rows by their K tiles (``dS K``) and
adds the result to the float32 rows by one TMA reduce-add (``_dq_share``), or, with
``DQ_SPLIT`` (head dim 128), both warpgroups do so each tile for half of dQ's columns
(``_dq_half``: half the registers and staging buffers); no dQ kernel runs (variants 9 and 10 of
the notes above).
"""

from __future__ import annotations

import torch

from lmscope.envflags import env_flag
from lmscope.kernels import flash_sm90
from lmscope.kernels.flash_sm90 import HAVE_GLUON

ENABLED = env_flag("LMSCOPE_FLASH_SM90_DKDV", default=True)  # off: the Triton dK/dV kernel

BLOCK_M = 64  # queries per step
BLOCK_N = 128  # keys per program: two warpgroups of 64
STAGES = 3  # Q/dO ring depth
# per head dim: L and D loaded compact, one query a thread at most, and converted to the score
# tile's column layout where used (at 128 loaded in that layout they spill; at 64 they do not, and
# compact loads, converted through shared memory, measured no faster: variant 10 of the notes)
COMPACT_ROWS = {64: False, 128: True}
DQ_LAG = 1  # atomic dQ: tile j's dS K done at the end of tile j (0) or of tile j + 1 (1: both
# warpgroups' dS^T rows of tile j are long written when a warpgroup gets to them); no other value
DQ_SPLIT = {64: False, 128: True}  # per head dim: both warpgroups add half of dQ's columns each tile
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
        _mma_layout,
        _ring,
        _tile,
        _tiles,
        _tma_load,
        _tma_reduce_add,
        _tma_store,
        _warps_barrier,
    )

    @gluon.jit
    def _loader(q_desc, k_desc, v_desc, do_desc, q_smem, do_smem, k_smem, v_smem, kv_bar, ready, empty,
                z, h, start_n, m_lo, n_steps, TOKEN_MAJOR: gl.constexpr, DO_TOKEN_MAJOR: gl.constexpr,
                ROWS: gl.constexpr, BLOCK_M: gl.constexpr, STAGES: gl.constexpr):  # fmt: skip
        """The load warp: both warpgroups' K and V tiles once, then Q and dO query tile j into
        stage j % STAGES once both warpgroups have released what that stage held."""
        mbarrier.expect(kv_bar, 2 * (k_desc.block_type.nbytes + v_desc.block_type.nbytes))
        for wg in gl.static_range(2):
            row = start_n + wg * ROWS
            _tma_load(k_desc, _tile(k_desc, z, h, row, TOKEN_MAJOR), kv_bar, k_smem.index(wg))
            _tma_load(v_desc, _tile(v_desc, z, h, row, TOKEN_MAJOR), kv_bar, v_smem.index(wg))
        for j in range(n_steps):
            stage = j % STAGES
            mbarrier.wait(empty.index(stage), ((j // STAGES) - 1) & 1, pred=j >= STAGES)
            row = m_lo + j * BLOCK_M
            bar = ready.index(stage)
            mbarrier.expect(bar, q_desc.block_type.nbytes + do_desc.block_type.nbytes)
            _tma_load(q_desc, _tile(q_desc, z, h, row, TOKEN_MAJOR), bar, q_smem.index(stage))
            _tma_load(do_desc, _tile(do_desc, z, h, row, DO_TOKEN_MAJOR), bar, do_smem.index(stage))

    @gluon.jit
    def _rows(LSE, DELTA, row_base, offs_m, n_q):
        """(L log2 e, D) of the queries offs_m (zero past n_q), in offs_m's layout: the score
        tile's column layout, or compact (``COMPACT_ROWS``) and converted where used."""
        m_ok = offs_m < n_q
        lse2 = gl.load(LSE + row_base + offs_m, mask=m_ok, other=0.0) * 1.4426950408889634
        return lse2, gl.load(DELTA + row_base + offs_m, mask=m_ok, other=0.0)

    @gluon.jit
    def _probabilities(s_t, lse2, offs_n, start_m, mask_below, n_q, qk_scale, CAUSAL: gl.constexpr,
                       BLOCK_M: gl.constexpr):  # fmt: skip
        """P^T of one query tile, masked on the diagonal tiles and at the ragged end."""
        col_s: gl.constexpr = gl.SliceLayout(0, s_t.type.layout)
        p_t = gl.exp2(s_t * qk_scale - gl.expand_dims(gl.convert_layout(lse2, col_s), 0))
        if (start_m < mask_below) | (start_m + BLOCK_M > n_q):
            offs_m = start_m + gl.arange(0, BLOCK_M, layout=col_s)
            keep = gl.expand_dims(offs_m < n_q, 0)
            if CAUSAL:
                keep = keep & (gl.expand_dims(offs_m, 0) >= gl.expand_dims(offs_n, 1))
            p_t = gl.where(keep, p_t, 0.0)
        return p_t

    @gluon.jit
    def _dq_share(ds_smem, k, k_other, dq_buf, ds_full, ds_empty, dq_desc, off_bh, t, m_lo, turn,
                  WG: gl.constexpr, BLOCK_M: gl.constexpr, HEAD_DIM: gl.constexpr):  # fmt: skip
        """On this warpgroup's turn (query tile t with t % 2 == WG): dS K of tile t over both
        warpgroups' keys, added to dQ's float32 rows by a TMA reduce-add; frees tile t's dS
        buffers. Both warpgroups call it each tile; ``turn`` says whose tile it is."""
        buf = t % 2
        if turn:
            mbarrier.wait(ds_full.index(buf), (t // 2) & 1)
            dq_zero = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, layout=_mma_layout(gl.num_warps(), HEAD_DIM))
            tok = warpgroup_mma(ds_smem.index(2 * buf + WG).permute((1, 0)), k, dq_zero, use_acc=False,
                                is_async=True)  # fmt: skip
            tok = warpgroup_mma(ds_smem.index(2 * buf + 1 - WG).permute((1, 0)), k_other, tok, is_async=True)
            dq = warpgroup_mma_wait(0, deps=(tok,))
            dq_buf.reshape([BLOCK_M, HEAD_DIM]).store(dq)
            fence_async_shared()
        _warps_barrier()
        if turn:
            mbarrier.arrive(ds_empty.index(buf))
            _tma_reduce_add(dq_desc, [0, off_bh, m_lo + t * BLOCK_M, 0], dq_buf)

    @gluon.jit
    def _dq_half(ds_smem, k0, k1, dq_buf, ds_full, ds_empty, dq_desc, off_bh, t, m_lo, WG: gl.constexpr,
                 BLOCK_M: gl.constexpr, HEAD_DIM: gl.constexpr):  # fmt: skip
        """This warpgroup's half of tile t's dQ share (head-dim columns WG * HEAD_DIM / 2 on):
        dS K over both warpgroups' keys, added to dQ's float32 rows by a TMA reduce-add; frees
        tile t's dS buffers once both halves are done (FlashAttention-3's split: half the
        registers and shared memory of a whole share)."""
        HALF: gl.constexpr = HEAD_DIM // 2
        buf = t % 2
        mbarrier.wait(ds_full.index(buf), (t // 2) & 1)
        acc = gl.zeros([BLOCK_M, HALF], gl.float32, layout=_mma_layout(gl.num_warps(), HALF))
        tok = warpgroup_mma(ds_smem.index(2 * buf).permute((1, 0)), k0.slice(WG * HALF, HALF, dim=1), acc,
                            use_acc=False, is_async=True)  # fmt: skip
        tok = warpgroup_mma(ds_smem.index(2 * buf + 1).permute((1, 0)), k1.slice(WG * HALF, HALF, dim=1), tok,
                            is_async=True)  # fmt: skip
        dq = warpgroup_mma_wait(0, deps=(tok,))
        tma.store_wait(pendings=0)  # this warpgroup's last reduce-add has read dq_buf
        dq_buf.reshape([BLOCK_M, HALF]).store(dq)
        fence_async_shared()
        _warps_barrier()
        mbarrier.arrive(ds_empty.index(buf))
        _tma_reduce_add(dq_desc, [0, off_bh, m_lo + t * BLOCK_M, WG * HALF], dq_buf)

    @gluon.jit
    def _dq_tile(ds_smem, k_smem, dq_buf, ds_full, ds_empty, dq_desc, off_bh, t, m_lo,
                 WG: gl.constexpr, ROWS: gl.constexpr, BLOCK_M: gl.constexpr, HEAD_DIM: gl.constexpr,
                 DQ_SPLIT: gl.constexpr):  # fmt: skip
        """Tile t's dQ share (none added for t < 0): this warpgroup's half of the columns
        (DQ_SPLIT), or the whole share on this warpgroup's turn."""
        k0 = k_smem.index(0).reshape([ROWS, HEAD_DIM])
        k1 = k_smem.index(1).reshape([ROWS, HEAD_DIM])
        if DQ_SPLIT:
            if t >= 0:
                _dq_half(ds_smem, k0, k1, dq_buf, ds_full, ds_empty, dq_desc, off_bh, t, m_lo, WG, BLOCK_M,
                         HEAD_DIM)  # fmt: skip
        elif WG == 0:
            _dq_share(ds_smem, k0, k1, dq_buf, ds_full, ds_empty, dq_desc, off_bh, t, m_lo,
                      (t >= 0) & (t % 2 == WG), WG, BLOCK_M, HEAD_DIM)  # fmt: skip
        else:
            _dq_share(ds_smem, k1, k0, dq_buf, ds_full, ds_empty, dq_desc, off_bh, t, m_lo,
                      (t >= 0) & (t % 2 == WG), WG, BLOCK_M, HEAD_DIM)  # fmt: skip

    @gluon.jit
    def _consumer(q_smem, do_smem, k_smem, v_smem, ds_smem, dq_smem, kv_bar, ready, empty, ds_full, ds_empty,
                  dk_desc, dv_desc, dq_desc, LSE, DELTA, z, h, off_bh, start_n, m_lo, n_steps, mask_below,
                  n_q, qk_scale, sm_scale, WG: gl.constexpr, HEAD_DIM: gl.constexpr,
                  CAUSAL: gl.constexpr, ROWS: gl.constexpr, BLOCK_M: gl.constexpr, STAGES: gl.constexpr,
                  COMPACT_ROWS: gl.constexpr, ATOMIC_DQ: gl.constexpr,
                  DQ_LAG: gl.constexpr, DQ_SPLIT: gl.constexpr):  # fmt: skip
        """One warpgroup's ROWS keys: dK, dV over the query tiles, then stored by TMA. With
        ATOMIC_DQ also the program's share of dQ, ``dS K`` over both warpgroups' keys, added to
        dq_desc's float32 rows by a TMA reduce-add (the five-matmul backward; no dQ kernel): each
        warpgroup writes its dS^T rows to shared memory (``ds_full``), and the warpgroup whose
        turn it is (query tile j: warpgroup j % 2), or with DQ_SPLIT each for half the columns,
        multiplies all of them, reduces the result and frees the buffer (``ds_empty``)."""
        num_warps: gl.constexpr = gl.num_warps()
        dtype: gl.constexpr = dk_desc.dtype
        s_layout: gl.constexpr = _mma_layout(num_warps, BLOCK_M)
        acc_layout: gl.constexpr = _mma_layout(num_warps, HEAD_DIM)
        op_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)
        col_s: gl.constexpr = gl.SliceLayout(0, s_layout)  # per query (columns of S^T)
        row_s: gl.constexpr = gl.SliceLayout(1, s_layout)  # per key (rows of S^T)
        flat: gl.constexpr = gl.BlockedLayout([1], [32], [num_warps], [0])  # per query, compact

        first_key = start_n + WG * ROWS
        k = k_smem.index(WG).reshape([ROWS, HEAD_DIM])
        v = v_smem.index(WG).reshape([ROWS, HEAD_DIM])
        offs_n = first_key + gl.arange(0, ROWS, layout=row_s)
        offs_mb = gl.arange(0, BLOCK_M, layout=flat if COMPACT_ROWS else col_s)
        row_base = off_bh.to(gl.int64) * n_q
        dk = gl.zeros([ROWS, HEAD_DIM], gl.float32, layout=acc_layout)
        dv = gl.zeros([ROWS, HEAD_DIM], gl.float32, layout=acc_layout)
        s_zero = gl.zeros([ROWS, BLOCK_M], gl.float32, layout=s_layout)
        if ATOMIC_DQ:
            dq_buf = dq_smem.index(WG)

        # each query tile's L and D are loaded a tile ahead
        lse2_next, delta_next = _rows(LSE, DELTA, row_base, m_lo + offs_mb, n_q)
        mbarrier.wait(kv_bar, 0)
        for j in range(n_steps):
            stage = j % STAGES
            mbarrier.wait(ready.index(stage), (j // STAGES) & 1)
            q = q_smem.index(stage).reshape([BLOCK_M, HEAD_DIM])
            do = do_smem.index(stage).reshape([BLOCK_M, HEAD_DIM])
            s_tok = warpgroup_mma(k, q.permute((1, 0)), s_zero, use_acc=False, is_async=True)
            dp_tok = warpgroup_mma(v, do.permute((1, 0)), s_zero, use_acc=False, is_async=True)
            start_m = m_lo + j * BLOCK_M
            offs_m = start_m + offs_mb
            lse2, delta = lse2_next, delta_next
            lse2_next, delta_next = _rows(LSE, DELTA, row_base, offs_m + BLOCK_M, n_q)
            # P^T as soon as S^T is done; dV += P^T dO runs while dS^T is formed
            s_t = warpgroup_mma_wait(num_outstanding=1, deps=(s_tok,))
            p_t = _probabilities(s_t, lse2, offs_n, start_m, mask_below, n_q, qk_scale, CAUSAL, BLOCK_M)
            p_op = gl.convert_layout(p_t.to(dtype), op_layout)
            dv_tok = warpgroup_mma(p_op, do, dv, is_async=True)
            dp_t = warpgroup_mma_wait(num_outstanding=1, deps=(dp_tok,))
            ds_t = (p_t * (dp_t - gl.expand_dims(gl.convert_layout(delta, col_s), 0))).to(dtype)
            ds_op = gl.convert_layout(ds_t, op_layout)
            dk_tok = warpgroup_mma(ds_op, q, dk, is_async=True)
            dv, dk, p_op, ds_op = warpgroup_mma_wait(0, deps=(dv_tok, dk_tok, p_op, ds_op))
            if ATOMIC_DQ:  # dS K takes dS, not dS^T, as its left operand: through shared memory
                # (stored after the wait: ptxas 12.8 crashes on a shared store and fence before it)
                buf = j % 2
                mbarrier.wait(ds_empty.index(buf), ((j // 2) - 1) & 1, pred=j >= 2)
                if not DQ_SPLIT:
                    tma.store_wait(pendings=0)  # this warpgroup's last reduce-add has read dq_buf
                ds_smem.index(2 * buf + WG).store(ds_t)
                fence_async_shared()
            _warps_barrier()  # this warpgroup's four warps are past tile j: release its stage
            mbarrier.arrive(empty.index(stage))
            if ATOMIC_DQ:
                mbarrier.arrive(ds_full.index(buf))
                t = j - DQ_LAG
                _dq_tile(ds_smem, k_smem, dq_buf, ds_full, ds_empty, dq_desc, off_bh, t, m_lo, WG,
                         ROWS, BLOCK_M, HEAD_DIM, DQ_SPLIT)  # fmt: skip

        if ATOMIC_DQ:
            if DQ_LAG:  # the last tile's share
                _dq_tile(ds_smem, k_smem, dq_buf, ds_full, ds_empty, dq_desc, off_bh, n_steps - 1,
                         m_lo, WG, ROWS, BLOCK_M, HEAD_DIM, DQ_SPLIT)  # fmt: skip
            # the other warpgroup's dS K reads this K: wait until its last one is done
            for back in gl.static_range(1, 3):
                last = gl.maximum(n_steps - back, 0)
                mbarrier.wait(ds_empty.index(last % 2), (last // 2) & 1, pred=n_steps >= back)
        # dK, dV through this warpgroup's K and V buffers (no longer read), clipped at the keys' end
        # by the descriptors.
        k.store((dk * sm_scale).to(dtype))
        v.store(dv.to(dtype))
        fence_async_shared()
        _tma_store(dk_desc, [z, h, first_key, 0], k.reshape(dk_desc.block_type.shape))
        _tma_store(dv_desc, [z, h, first_key, 0], v.reshape(dv_desc.block_type.shape))
        tma.store_wait(pendings=0)

    @gluon.jit
    def _attn_bwd_dkdv_sm90(
        q_desc, k_desc, v_desc, do_desc, dk_desc, dv_desc, dq_desc, LSE, DELTA,
        H, n_q, qk_scale, sm_scale,
        HEAD_DIM: gl.constexpr, CAUSAL: gl.constexpr, TOKEN_MAJOR: gl.constexpr,
        DO_TOKEN_MAJOR: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
        STAGES: gl.constexpr, COMPACT_ROWS: gl.constexpr, ATOMIC_DQ: gl.constexpr,
        DQ_LAG: gl.constexpr, DQ_SPLIT: gl.constexpr,
    ):  # fmt: skip
        # Every head's first key block (the most queries, under causal masking) first.
        off_bh = gl.program_id(0)
        start_n = gl.program_id(1) * BLOCK_N
        z = off_bh // H
        h = off_bh % H
        ROWS: gl.constexpr = BLOCK_N // 2

        q_smem = _tiles(q_desc, STAGES)
        do_smem = _tiles(do_desc, STAGES)
        k_smem = _tiles(k_desc, 2)
        v_smem = _tiles(v_desc, 2)
        kv_bars = _barriers(1, 1)
        kv_bar = kv_bars.index(0)
        ready, empty = _ring(STAGES)
        if ATOMIC_DQ:  # two buffers of both warpgroups' dS^T rows; each warpgroup's dS K tile
            ds_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([ROWS, BLOCK_M], dk_desc.dtype)
            ds_smem = gl.allocate_shared_memory(dk_desc.dtype, [4, ROWS, BLOCK_M], ds_layout)  # buffer*2 + WG
            dq_smem = _tiles(dq_desc, 2)
            # a buffer is full once both warpgroups wrote their rows, free once dS K read them (the
            # warpgroup whose turn it was, or both with DQ_SPLIT)
            ds_full, ds_empty = _ring(2, FILLS=2, FREES=2 if DQ_SPLIT else 1)
        else:
            ds_smem = k_smem  # unused
            dq_smem = k_smem
            ds_full = ready
            ds_empty = ready

        if CAUSAL:
            m_lo = (gl.minimum(start_n, n_q) // BLOCK_M) * BLOCK_M  # queries before see none of these keys
            mask_below = start_n + BLOCK_N  # query tiles starting below this cross the diagonal
        else:
            m_lo = 0
            mask_below = 0
        n_steps = gl.cdiv(gl.maximum(n_q - m_lo, 0), BLOCK_M)

        gl.warp_specialize(
            [
                (_consumer, (q_smem, do_smem, k_smem, v_smem, ds_smem, dq_smem, kv_bar, ready, empty, ds_full,
                             ds_empty, dk_desc, dv_desc, dq_desc, LSE, DELTA, z, h, off_bh, start_n, m_lo,
                             n_steps, mask_below, n_q, qk_scale, sm_scale, 0, HEAD_DIM, CAUSAL, ROWS,
                             BLOCK_M, STAGES, COMPACT_ROWS, ATOMIC_DQ, DQ_LAG,
                             DQ_SPLIT)),
                (_consumer, (q_smem, do_smem, k_smem, v_smem, ds_smem, dq_smem, kv_bar, ready, empty, ds_full,
                             ds_empty, dk_desc, dv_desc, dq_desc, LSE, DELTA, z, h, off_bh, start_n, m_lo,
                             n_steps, mask_below, n_q, qk_scale, sm_scale, 1, HEAD_DIM, CAUSAL, ROWS,
                             BLOCK_M, STAGES, COMPACT_ROWS, ATOMIC_DQ, DQ_LAG,
                             DQ_SPLIT)),
                (_loader, (q_desc, k_desc, v_desc, do_desc, q_smem, do_smem, k_smem, v_smem, kv_bar, ready,
                           empty, z, h, start_n, m_lo, n_steps, TOKEN_MAJOR, DO_TOKEN_MAJOR, ROWS, BLOCK_M,
                           STAGES)),
            ],
            [4, 1],
            [REGS_CONSUMER, REGS_LOADER],
        )  # fmt: skip

        _invalidate(kv_bars, 1)
        _free_ring(ready, empty, STAGES)
        if ATOMIC_DQ:
            _free_ring(ds_full, ds_empty, 2)


def dkdv_launch(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, do: torch.Tensor, lse: torch.Tensor,
                delta: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor, causal: bool, qk_scale: float,
                sm_scale: float, dq_acc: torch.Tensor | None = None
                ) -> tuple[tuple[int, int], dict]:  # fmt: skip
    """(grid, every argument by name) of the dK/dV kernel's launch for these (Z, H, n, d) tensors;
    with ``dq_acc`` (float32, (Z*H*n_q*d) at its head, zeroed) it also adds dQ / sm_scale there."""
    z, h, n_q, d = q.shape
    n_k = k.shape[2]
    rows = BLOCK_N // 2
    describe, token_major = flash_sm90.describe, flash_sm90.token_major
    if DQ_LAG not in (0, 1):  # the kernel drains one late tile and waits on two dS buffers
        raise ValueError(f"flash_sm90_dkdv.DQ_LAG must be 0 or 1, got {DQ_LAG!r}")
    dq_cols = d // 2 if DQ_SPLIT[d] else d
    dq_desc = None if dq_acc is None else describe(dq_acc[: z * h * n_q * d].view(1, z * h, n_q, d), BLOCK_M,
                                                   dq_cols)  # fmt: skip
    args = dict(q_desc=describe(q, BLOCK_M), k_desc=describe(k, rows), v_desc=describe(v, rows),
                do_desc=describe(do, BLOCK_M), dk_desc=describe(dk, rows), dv_desc=describe(dv, rows),
                dq_desc=dq_desc, LSE=lse, DELTA=delta, H=h, n_q=n_q, qk_scale=qk_scale,
                sm_scale=sm_scale,
                HEAD_DIM=d, CAUSAL=bool(causal), TOKEN_MAJOR=token_major(q), DO_TOKEN_MAJOR=token_major(do),
                BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, STAGES=STAGES, COMPACT_ROWS=COMPACT_ROWS[d],
                ATOMIC_DQ=dq_acc is not None,
                DQ_LAG=DQ_LAG, DQ_SPLIT=DQ_SPLIT[d])  # fmt: skip
    return (z * h, (n_k + BLOCK_N - 1) // BLOCK_N), args


def dkdv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, do: torch.Tensor, lse: torch.Tensor,
         delta: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor, causal: bool, qk_scale: float,
         sm_scale: float, dq_acc: torch.Tensor | None = None) -> None:  # fmt: skip
    """dK, dV of (Z, H, n, d) q, k, v, do into contiguous (Z, H, n_k, d) dk, dv; lse and delta
    float32 with (Z*H*n_q) at their heads; with ``dq_acc``, dQ / sm_scale added there too."""
    grid, args = dkdv_launch(q, k, v, do, lse, delta, dk, dv, causal, qk_scale, sm_scale, dq_acc)
    _attn_bwd_dkdv_sm90[grid](**args, num_warps=NUM_WARPS)
