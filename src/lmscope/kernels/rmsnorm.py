"""RMSNorm forward and backward in Triton, with its autograd.Function.

API
    ``rmsnorm(x, weight, eps=1e-5, out_dtype=None)`` (differentiable) and
    ``rmsnorm_reference(x, weight, eps, out_dtype)``, the PyTorch math it reproduces (that of
    ``lmscope.model.transformer.RMSNorm``): y = x / sqrt(mean(x^2) + eps) * weight, computed in
    float32 (float64 for float64 inputs) and stored in ``out_dtype`` (default: x's dtype).

Shapes and dtypes
    x (..., D) with any leading dims, D up to 65536; weight (D,). x, weight and the output may
    each be float16, bfloat16, float32 or float64 independently, e.g. an fp32 residual stream in,
    bf16 out for the next matmul. Gradients come back in the dtypes of x and weight.

Kernels
    forward: one program per row, the whole row in registers; saves the per-row 1/rms (fp32).
    backward: a fixed number of programs, each walking a contiguous run of rows: it writes dx
    = rstd * (dy*w - xhat * mean(dy*w*xhat)) per row and keeps its own partial sum of dy*xhat;
    the partial sums (programs x D, fp32) are added up by torch for dweight (no atomics, so the
    result is deterministic).

Hardware
    Written for NVIDIA H100 (sm_90); the row-per-program layout reads x once forward and x, dy
    once backward, so the kernels run at memory bandwidth for the widths of the presets.

Caveats
    Under ``TRITON_INTERPRET=1`` (CPU, tests) the variable must be set before this module is
    imported. No host synchronization anywhere.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["RMSNormFunction", "rmsnorm", "rmsnorm_reference"]

MAX_WIDTH = 65536


def rmsnorm_reference(
    x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-5, out_dtype: torch.dtype | None = None
) -> torch.Tensor:
    """The PyTorch math of the kernel (float32 compute, float64 kept for float64 inputs)."""
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    xa = x.to(acc)
    normed = xa * torch.rsqrt(xa.pow(2).mean(-1, keepdim=True) + eps)
    return (normed * weight.to(acc)).to(out_dtype or x.dtype)


def _acc_dtype(x: torch.Tensor) -> tl.dtype:
    return tl.float64 if x.dtype == torch.float64 else tl.float32


@triton.jit
def _rmsnorm_fwd(X, W, Y, RSTD, stride_x, stride_y, D, eps, BLOCK_D: tl.constexpr, ACC: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_D)
    mask = cols < D
    x = tl.load(X + row * stride_x + cols, mask=mask, other=0.0).to(ACC)
    w = tl.load(W + cols, mask=mask, other=0.0).to(ACC)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / D + eps)
    tl.store(RSTD + row, rstd)
    tl.store(Y + row * stride_y + cols, (x * rstd * w).to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _rmsnorm_bwd(
    DY, X, W, RSTD, DX, DW_PARTIAL,
    stride_dy, stride_x, stride_dx, N, D, rows_per_program,
    BLOCK_D: tl.constexpr, ACC: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_D)
    mask = cols < D
    w = tl.load(W + cols, mask=mask, other=0.0).to(ACC)
    dw = tl.zeros([BLOCK_D], dtype=ACC)
    first = pid * rows_per_program
    last = tl.minimum(first + rows_per_program, N)
    for r in range(first, last):
        row = tl.cast(r, tl.int64)
        x = tl.load(X + row * stride_x + cols, mask=mask, other=0.0).to(ACC)
        dy = tl.load(DY + row * stride_dy + cols, mask=mask, other=0.0).to(ACC)
        rstd = tl.load(RSTD + row)
        xhat = x * rstd
        g = dy * w
        mean_gx = tl.sum(g * xhat, axis=0) / D
        dx = rstd * (g - xhat * mean_gx)
        tl.store(DX + row * stride_dx + cols, dx.to(DX.dtype.element_ty), mask=mask)
        dw += dy * xhat
    tl.store(DW_PARTIAL + pid * D + cols, dw, mask=mask)


def _rows(x: torch.Tensor) -> torch.Tensor:
    """(..., D) -> (N, D) with a unit column stride (a view when possible)."""
    x2 = x.reshape(-1, x.shape[-1])
    return x2 if x2.stride(-1) == 1 else x2.contiguous()


def _warps(block: int) -> int:
    return min(max(block // 256, 1), 16)


def _programs(n_rows: int, device: torch.device) -> int:
    if device.type == "cuda":
        return min(n_rows, 4 * torch.cuda.get_device_properties(device).multi_processor_count)
    return min(n_rows, 4)


class RMSNormFunction(torch.autograd.Function):
    """``RMSNormFunction.apply(x, weight, eps, out_dtype)``; saves x, weight and 1/rms per row."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, eps: float, out_dtype: torch.dtype | None):
        d = x.shape[-1]
        if weight.shape != (d,):
            raise ValueError(f"weight shape {tuple(weight.shape)} does not match x's last dim {d}")
        if d > MAX_WIDTH:
            raise ValueError(f"rmsnorm supports widths up to {MAX_WIDTH}, got {d}")
        x2 = _rows(x)
        n = x2.shape[0]
        y = torch.empty(x.shape, dtype=out_dtype or x.dtype, device=x.device)
        rstd = torch.empty(n, dtype=torch.float64 if x.dtype == torch.float64 else torch.float32,
                           device=x.device)
        block = triton.next_power_of_2(d)
        if n:
            _rmsnorm_fwd[(n,)](x2, weight, y, rstd, x2.stride(0), d, d, eps,
                               BLOCK_D=block, ACC=_acc_dtype(x), num_warps=_warps(block))
        ctx.save_for_backward(x2, weight, rstd)
        ctx.x_shape = x.shape
        return y

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        x2, weight, rstd = ctx.saved_tensors
        n, d = x2.shape
        dy2 = _rows(dy)
        dx = torch.empty_like(x2)
        programs = max(_programs(n, x2.device), 1)
        partial = torch.zeros(programs, d, dtype=rstd.dtype, device=x2.device)
        block = triton.next_power_of_2(d)
        if n:
            _rmsnorm_bwd[(programs,)](
                dy2, x2, weight, rstd, dx, partial,
                dy2.stride(0), x2.stride(0), dx.stride(0), n, d, triton.cdiv(n, programs),
                BLOCK_D=block, ACC=_acc_dtype(x2), num_warps=_warps(block),
            )  # fmt: skip
        dweight = partial.sum(0).to(weight.dtype)
        return dx.view(ctx.x_shape), dweight, None, None


def rmsnorm(
    x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-5, out_dtype: torch.dtype | None = None
) -> torch.Tensor:
    """x / sqrt(mean(x^2) + eps) * weight over the last dim, stored as `out_dtype` (default x's)."""
    return RMSNormFunction.apply(x, weight, eps, out_dtype)
