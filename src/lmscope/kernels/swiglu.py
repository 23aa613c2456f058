"""SwiGLU's elementwise part, silu(a) * b, fused forward and backward in Triton.

API
    ``swiglu(gate_up)`` (differentiable) with ``gate_up`` = [a | b] packed along the last dim,
    the output of one matmul against the stacked weights [w1; w3]; returns silu(a) * b with half
    the last dim. ``swiglu_reference(gate_up)`` is the PyTorch math it reproduces. Packing a and b
    lets the backward write d(gate_up) in one buffer, so autograd never concatenates dA and dB.

Shapes and dtypes
    gate_up (..., 2F), any leading dims, F >= 1; float16, bfloat16, float32 or float64. The math
    runs in float32 (float64 for float64) and is rounded once to the input dtype; the result and
    the gradient have the input's dtype.

Kernels
    forward: grid (rows, column blocks); reads a and b, writes silu(a) * b.
    backward: same grid; recomputes sigmoid(a) and writes da = dy * b * s * (1 + a (1 - s)) and
    db = dy * a * s into the packed gradient. Nothing but the input is saved for backward.

Hardware
    Written for NVIDIA H100 (sm_90); memory bound (3 tensors forward, 4 backward).

Caveats
    Under ``TRITON_INTERPRET=1`` (CPU, tests) the variable must be set before this module is
    imported.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["SwiGLUFunction", "swiglu", "swiglu_reference"]


def swiglu_reference(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(a) * b for gate_up = [a | b] (float32 math, float64 kept), in gate_up's dtype."""
    acc = torch.float64 if gate_up.dtype == torch.float64 else torch.float32
    a, b = gate_up.to(acc).chunk(2, dim=-1)
    return (torch.nn.functional.silu(a) * b).to(gate_up.dtype)


@triton.jit
def _swiglu_fwd(GU, OUT, stride_gu, stride_out, F, BLOCK: tl.constexpr, ACC: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < F
    a = tl.load(GU + row * stride_gu + cols, mask=mask, other=0.0).to(ACC)
    b = tl.load(GU + row * stride_gu + F + cols, mask=mask, other=0.0).to(ACC)
    s = 1.0 / (1.0 + tl.exp(-a))
    tl.store(OUT + row * stride_out + cols, (a * s * b).to(OUT.dtype.element_ty), mask=mask)


@triton.jit
def _swiglu_bwd(
    DY, GU, DGU, stride_dy, stride_gu, stride_dgu, F, BLOCK: tl.constexpr, ACC: tl.constexpr
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < F
    dy = tl.load(DY + row * stride_dy + cols, mask=mask, other=0.0).to(ACC)
    a = tl.load(GU + row * stride_gu + cols, mask=mask, other=0.0).to(ACC)
    b = tl.load(GU + row * stride_gu + F + cols, mask=mask, other=0.0).to(ACC)
    s = 1.0 / (1.0 + tl.exp(-a))
    da = dy * b * s * (1.0 + a * (1.0 - s))
    db = dy * a * s
    tl.store(DGU + row * stride_dgu + cols, da.to(DGU.dtype.element_ty), mask=mask)
    tl.store(DGU + row * stride_dgu + F + cols, db.to(DGU.dtype.element_ty), mask=mask)


def _rows(x: torch.Tensor) -> torch.Tensor:
    x2 = x.reshape(-1, x.shape[-1])
    return x2 if x2.stride(-1) == 1 else x2.contiguous()


def _acc_dtype(x: torch.Tensor) -> tl.dtype:
    return tl.float64 if x.dtype == torch.float64 else tl.float32


def _block(f: int) -> int:
    return min(triton.next_power_of_2(f), 1024)


class SwiGLUFunction(torch.autograd.Function):
    """``SwiGLUFunction.apply(gate_up)``; saves gate_up only."""

    @staticmethod
    def forward(ctx, gate_up: torch.Tensor):
        if gate_up.shape[-1] % 2:
            raise ValueError(
                f"gate_up's last dim must be even ([a | b] packed), got {gate_up.shape[-1]}"
            )
        gu = _rows(gate_up)
        n, f = gu.shape[0], gu.shape[1] // 2
        out = torch.empty(*gate_up.shape[:-1], f, dtype=gate_up.dtype, device=gate_up.device)
        block = _block(f)
        if n and f:
            _swiglu_fwd[(n, triton.cdiv(f, block))](gu, out, gu.stride(0), f, f, BLOCK=block,
                                                   ACC=_acc_dtype(gu), num_warps=4)
        ctx.save_for_backward(gu)
        ctx.shape = gate_up.shape
        return out

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        (gu,) = ctx.saved_tensors
        n, f = gu.shape[0], gu.shape[1] // 2
        dy2 = _rows(dy)
        dgu = torch.empty_like(gu)
        block = _block(f)
        if n and f:
            _swiglu_bwd[(n, triton.cdiv(f, block))](
                dy2, gu, dgu, dy2.stride(0), gu.stride(0), dgu.stride(0), f,
                BLOCK=block, ACC=_acc_dtype(gu), num_warps=4,
            )  # fmt: skip
        return dgu.view(ctx.shape)


def swiglu(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(a) * b for gate_up = [a | b] packed on the last dim; differentiable."""
    return SwiGLUFunction.apply(gate_up)
