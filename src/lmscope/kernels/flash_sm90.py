"""FlashAttention forward for Hopper (sm_90) in Gluon: warp-specialised, TMA tiles, asynchronous
wgmma, the softmax of one key tile overlapped with the P V product of the one before it.

Why a second forward kernel: the Triton forward (``flash_attention.triton_kernels._attn_fwd``) leaves the
tensor cores idle while each tile's softmax runs, because Triton waits for a dot's result as
soon as the next operation reads it, and its automatic warp specialisation does not run these
kernels on Hopper (``docs/kernels/flash_attention_backward_notes.md``, variant 6). Here the
structure is FlashAttention-3's (Shah et al., 2024), written out in Gluon:

- one program holds ``BLOCK_M`` query rows; two consumer warpgroups own 64 rows each and a
  load warp streams K and V tiles by TMA through a ring of ``STAGES`` shared-memory buffers,
  with a ``ready`` and an ``empty`` mbarrier per stage (no CTA-wide barrier per tile);
- each consumer issues ``S_{j+1} = Q K_{j+1}^T`` and ``O += P_j V_j`` together, waits only for
  ``S_{j+1}`` and runs its softmax while ``P_j V_j`` is on the tensor cores (intra-warpgroup
  overlap);
- with ``PINGPONG`` the two consumers take turns to issue their dots (two ``turn`` mbarriers),
  so that one's softmax runs while the other's dots do (inter-warpgroup overlap).

What it computes is the Triton forward's contract: O in the output's layout and L (natural
log-sum-exp per query row, float32, indexed by (batch*head, row)) for the backward kernels,
causal masking aligned at the top left (key j visible to query i when j <= i). The backward's
kernels of the same design are ``flash_sm90_dq`` and ``flash_sm90_dkdv``.

Chosen at run time (``flash_attention.plan._plan``) for bf16/fp16 inputs with head dim 64 or 128 on
a compute-capability 9.0 GPU, for calls with enough work not to be bound by host time
(``MIN_WORK``) and tensors TMA can describe; everything else keeps the Triton kernels.
``LMSCOPE_FLASH_SM90=0`` turns all three off. Gluon has no CPU interpreter: the kernels' tests
are GPU tests, besides offline sm_90 builds on the CPU (``tests/kernels/test_flash_sm90.py``).
"""

from __future__ import annotations

import torch

from lmscope.envflags import env_flag

try:  # Triton >= 3.5 ships Gluon; older ones keep the Triton forward everywhere
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared,
        mbarrier,
        tma,
        warpgroup_mma,
        warpgroup_mma_wait,
    )
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    HAVE_GLUON = True
except ImportError:  # pragma: no cover - depends on the installed Triton
    HAVE_GLUON = False

HEAD_DIMS = (64, 128)
BLOCK_M = 128  # query rows per program: two warpgroups of 64 rows
BLOCK_N = 128  # keys per step
NUM_WARPS = 4  # the default partition: the first consumer warpgroup
ENABLED = env_flag("LMSCOPE_FLASH_SM90", default=True)
# Calls with less work than this (batch*heads * n_queries * n_keys * head dim, to which their GPU
# time is proportional) keep the Triton kernels: they are bound by host time, which the Python
# launches here (descriptors built per call, Triton's JIT launch path) add to; the C++ host path
# serves only Triton kernels. The classic grid's batch-8 points at 4096 tokens, and at 8192 with
# head dim 64, are host-bound and were no faster with these kernels; 8192 tokens at head dim 128
# (this threshold) were (docs/kernels/flash_attention_backward_notes.md, variant 8, step 7).
MIN_WORK = 1 << 36
PINGPONG = True  # the two consumer warpgroups take turns at the tensor cores
STAGES = {64: 3, 128: 3}  # K/V ring depth per head dim (shared memory: Q + 2 * STAGES tiles)


HAVE_TMA_REDUCE = False  # set below where Gluon has the TMA reduce-add

if HAVE_GLUON:
    # the barrier of the warps that run the calling code: gl.thread_barrier up to Triton 3.6,
    # gl.barrier since
    _warps_barrier = getattr(gl, "thread_barrier", None) or gl.barrier
    # TMA copies: async_copy_global_to_shared / async_copy_shared_to_global up to Triton 3.6,
    # async_load / async_store since
    _tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
    _tma_store = getattr(tma, "async_store", None) or tma.async_copy_shared_to_global

    # TMA reduce-add of a shared-memory tile into global memory (``cp.reduce.async.bulk``), for
    # the five-matmul backward: ``tma.async_atomic_add`` in later Triton (3.9 has it); Triton 3.6's
    # Gluon builds the op (``create_async_tma_reduce``) but names no function for it, so it is
    # built through Gluon's private builder there. Neither: HAVE_TMA_REDUCE is False and the
    # backward keeps the dQ kernel.
    _tma_reduce_add = getattr(tma, "async_atomic_add", None)
    if _tma_reduce_add is None:
        try:
            from triton._C.libtriton import ir
            from triton.experimental.gluon.language._core import builtin as gl_builtin

            @gl_builtin
            def _tma_reduce_add(tensor_desc, coord, src, _semantic=None):
                coord = _semantic._convert_to_ir_values(coord, require_i64=False)
                _semantic.builder.create_async_tma_reduce(ir.DESCRIPTOR_REDUCE_KIND.ADD, tensor_desc.handle,
                                                          coord, src.handle)  # fmt: skip
        except ImportError:  # pragma: no cover - depends on the installed Triton
            pass
    HAVE_TMA_REDUCE = _tma_reduce_add is not None
    # setmaxnreg of the worker partitions (the first consumer warpgroup, the default partition,
    # gets what is left): the second consumer warpgroup, then the load warp
    REGS_CONSUMER = gl.constexpr(240)
    REGS_LOADER = gl.constexpr(24)

    @gluon.constexpr_function
    def _mma_layout(num_warps, n):
        """The wgmma accumulator layout of one warpgroup's (64 rows, n) tile."""
        return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                         instr_shape=[16, n, 16])  # fmt: skip

    @gluon.jit
    def _tiles(desc, n: gl.constexpr):
        """n shared-memory buffers for tiles of ``desc`` (its block shape and swizzled layout)."""
        return gl.allocate_shared_memory(desc.dtype, [n] + desc.block_type.shape, desc.layout)

    @gluon.jit
    def _barriers(n: gl.constexpr, count: gl.constexpr):
        """n mbarriers in shared memory, each completing a phase after ``count`` arrivals."""
        bars = gl.allocate_shared_memory(gl.int64, [n, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(n):
            mbarrier.init(bars.index(i), count=count)
        return bars

    @gluon.jit
    def _invalidate(bars, n: gl.constexpr):
        for i in gl.static_range(n):
            mbarrier.invalidate(bars.index(i))

    @gluon.jit
    def _ring(STAGES: gl.constexpr, FILLS: gl.constexpr = 1, FREES: gl.constexpr = 2):
        """The (full, empty) mbarriers of a ring of STAGES shared-memory buffers: a buffer is full
        after FILLS arrivals (by default the load warp's, with its TMA bytes) and free after FREES
        (by default one per consumer warpgroup)."""
        return _barriers(STAGES, FILLS), _barriers(STAGES, FREES)

    @gluon.jit
    def _free_ring(ready, empty, STAGES: gl.constexpr):
        _invalidate(ready, STAGES)
        _invalidate(empty, STAGES)

    @gluon.jit
    def _query_block(H, BLOCK_M: gl.constexpr):
        """(batch*head, batch, head, first query row) of this program on a (batch*heads, query
        blocks) grid, query blocks in reverse: under causal masking the last ones do the most
        work, and every head's heaviest start before any head's lighter ones."""
        off_bh = gl.program_id(0)
        start_m = (gl.num_programs(1) - 1 - gl.program_id(1)) * BLOCK_M
        return off_bh, off_bh // H, off_bh % H, start_m

    @gluon.jit
    def _key_tiles(start_m, n_k, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr):
        """(key tiles a query tile at start_m visits, first key of the tiles that need the mask)."""
        if CAUSAL:
            hi = gl.minimum(start_m + BLOCK_M, n_k)
            full_hi = gl.minimum(start_m, n_k)
        else:
            hi = n_k
            full_hi = n_k
        return gl.cdiv(hi, BLOCK_N), (full_hi // BLOCK_N) * BLOCK_N

    @gluon.jit
    def _tile(desc, z, h, row, TOKEN_MAJOR: gl.constexpr):
        """Coordinates of a (rows, d) tile of head (z, h) in a 4-d descriptor in memory order."""
        if TOKEN_MAJOR:
            return [z, row, h, 0]
        else:
            return [z, h, row, 0]

    @gluon.jit
    def _load_kv(k_desc, v_desc, k_buf, v_buf, bar, z, h, row, pred, TOKEN_MAJOR: gl.constexpr):
        mbarrier.expect(bar, k_desc.block_type.nbytes + v_desc.block_type.nbytes, pred=pred)
        _tma_load(k_desc, _tile(k_desc, z, h, row, TOKEN_MAJOR), bar, k_buf, pred=pred)
        _tma_load(v_desc, _tile(v_desc, z, h, row, TOKEN_MAJOR), bar, v_buf, pred=pred)

    @gluon.jit
    def _softmax_step(s, m_i, l_i, start_n, offs_m, n_k, qk_scale, MASKED, CAUSAL: gl.constexpr,
                      BLOCK_N: gl.constexpr, s_layout: gl.constexpr):  # fmt: skip
        """One key tile's online-softmax update: (P unnormalised, alpha, m, l)."""
        if MASKED:
            offs_n = start_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
            keep = gl.expand_dims(offs_n, 0) < n_k
            if CAUSAL:
                keep = keep & (gl.expand_dims(offs_n, 0) <= gl.expand_dims(offs_m, 1))
            s = gl.where(keep, s, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(s, axis=1) * qk_scale)
        p = gl.exp2(s * qk_scale - gl.expand_dims(m_new, 1))
        alpha = gl.exp2(m_i - m_new)
        l_i = l_i * alpha + gl.sum(p, axis=1)
        return p, alpha, m_new, l_i

    @gluon.jit
    def _loader(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, ready, empty, z, h, start_m, n_tiles,
                TOKEN_MAJOR: gl.constexpr, ROWS: gl.constexpr, BLOCK_N: gl.constexpr,
                STAGES: gl.constexpr):  # fmt: skip
        """The load warp: both warpgroups' Q tiles, then K and V tile j into stage j % STAGES
        once both warpgroups have released the tile that stage held before."""
        mbarrier.expect(q_bar, 2 * q_desc.block_type.nbytes)
        for wg in gl.static_range(2):
            _tma_load(q_desc, _tile(q_desc, z, h, start_m + wg * ROWS, TOKEN_MAJOR),
                                            q_bar, q_smem.index(wg))  # fmt: skip
        for j in range(n_tiles):
            stage = j % STAGES
            mbarrier.wait(empty.index(stage), ((j // STAGES) - 1) & 1, pred=j >= STAGES)
            _load_kv(k_desc, v_desc, k_smem.index(stage), v_smem.index(stage), ready.index(stage), z, h,
                     j * BLOCK_N, True, TOKEN_MAJOR)  # fmt: skip

    @gluon.jit
    def _take_turn(turn, k, WG: gl.constexpr, PINGPONG: gl.constexpr):
        """Wait until this warpgroup may issue its k-th batch of dots (ping-pong order)."""
        if PINGPONG:
            mbarrier.wait(turn.index(WG), k & 1)

    @gluon.jit
    def _pass_turn(turn, WG: gl.constexpr, PINGPONG: gl.constexpr):
        """Hand the tensor cores to the other warpgroup once this one's dots are issued."""
        if PINGPONG:
            mbarrier.arrive(turn.index(1 - WG))

    @gluon.jit
    def _consumer(q_smem, k_smem, v_smem, q_bar, ready, empty, turn, o_desc, LSE, z, h, off_bh, start_m, n_q,
                  n_k, n_tiles, full_hi, qk_scale, WG: gl.constexpr, HEAD_DIM: gl.constexpr,
                  CAUSAL: gl.constexpr, O_TOKEN_MAJOR: gl.constexpr, ROWS: gl.constexpr,
                  BLOCK_N: gl.constexpr, STAGES: gl.constexpr, PINGPONG: gl.constexpr):  # fmt: skip
        """One warpgroup's ROWS query rows: the softmax of tile j+1 runs while P_j V_j is on the
        tensor cores; each stage is released (``empty``) once its V has been read. With PINGPONG
        the two warpgroups take turns to issue their dots (``turn`` mbarriers), so that one's
        softmax runs while the other's dots do (FlashAttention-3's inter-warpgroup overlap)."""
        num_warps: gl.constexpr = gl.num_warps()
        dtype: gl.constexpr = o_desc.dtype
        s_layout: gl.constexpr = _mma_layout(num_warps, BLOCK_N)
        o_layout: gl.constexpr = _mma_layout(num_warps, HEAD_DIM)
        p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
        row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
        row_o: gl.constexpr = gl.SliceLayout(1, o_layout)

        row0 = start_m + WG * ROWS
        q = q_smem.index(WG).reshape([ROWS, HEAD_DIM])
        offs_m = row0 + gl.arange(0, ROWS, layout=row_s)
        m_i = gl.full([ROWS], float("-inf"), gl.float32, layout=row_s)
        l_i = gl.full([ROWS], 0.0, gl.float32, layout=row_s)
        acc = gl.zeros([ROWS, HEAD_DIM], gl.float32, layout=o_layout)
        s_zero = gl.zeros([ROWS, BLOCK_N], gl.float32, layout=s_layout)

        if PINGPONG and WG == 1:
            mbarrier.arrive(turn.index(0))  # the first warpgroup goes first
        mbarrier.wait(q_bar, 0)
        mbarrier.wait(ready.index(0), 0)
        k0 = k_smem.index(0).reshape([BLOCK_N, HEAD_DIM])
        _take_turn(turn, 0, WG, PINGPONG)
        s_tok = warpgroup_mma(q, k0.permute((1, 0)), s_zero, use_acc=False, is_async=True)
        _pass_turn(turn, WG, PINGPONG)
        s_cur = warpgroup_mma_wait(num_outstanding=0, deps=(s_tok,))
        p, alpha, m_i, l_i = _softmax_step(s_cur, m_i, l_i, 0, offs_m, n_k, qk_scale, full_hi <= 0,
                                           CAUSAL, BLOCK_N, s_layout)  # fmt: skip
        for j in range(0, n_tiles - 1):
            nxt = j + 1
            mbarrier.wait(ready.index(nxt % STAGES), (nxt // STAGES) & 1)
            k_next = k_smem.index(nxt % STAGES).reshape([BLOCK_N, HEAD_DIM])
            v_cur = v_smem.index(j % STAGES).reshape([BLOCK_N, HEAD_DIM])
            p_op = gl.convert_layout(p.to(dtype), p_layout)
            _take_turn(turn, nxt, WG, PINGPONG)
            s_tok = warpgroup_mma(q, k_next.permute((1, 0)), s_zero, use_acc=False, is_async=True)
            acc_tok = warpgroup_mma(p_op, v_cur, acc, is_async=True)
            _pass_turn(turn, WG, PINGPONG)
            s_next = warpgroup_mma_wait(num_outstanding=1, deps=(s_tok,))
            start_n = nxt * BLOCK_N
            p, alpha, m_i, l_i = _softmax_step(s_next, m_i, l_i, start_n, offs_m, n_k, qk_scale,
                                               start_n >= full_hi, CAUSAL, BLOCK_N, s_layout)  # fmt: skip
            acc, p_op = warpgroup_mma_wait(num_outstanding=0, deps=(acc_tok, p_op))
            _warps_barrier()  # this warpgroup's four warps are past tile j: release its stage
            mbarrier.arrive(empty.index(j % STAGES))
            acc = acc * gl.expand_dims(gl.convert_layout(alpha, row_o), 1)

        last = n_tiles - 1
        v_last = v_smem.index(last % STAGES).reshape([BLOCK_N, HEAD_DIM])
        p_op = gl.convert_layout(p.to(dtype), p_layout)
        _take_turn(turn, n_tiles, WG, PINGPONG)
        acc_tok = warpgroup_mma(p_op, v_last, acc, is_async=True)
        _pass_turn(turn, WG, PINGPONG)
        acc, p_op = warpgroup_mma_wait(num_outstanding=0, deps=(acc_tok, p_op))

        acc = acc / gl.expand_dims(gl.convert_layout(l_i, row_o), 1)
        # L = ln(2) * (m + log2(l)); m is in log2 units of the scaled scores.
        lse = (m_i + gl.log2(l_i)) * 0.6931471805599453
        gl.store(LSE + off_bh.to(gl.int64) * n_q + offs_m, lse, mask=offs_m < n_q)
        # O through this warpgroup's Q buffer (no longer read) and a TMA store clipped at n_q.
        q.store(acc.to(dtype))
        fence_async_shared()
        _tma_store(o_desc, _tile(o_desc, z, h, row0, O_TOKEN_MAJOR), q.reshape(o_desc.block_type.shape))
        tma.store_wait(pendings=0)

    @gluon.jit
    def _attn_fwd_sm90(
        q_desc, k_desc, v_desc, o_desc, LSE,
        H, n_q, n_k, qk_scale,
        HEAD_DIM: gl.constexpr, CAUSAL: gl.constexpr, TOKEN_MAJOR: gl.constexpr, O_TOKEN_MAJOR: gl.constexpr,
        BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, PINGPONG: gl.constexpr,
    ):  # fmt: skip
        off_bh, z, h, start_m = _query_block(H, BLOCK_M)
        ROWS: gl.constexpr = BLOCK_M // 2

        q_smem = _tiles(q_desc, 2)
        k_smem = _tiles(k_desc, STAGES)
        v_smem = _tiles(v_desc, STAGES)
        q_bars = _barriers(1, 1)
        q_bar = q_bars.index(0)
        ready, empty = _ring(STAGES)
        turn = _barriers(2, 1)
        n_tiles, full_hi = _key_tiles(start_m, n_k, BLOCK_M, BLOCK_N, CAUSAL)

        gl.warp_specialize(
            [
                (_consumer, (q_smem, k_smem, v_smem, q_bar, ready, empty, turn, o_desc, LSE, z, h, off_bh,
                             start_m, n_q, n_k, n_tiles, full_hi, qk_scale, 0, HEAD_DIM, CAUSAL,
                             O_TOKEN_MAJOR, ROWS, BLOCK_N, STAGES, PINGPONG)),
                (_consumer, (q_smem, k_smem, v_smem, q_bar, ready, empty, turn, o_desc, LSE, z, h, off_bh,
                             start_m, n_q, n_k, n_tiles, full_hi, qk_scale, 1, HEAD_DIM, CAUSAL,
                             O_TOKEN_MAJOR, ROWS, BLOCK_N, STAGES, PINGPONG)),
                (_loader, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, ready, empty, z, h,
                           start_m, n_tiles, TOKEN_MAJOR, ROWS, BLOCK_N, STAGES)),
            ],
            [4, 1],
            [REGS_CONSUMER, REGS_LOADER],
        )  # fmt: skip

        _invalidate(q_bars, 1)
        _free_ring(ready, empty, STAGES)
        _invalidate(turn, 2)


def token_major(x: torch.Tensor) -> bool:
    """Whether a (Z, H, n, d) tensor has its token axis outside its head axis in memory."""
    return x.stride(2) > x.stride(1)


def describable(*tensors: torch.Tensor) -> bool:
    """Whether TMA can read these (Z, H, n, d) tensors with one 4-d descriptor each, all with
    the same axis order: unit last stride, 16-byte aligned base and strides."""
    order = token_major(tensors[0])
    for x in tensors:
        esize = x.element_size()
        if x.stride(-1) != 1 or x.data_ptr() % 16 or token_major(x) != order:
            return False
        if any((s * esize) % 16 for s in x.stride()[:-1]):
            return False
    return True


def serves(q: torch.Tensor, work: int) -> bool:
    """Whether the Gluon kernels serve q's dtype, head dim and device for a call of ``work`` =
    batch*heads * n_queries * n_keys * head dim (the strides and alignment are checked per call
    by ``describable``)."""
    return (
        ENABLED
        and HAVE_GLUON
        and work >= MIN_WORK
        and q.is_cuda
        and q.dtype in (torch.bfloat16, torch.float16)
        and q.shape[-1] in HEAD_DIMS
        and torch.cuda.get_device_capability(q.device) == (9, 0)
    )


def describe(x: torch.Tensor, rows: int, cols: int | None = None) -> TensorDescriptor:
    """The TMA descriptor of a (Z, H, n, d) tensor's (rows, cols) tiles (cols: all d by default),
    4-d in its memory order, with the default swizzled shared-memory layout for that tile."""
    z, h, n, d = x.shape
    cols = d if cols is None else cols
    sz, sh, sn, _ = x.stride()
    gl_dtype = {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16, torch.float32: gl.float32}[x.dtype]
    if token_major(x):
        shape, strides, block = [z, n, h, d], [sz, sn, sh, 1], [1, rows, 1, cols]
    else:
        shape, strides, block = [z, h, n, d], [sz, sh, sn, 1], [1, 1, rows, cols]
    return TensorDescriptor(x, shape, strides, block, gl.NVMMASharedLayout.get_default_for(block, gl_dtype))


def forward_launch(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor,
                   causal: bool, qk_scale: float,
                   pingpong: bool = PINGPONG) -> tuple[tuple[int, int], dict]:  # fmt: skip
    """(grid, every argument by name) of the forward's launch for these (Z, H, n, d) tensors;
    ``forward`` launches it, ``benchmarks/attention/sm90_builds.py`` builds it offline."""
    z, h, n_q, d = q.shape
    rows = BLOCK_M // 2
    args = dict(q_desc=describe(q, rows), k_desc=describe(k, BLOCK_N), v_desc=describe(v, BLOCK_N),
                o_desc=describe(o, rows), LSE=lse, H=h, n_q=n_q, n_k=k.shape[2], qk_scale=qk_scale,
                HEAD_DIM=d, CAUSAL=bool(causal), TOKEN_MAJOR=token_major(q), O_TOKEN_MAJOR=token_major(o),
                BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, STAGES=STAGES[d], PINGPONG=pingpong)  # fmt: skip
    return (z * h, (n_q + BLOCK_M - 1) // BLOCK_M), args


def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor,
            causal: bool, qk_scale: float, pingpong: bool = PINGPONG) -> None:  # fmt: skip
    """O and L of (Z, H, n, d) q, k, v into o and lse (float32, (Z*H*n_q) at its head)."""
    grid, args = forward_launch(q, k, v, o, lse, causal, qk_scale, pingpong)
    _attn_fwd_sm90[grid](**args, num_warps=NUM_WARPS)
