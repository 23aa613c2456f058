"""RMSNorm forward and backward in Triton, with its autograd.Function.

API
    ``rmsnorm(x, weight, eps=1e-5, out_dtype=None)`` (differentiable) and
    ``rmsnorm_reference(x, weight, eps, out_dtype)``, the PyTorch math it reproduces (that of
    ``lmscope.model.transformer.RMSNorm``): y = x / sqrt(mean(x^2) + eps) * weight, computed in
    float32 (float64 for float64 inputs) and stored in ``out_dtype`` (default: x's dtype).
    ``add_rmsnorm(x, delta, weight, eps, out_dtype)`` -> (s, y) fuses the residual add before the
    norm: s = x + delta in x's dtype, y = rmsnorm(s); its backward takes the gradient reaching s
    along the residual stream too and writes d(delta) in delta's dtype in the same pass.

Shapes and dtypes
    x (..., D) with any leading dims, D up to 65536; weight (D,). x, weight and the output may
    each be float16, bfloat16, float32 or float64 independently, e.g. an fp32 residual stream in,
    bf16 out for the next matmul. Gradients come back in the dtypes of x and weight.

Kernels
    forward: one program per row, the whole row in registers; saves the per-row 1/rms (fp32).
    backward: a fixed number of programs (4 per SM, at most one per row), each walking a
    contiguous run of rows: it writes dx = rstd * (dy*w - xhat * mean(dy*w*xhat)) per row and
    its own partial sum of dy*xhat as one full row of a (programs, D) buffer (fp32; fp64 for
    fp64 inputs), zeros when it got no rows, so the buffer needs no zero fill.
    dweight: a column-sum kernel adds those partials up in one launch, one program per 32
    columns (a 128-byte line of fp32 per row), looping over chunks of up to 512 rows of a
    [512, 32] tile with elementwise adds and reducing across rows once at the end; it stores
    the sums in the weight's dtype (no cast kernel). Fixed summation order and no atomics:
    dweight is deterministic. Designed for the (528, 1600) fp32 partials of xl on an H100 (a
    few us): 50 programs of 16 warps, two steps each, with nearly all of the 3.4 MB in flight
    at once, since at that size memory round trips rather than bandwidth set the time.

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

__all__ = ["AddRMSNormFunction", "RMSNormFunction", "add_rmsnorm", "rmsnorm", "rmsnorm_reference"]

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
def _rmsnorm_fwd(
    X, DELTA, S, W, Y, RSTD, stride_x, stride_delta, stride_s, stride_y, D, eps,
    HAS_DELTA: tl.constexpr, BLOCK_D: tl.constexpr, ACC: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_D)
    mask = cols < D
    x = tl.load(X + row * stride_x + cols, mask=mask, other=0.0).to(ACC)
    if HAS_DELTA:  # s = x + delta, stored, and normalized as stored
        s = (x + tl.load(DELTA + row * stride_delta + cols, mask=mask, other=0.0).to(ACC)).to(
            S.dtype.element_ty
        )
        tl.store(S + row * stride_s + cols, s, mask=mask)
        x = s.to(ACC)
    w = tl.load(W + cols, mask=mask, other=0.0).to(ACC)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / D + eps)
    tl.store(RSTD + row, rstd)
    tl.store(Y + row * stride_y + cols, (x * rstd * w).to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _rmsnorm_bwd(
    DY, X, W, RSTD, DX, DW_PARTIAL, DS, DDELTA,
    stride_dy, stride_x, stride_dx, stride_ds, stride_ddelta, N, D, rows_per_program,
    HAS_DS: tl.constexpr, HAS_DDELTA: tl.constexpr, BLOCK_D: tl.constexpr, ACC: tl.constexpr,
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
        if HAS_DS:  # the gradient reaching s along the residual stream
            dx += tl.load(DS + row * stride_ds + cols, mask=mask, other=0.0).to(ACC)
        tl.store(DX + row * stride_dx + cols, dx.to(DX.dtype.element_ty), mask=mask)
        if HAS_DDELTA:  # d(delta) = d(s), in delta's dtype
            tl.store(DDELTA + row * stride_ddelta + cols, dx.to(DDELTA.dtype.element_ty), mask=mask)
        dw += dy * xhat
    tl.store(DW_PARTIAL + pid * D + cols, dw, mask=mask)


@triton.jit
def _column_sum(
    PARTIAL, DW, P, D, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr, ACC: tl.constexpr,
):  # fmt: skip
    """DW[c] = sum over rows p of PARTIAL[p, c] ((P, D) contiguous), in DW's dtype."""
    cols = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    col_ok = cols[None, :] < D
    rows = tl.arange(0, BLOCK_P)
    acc = tl.zeros([BLOCK_P, BLOCK_C], dtype=ACC)
    for start in range(0, P, BLOCK_P):  # elementwise adds; one reduction across rows at the end
        r = start + rows
        acc += tl.load(PARTIAL + r[:, None] * D + cols[None, :], mask=(r[:, None] < P) & col_ok,
                       other=0.0).to(ACC)  # fmt: skip
    tl.store(DW + cols, tl.sum(acc, axis=0).to(DW.dtype.element_ty), mask=cols < D)


def _check_shapes(x: torch.Tensor, weight: torch.Tensor) -> None:
    d = x.shape[-1]
    if weight.shape != (d,):
        raise ValueError(f"weight shape {tuple(weight.shape)} does not match x's last dim {d}")
    if d > MAX_WIDTH:
        raise ValueError(f"rmsnorm supports widths up to {MAX_WIDTH}, got {d}")


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


def _partials(programs: int, d: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """The backward's (programs, D) partial sums of dy*xhat: uninitialised, as every program
    writes its whole row (zeros when it got no rows)."""
    return torch.empty(programs, d, dtype=dtype, device=device)


# Column-sum tile: 32 fp32 columns are one 128-byte line per row; up to 512 rows per step, 32
# values per thread at 16 warps, so a step has most of the partials in flight (few round trips).
_SUM_BLOCK_C, _SUM_MAX_BLOCK_P = 32, 512


def _column_sums(
    partial: torch.Tensor, out_dtype: torch.dtype, max_block_p: int = _SUM_MAX_BLOCK_P
) -> torch.Tensor:
    """partial (P, D) contiguous, P >= 1 -> its column sums (D,) in `out_dtype`, one launch,
    accumulated in float64 for float64 partials, float32 otherwise (`max_block_p`: for tests)."""
    p, d = partial.shape
    out = torch.empty(d, dtype=out_dtype, device=partial.device)
    block_p = min(triton.next_power_of_2(p), max_block_p)
    _column_sum[(triton.cdiv(d, _SUM_BLOCK_C),)](
        partial, out, p, d, BLOCK_P=block_p, BLOCK_C=_SUM_BLOCK_C, ACC=_acc_dtype(partial),
        num_warps=min(max(block_p * _SUM_BLOCK_C // 1024, 1), 16),
    )  # fmt: skip
    return out


class RMSNormFunction(torch.autograd.Function):
    """``RMSNormFunction.apply(x, weight, eps, out_dtype)``; saves x, weight and 1/rms per row."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, eps: float, out_dtype: torch.dtype | None):
        x2, y, rstd = _forward(x, None, weight, eps, out_dtype)
        ctx.save_for_backward(x2, weight, rstd)
        ctx.x_shape = x.shape
        return y

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        x2, weight, rstd = ctx.saved_tensors
        dx, _, dweight = _launch_backward(dy, x2, weight, rstd, None, None)
        return dx.view(ctx.x_shape), dweight, None, None


def _forward(
    x: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, eps: float,
    out_dtype: torch.dtype | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """(the normalized rows: x's, or s = x + delta's; y shaped like x; 1/rms per row)."""
    _check_shapes(x, weight)
    if delta is not None and delta.shape != x.shape:
        raise ValueError(f"delta shape {tuple(delta.shape)} != x shape {tuple(x.shape)}")
    x2 = _rows(x)
    n, d = x2.shape
    y = torch.empty(x.shape, dtype=out_dtype or x.dtype, device=x.device)
    rstd = torch.empty(n, dtype=torch.float64 if x.dtype == torch.float64 else torch.float32,
                       device=x.device)
    delta2 = _rows(delta) if delta is not None else None
    rows = torch.empty(n, d, dtype=x.dtype, device=x.device) if delta2 is not None else x2
    if n:
        block = triton.next_power_of_2(d)
        _rmsnorm_fwd[(n,)](
            x2, delta2 if delta2 is not None else x2, rows, weight, y, rstd,
            x2.stride(0), delta2.stride(0) if delta2 is not None else 0, d, d, d, eps,
            HAS_DELTA=delta2 is not None, BLOCK_D=block, ACC=_acc_dtype(x2), num_warps=_warps(block),
        )  # fmt: skip
    return rows, y, rstd


def _launch_backward(
    dy: torch.Tensor, x2: torch.Tensor, weight: torch.Tensor, rstd: torch.Tensor,
    ds: torch.Tensor | None, delta_dtype: torch.dtype | None,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:  # fmt: skip
    """(dx, d(delta) in delta_dtype or None, dweight) for rows x2 given dy and, optionally, ds."""
    n, d = x2.shape
    dy2 = _rows(dy)
    ds2 = _rows(ds) if ds is not None else None
    dx = torch.empty_like(x2)
    ddelta = torch.empty(n, d, dtype=delta_dtype, device=x2.device) if delta_dtype else None
    if not n:
        return dx, ddelta, torch.zeros_like(weight)
    programs = _programs(n, x2.device)  # 1 <= programs <= n
    partial = _partials(programs, d, rstd.dtype, x2.device)
    block = triton.next_power_of_2(d)
    _rmsnorm_bwd[(programs,)](
        dy2, x2, weight, rstd, dx, partial, ds2 if ds2 is not None else dx,
        ddelta if ddelta is not None else dx,
        dy2.stride(0), x2.stride(0), dx.stride(0), ds2.stride(0) if ds2 is not None else 0, d,
        n, d, triton.cdiv(n, programs),
        HAS_DS=ds2 is not None, HAS_DDELTA=ddelta is not None,
        BLOCK_D=block, ACC=_acc_dtype(x2), num_warps=_warps(block),
    )  # fmt: skip
    return dx, ddelta, _column_sums(partial, weight.dtype)


class AddRMSNormFunction(torch.autograd.Function):
    """``AddRMSNormFunction.apply(x, delta, weight, eps, out_dtype)`` -> (s = x + delta, rmsnorm(s)).

    The residual add fused into the norm: s is stored in x's dtype and normalized as stored.
    Backward adds the gradient reaching s along the residual stream to the norm's, and writes
    d(delta) in delta's dtype in the same pass. Saves s, weight and 1/rms per row.
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float,
                out_dtype: torch.dtype | None):  # fmt: skip
        s, y, rstd = _forward(x, delta, weight, eps, out_dtype)
        ctx.save_for_backward(s, weight, rstd)
        ctx.x_shape, ctx.delta_dtype = x.shape, delta.dtype
        return s.view(x.shape), y

    @staticmethod
    def backward(ctx, ds: torch.Tensor | None, dy: torch.Tensor | None):
        s, weight, rstd = ctx.saved_tensors
        if dy is None:
            dy = torch.zeros(ctx.x_shape, dtype=s.dtype, device=s.device)
        delta_dtype = ctx.delta_dtype if ctx.needs_input_grad[1] else None
        dx, ddelta, dweight = _launch_backward(dy, s, weight, rstd, ds, delta_dtype)
        ddelta = ddelta.view(ctx.x_shape) if ddelta is not None else None
        return dx.view(ctx.x_shape), ddelta, dweight, None, None


def add_rmsnorm(
    x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float = 1e-5,
    out_dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """(s, y): s = x + delta in x's dtype (the residual stream), y = rmsnorm(s) in `out_dtype`."""
    return AddRMSNormFunction.apply(x, delta, weight, eps, out_dtype)


def rmsnorm(
    x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-5, out_dtype: torch.dtype | None = None
) -> torch.Tensor:
    """x / sqrt(mean(x^2) + eps) * weight over the last dim, stored as `out_dtype` (default x's)."""
    return RMSNormFunction.apply(x, weight, eps, out_dtype)
