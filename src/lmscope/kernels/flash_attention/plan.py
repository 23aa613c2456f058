"""Host planning: checks, layouts and launch arguments, once per signature of q, k, v and causal.

What the launches need besides the tensors (checks, strides, scalars, launch keys, fixed launch
arguments) is a ``_Plan`` kept per signature of q, k, v and causal (``_plan_for``; only plain
tensors' plans are kept), so a repeated call skips the checks; the autograd Function keeps it for
the backward and allocates the backward's float32 scratch with L (``_scratch``). The plan also
records whether the Gluon sm_90 forward may serve (``flash_sm90.serves``).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from lmscope.envflags import env_flag
from lmscope.kernels import flash_sm90
from lmscope.kernels.attention_reference import check_attention_inputs
from lmscope.kernels.flash_attention.tuning import _INTERPRET
from lmscope.kernels.triton_launch import FixedArgs

LOG2E = 1.4426950408889634  # log2(e)
MAX_HEAD_DIM = 128
# Head dims that are not powers of two (80, 96, ...) as two column tiles, not one padded tile
# (split_head_dim); LMSCOPE_FLASH_SPLIT=0: one padded tile, the kernels' earlier layout.
SPLIT_HEAD_DIM = env_flag("LMSCOPE_FLASH_SPLIT", default=True)


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
