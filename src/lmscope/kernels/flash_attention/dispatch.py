"""Which kernel family serves each launch: the Gluon sm_90 kernels or the portable Triton ones.

``_forward`` and ``_backward`` launch for a plan (lmscope.kernels.flash_attention.plan). The Gluon
kernels (lmscope.kernels.flash_sm90, flash_sm90_dq, flash_sm90_dkdv) serve where the plan chose
them (``plan.sm90``) and TMA can describe the tensors, each backward kernel also behind its own
switch; the Triton kernels (lmscope.kernels.flash_attention.triton_kernels) serve everywhere
else. The atomic dQ mode adds dQ from the dK/dV kernel into a zeroed float32 buffer (two fewer
matmuls per tile pair): per-element atomics in the Triton kernel, which measured slower, TMA
reduce-adds in the Gluon one, which measured faster at head dims 64 and 128; "auto" takes the
latter where it serves (``_atomic_dq``; docs/kernels/flash_attention_backward_notes.md, variants
2, 9 and 10). ``last_kernels()`` says which family the last call launched.
"""

from __future__ import annotations

import torch
import triton

from lmscope.kernels import flash_sm90, flash_sm90_dkdv, flash_sm90_dq
from lmscope.kernels.flash_attention.launcher import _DKDV_LAUNCH, _DQ_LAUNCH, _FWD_LAUNCH
from lmscope.kernels.flash_attention.plan import _aligned, _as4d, _bwd_args, _Plan, _plan_for, _scratch
from lmscope.kernels.flash_attention.triton_kernels import _bwd_preprocess
from lmscope.kernels.flash_attention.tuning import _INTERPRET


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


def _atomic_dq(mode: str, plan: _Plan, q4, k4, v4, do4) -> bool:
    """Whether this backward accumulates dQ in the dK/dV kernel (``mode`` from ``_dq_mode``)."""
    if mode == "auto":
        return _gluon_dkdv(plan, q4, k4, v4, do4, True)
    return mode == "atomic"
