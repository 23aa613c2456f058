"""FlashAttention-2 forward and backward in Triton: the autograd Function and its entry points.

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


Modules
    This package's ``__init__`` is the public face: ``FlashAttentionTriton``, ``flash_attention``,
    ``flash_attention_forward``, ``flash_attention_backward``, ``DQ_MODE`` (default from
    ``LMSCOPE_FLASH_DQ``: "auto", "separate" or "atomic"), with ``last_kernels``,
    ``python_path`` and ``split_head_dim`` re-exported. Behind it, one concept per module:
    ``plan`` (checks, layouts, launch arguments, kept per signature of q, k, v and causal),
    ``dispatch`` (which kernel family serves each launch: the Gluon sm_90 kernels of
    lmscope.kernels.flash_sm90* or the Triton ones), ``native_path`` (handing a plan to the C++
    host path, lmscope.kernels.flash_native, once its kernels are kept), ``launcher`` (autotuned
    launches, then direct ones), ``tuning`` (config lists) and ``triton_kernels`` (the @jit
    kernels). Once a plan's three Triton kernels have been launched directly, ``flash_attention``
    takes the C++ host path (``LMSCOPE_FLASH_NATIVE=0`` turns it off; ``python_path()`` keeps the
    Python Function for a block). Host cost per call, beside SDPA's:
    docs/kernels/flash_attention.md and docs/kernels/flash_attention_host_notes.md (rows in
    benchmarks/results/attention/).

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

import os

import torch

from lmscope.kernels import flash_native
from lmscope.kernels.flash_attention import native_path
from lmscope.kernels.flash_attention.dispatch import (
    _atomic_dq,
    _backward,
    _forward,
    _prepared_do,
    last_kernels,
)
from lmscope.kernels.flash_attention.native_path import _hand_to_native, python_path
from lmscope.kernels.flash_attention.plan import (
    _as4d,
    _plan_for,
    _plan_for_o_layout,
    _plan_of_saved,
    _scratch,
    split_head_dim,
)

__all__ = [
    "DQ_MODE",
    "FlashAttentionTriton",
    "flash_attention",
    "flash_attention_backward",
    "flash_attention_forward",
    "last_kernels",
    "python_path",
    "split_head_dim",
]

# "separate": dQ by its own kernel (no atomics); "atomic": dQ accumulated by the dK/dV kernel
# (the Triton kernel: per-element fp32 atomics; the Gluon sm_90 kernel: one TMA reduce-add per
# query tile and key block); "auto": atomic where the Gluon dK/dV kernel serves with its
# reduce-adds (faster there at every head dim it serves), separate elsewhere
# (docs/kernels/flash_attention_backward_notes.md, variants 2, 9 and 10).
DQ_MODE = os.environ.get("LMSCOPE_FLASH_DQ", "auto")
_DQ_MODES = ("auto", "separate", "atomic")


def flash_attention_forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Forward kernel only. Returns (O with q's shape and dtype, L float32 (..., n_queries)).

    For inputs of 4+ dims O has (..., n_queries, H, d) memory order (module docstring)."""
    o, lse, _, _, _ = _forward(q, k, v, causal, False)
    return o, lse


def _dq_mode(dq_mode: str | None) -> str:
    """``dq_mode``, default ``DQ_MODE``; ValueError for an unknown mode."""
    mode = dq_mode or DQ_MODE
    if mode not in _DQ_MODES:
        raise ValueError(f"dq_mode must be one of {', '.join(_DQ_MODES)}, got {mode!r}")
    return mode


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


def flash_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False
) -> torch.Tensor:
    """softmax(q k^T / sqrt(d)) v with the Triton FlashAttention-2 kernels; differentiable.

    Once a signature of q, k, v has run forward and backward a few times through the Python
    Function, later calls take the C++ host path (lmscope.kernels.flash_native): the same
    kernels and arguments, less host time per call."""
    if native_path._NATIVE is not None and native_path._native_allowed(DQ_MODE):
        o = native_path._NATIVE.apply(q, k, v, bool(causal))
        if o is not None:
            return o
    return FlashAttentionTriton.apply(q, k, v, causal)
