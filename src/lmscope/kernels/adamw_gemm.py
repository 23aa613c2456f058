"""AdamW fused into the weight-gradient GEMM: the fp32 gradient never goes to memory.

API
    ``adamw_gemm_step(grad_out, x, segments, *, step_offset, lr, betas, eps, weight_decay)``
    computes, for a linear layer y = x @ cat(W_0, W_1, ...).T, each weight's gradient
    dW_s = grad_out[:, rows of W_s].T @ x in fp32 registers and applies AdamW to W_s from it in
    the same kernel (``torch.optim.AdamW``'s math, the code of ``lmscope.kernels.adamw``). A
    ``Segment`` names one weight and its state: the fp32 parameter, the two moments, the
    optional low-precision copy to write, and the device step count (the step number is that
    count plus ``step_offset``). ``adamw_gemm_reference`` is the PyTorch math.
    ``lmscope.kernels.adamw.FusedAdamW(step_in_backward=True)`` calls it for the block matmuls of
    ``FastTransformerLM`` (see ``FusedAdamW.step_in_weight_gradient``).

Why
    The separate update reads the fp32 gradient the GEMM wrote: 8 of its 30 bytes per parameter.
    Here the epilogue of each output tile reads the parameter and moments and writes them and the
    bf16 copy (26 B per parameter) while other tiles are still multiplying, so the memory-bound
    update overlaps the compute-bound GEMM and the gradient buffer is never allocated.

Shapes and dtypes
    grad_out (T, R) and x (T, N), unit last-dim stride, bf16, fp16 or fp32 (the same for both);
    segment s covers R_s consecutive columns of grad_out, its parameter is (R_s, N), fp32,
    contiguous, as are its moments; its shadow (R_s, N) contiguous in the compute dtype.
    fp32 inputs multiply in full fp32 (``input_precision="ieee"``), for the tests' tolerances.

Kernel
    One launch per up to three segments (a stack such as [Wq; Wk; Wv]): output tiles of all
    segments in one grid, grouped along the rows for L2 reuse, each tile entirely in one segment;
    the K loop runs over the T tokens; the epilogue splits the tile in column slices to bound
    registers. Configs are autotuned per shape (parameters and moments are restored after the
    tuning launches).

Hardware
    Written for NVIDIA H100 (sm_90): the tile configs are Hopper-sized; Triton's pipelined loads
    feed wgmma. Elsewhere it runs with the same configs.

Caveats
    Under ``TRITON_INTERPRET=1`` (CPU, tests) the variable must be set before this module is
    imported; there bf16 dot operands are upcast to fp32 (the interpreter mis-computes bf16 dots).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from lmscope.kernels.adamw import adamw_reference, adamw_update_tile

__all__ = ["Segment", "adamw_gemm_reference", "adamw_gemm_step"]

MAX_SEGMENTS = 3
_INTERPRET = os.environ.get("TRITON_INTERPRET", "0").strip().lower() not in ("", "0", "false")
_UPCAST_DOTS = tl.constexpr(_INTERPRET)


@dataclass(frozen=True)
class Segment:
    """One weight of a stacked matmul and its AdamW state (all on the GPU, contiguous)."""

    param: torch.Tensor
    exp_avg: torch.Tensor
    exp_avg_sq: torch.Tensor
    step: torch.Tensor
    shadow: torch.Tensor | None = None


def adamw_gemm_reference(
    grad_out: torch.Tensor, x: torch.Tensor, segments: Sequence[Segment], *, step_offset: float,
    lr: float, betas: tuple[float, float], eps: float, weight_decay: float,
) -> None:  # fmt: skip
    """The math of `adamw_gemm_step` in PyTorch: gradients in float64 from the given inputs."""
    start = 0
    for seg in segments:
        rows = seg.param.shape[0]
        grad = grad_out[:, start:start + rows].double().t() @ x.double()
        start += rows
        param = seg.param.detach()
        work = [t.double() for t in (param, seg.exp_avg, seg.exp_avg_sq)]
        step = int(seg.step.item() + step_offset)
        adamw_reference(*work[:1], grad, *work[1:], step, lr=lr, beta1=betas[0], beta2=betas[1],
                        eps=eps, weight_decay=weight_decay)
        for target, value in zip((param, seg.exp_avg, seg.exp_avg_sq), work, strict=True):
            target.copy_(value)
        if seg.shadow is not None:
            seg.shadow.copy_(param)


def _config(bm: int, bn: int, bk: int, split: int, stages: int, warps: int) -> triton.Config:
    return triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8,
                          "EPILOGUE_SPLIT": split}, num_stages=stages, num_warps=warps)


if _INTERPRET:
    _CONFIGS = [_config(16, 16, 16, 2, 1, 4)]
else:
    _CONFIGS = [
        _config(128, 128, 64, 2, 4, 8),
        _config(128, 128, 64, 4, 3, 4),
        _config(128, 256, 64, 4, 3, 8),
        _config(128, 64, 64, 1, 4, 4),
        _config(64, 128, 64, 2, 4, 4),
        _config(256, 128, 64, 4, 3, 8),
    ]

_STATE_ARGS = [f"{name}{s}" for s in range(MAX_SEGMENTS) for name in ("P", "M", "V", "S")]


@triton.jit
def _dot_acc(a, b, acc, DOT_PREC: tl.constexpr):
    if _UPCAST_DOTS:
        a = a.to(tl.float32)
        b = b.to(tl.float32)
    return tl.dot(a, b, acc, input_precision=DOT_PREC)


@triton.jit
def _update_slice(
    g, seg, rows, cols, seg_rows, N,
    P0, M0, V0, S0, C0, P1, M1, V1, S1, C1, P2, M2, V2, S2, C2,
    step_offset, lr, beta1, beta2, eps, weight_decay,
    SEGMENTS: tl.constexpr, HAS_SHADOW: tl.constexpr,
):  # fmt: skip
    """AdamW on one (rows x cols) slice of a tile whose gradient is `g`, in segment `seg`."""
    offsets = rows[:, None].to(tl.int64) * N + cols[None, :]
    mask = (rows < seg_rows)[:, None] & (cols < N)[None, :]
    if seg == 0:
        adamw_update_tile(g, offsets, mask, P0, M0, V0, S0, C0, step_offset, lr, beta1, beta2, eps,
                          weight_decay, HAS_SHADOW)
    elif SEGMENTS > 1 and seg == 1:
        adamw_update_tile(g, offsets, mask, P1, M1, V1, S1, C1, step_offset, lr, beta1, beta2, eps,
                          weight_decay, HAS_SHADOW)
    elif SEGMENTS > 2:
        adamw_update_tile(g, offsets, mask, P2, M2, V2, S2, C2, step_offset, lr, beta1, beta2, eps,
                          weight_decay, HAS_SHADOW)


@triton.jit
def _halves(g, BLOCK_M: tl.constexpr, WIDTH: tl.constexpr):
    """The left and right column halves of a (BLOCK_M, WIDTH) tile."""
    return tl.split(tl.permute(tl.reshape(g, (BLOCK_M, 2, WIDTH // 2)), (0, 2, 1)))


@triton.autotune(configs=_CONFIGS, key=["T", "N", "R0", "R1", "R2"], restore_value=_STATE_ARGS)
@triton.jit
def _adamw_gemm_kernel(
    DY, X, stride_dy, stride_x, T, N,
    P0, M0, V0, S0, C0, R0,
    P1, M1, V1, S1, C1, R1,
    P2, M2, V2, S2, C2, R2,
    step_offset, lr, beta1, beta2, eps, weight_decay,
    SEGMENTS: tl.constexpr, HAS_SHADOW: tl.constexpr, DOT_PREC: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    EPILOGUE_SPLIT: tl.constexpr,
):  # fmt: skip
    tiles0 = tl.cdiv(R0, BLOCK_M)
    tiles1 = tl.cdiv(R1, BLOCK_M)
    tiles_m = tiles0 + tiles1 + tl.cdiv(R2, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    pid = tl.program_id(0)
    per_group = GROUP_M * tiles_n
    first_m = (pid // per_group) * GROUP_M
    group_rows = tl.minimum(tiles_m - first_m, GROUP_M)
    tile_m = first_m + (pid % per_group) % group_rows
    tile_n = (pid % per_group) // group_rows
    # the segment of this row tile, its first tile and its first column of DY
    seg = (tile_m >= tiles0).to(tl.int32) + (tile_m >= tiles0 + tiles1).to(tl.int32)
    seg_tile0 = tl.where(seg == 0, 0, tl.where(seg == 1, tiles0, tiles0 + tiles1))
    seg_col0 = tl.where(seg == 0, 0, tl.where(seg == 1, R0, R0 + R1))
    seg_rows = tl.where(seg == 0, R0, tl.where(seg == 1, R1, R2))
    rows = (tile_m - seg_tile0) * BLOCK_M + tl.arange(0, BLOCK_M)  # rows of the segment's weight
    cols = tile_n * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < seg_rows
    col_ok = cols < N
    ks = tl.arange(0, BLOCK_K)
    a_ptrs = DY + ks[:, None].to(tl.int64) * stride_dy + (seg_col0 + rows)[None, :]
    b_ptrs = X + ks[:, None].to(tl.int64) * stride_x + cols[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, T, BLOCK_K):
        k_ok = ks < T - k0
        a_t = tl.load(a_ptrs, mask=k_ok[:, None] & row_ok[None, :], other=0.0)
        b = tl.load(b_ptrs, mask=k_ok[:, None] & col_ok[None, :], other=0.0)
        acc = _dot_acc(tl.trans(a_t), b, acc, DOT_PREC)
        a_ptrs += BLOCK_K * stride_dy
        b_ptrs += BLOCK_K * stride_x
    if EPILOGUE_SPLIT == 1:
        _update_slice(acc, seg, rows, cols, seg_rows, N, P0, M0, V0, S0, C0, P1, M1, V1, S1, C1,
                      P2, M2, V2, S2, C2, step_offset, lr, beta1, beta2, eps, weight_decay,
                      SEGMENTS, HAS_SHADOW)
    elif EPILOGUE_SPLIT == 2:
        left, right = _halves(acc, BLOCK_M, BLOCK_N)
        _update_slice(left, seg, rows, tile_n * BLOCK_N + tl.arange(0, BLOCK_N // 2), seg_rows, N,
                      P0, M0, V0, S0, C0, P1, M1, V1, S1, C1, P2, M2, V2, S2, C2,
                      step_offset, lr, beta1, beta2, eps, weight_decay, SEGMENTS, HAS_SHADOW)
        _update_slice(right, seg, rows, tile_n * BLOCK_N + BLOCK_N // 2 + tl.arange(0, BLOCK_N // 2),
                      seg_rows, N, P0, M0, V0, S0, C0, P1, M1, V1, S1, C1, P2, M2, V2, S2, C2,
                      step_offset, lr, beta1, beta2, eps, weight_decay, SEGMENTS, HAS_SHADOW)
    else:  # quarters
        left, right = _halves(acc, BLOCK_M, BLOCK_N)
        _update_halves(left, seg, rows, tile_n * BLOCK_N, seg_rows, N,
                       P0, M0, V0, S0, C0, P1, M1, V1, S1, C1, P2, M2, V2, S2, C2,
                       step_offset, lr, beta1, beta2, eps, weight_decay, SEGMENTS, HAS_SHADOW,
                       BLOCK_M, BLOCK_N // 2)
        _update_halves(right, seg, rows, tile_n * BLOCK_N + BLOCK_N // 2, seg_rows, N,
                       P0, M0, V0, S0, C0, P1, M1, V1, S1, C1, P2, M2, V2, S2, C2,
                       step_offset, lr, beta1, beta2, eps, weight_decay, SEGMENTS, HAS_SHADOW,
                       BLOCK_M, BLOCK_N // 2)


@triton.jit
def _update_halves(
    g, seg, rows, col0, seg_rows, N,
    P0, M0, V0, S0, C0, P1, M1, V1, S1, C1, P2, M2, V2, S2, C2,
    step_offset, lr, beta1, beta2, eps, weight_decay,
    SEGMENTS: tl.constexpr, HAS_SHADOW: tl.constexpr, BLOCK_M: tl.constexpr, WIDTH: tl.constexpr,
):  # fmt: skip
    """`_update_slice` on the two column halves of a (BLOCK_M, WIDTH) slice starting at col0."""
    left, right = _halves(g, BLOCK_M, WIDTH)
    _update_slice(left, seg, rows, col0 + tl.arange(0, WIDTH // 2), seg_rows, N,
                  P0, M0, V0, S0, C0, P1, M1, V1, S1, C1, P2, M2, V2, S2, C2,
                  step_offset, lr, beta1, beta2, eps, weight_decay, SEGMENTS, HAS_SHADOW)
    _update_slice(right, seg, rows, col0 + WIDTH // 2 + tl.arange(0, WIDTH // 2), seg_rows, N,
                  P0, M0, V0, S0, C0, P1, M1, V1, S1, C1, P2, M2, V2, S2, C2,
                  step_offset, lr, beta1, beta2, eps, weight_decay, SEGMENTS, HAS_SHADOW)


def _check(grad_out: torch.Tensor, x: torch.Tensor, segments: Sequence[Segment]) -> None:
    if grad_out.dim() != 2 or x.dim() != 2 or grad_out.shape[0] != x.shape[0]:
        raise ValueError(f"grad_out (T, R) and x (T, N) must share T, got {tuple(grad_out.shape)} "
                         f"and {tuple(x.shape)}")
    if grad_out.dtype != x.dtype or x.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise ValueError(f"grad_out and x must both be bf16, fp16 or fp32, got {grad_out.dtype} "
                         f"and {x.dtype}")
    if grad_out.stride(-1) != 1 or x.stride(-1) != 1:
        raise ValueError("grad_out and x need a unit stride along their last dim")
    rows = sum(seg.param.shape[0] for seg in segments)
    if rows != grad_out.shape[1]:
        raise ValueError(f"the segments have {rows} rows in all, grad_out has {grad_out.shape[1]}")
    shadows = {seg.shadow is None for seg in segments}
    if len(shadows) > 1:
        raise ValueError("either every segment has a shadow or none has")
    for seg in segments:
        tensors = (seg.param, seg.exp_avg, seg.exp_avg_sq) + ((seg.shadow,) if seg.shadow is not None else ())
        if seg.param.dim() != 2 or seg.param.shape[1] != x.shape[1]:
            raise ValueError(f"a segment's parameter must be (rows, {x.shape[1]}), "
                             f"got {tuple(seg.param.shape)}")
        if any(t.shape != seg.param.shape or not t.is_contiguous() for t in tensors):
            raise ValueError("a segment's parameter, moments and shadow must be contiguous and "
                             f"shaped {tuple(seg.param.shape)}")
        if seg.param.dtype != torch.float32:
            raise ValueError(f"the parameters must be fp32 master weights, got {seg.param.dtype}")


def adamw_gemm_step(
    grad_out: torch.Tensor, x: torch.Tensor, segments: Sequence[Segment], *, step_offset: float,
    lr: float, betas: tuple[float, float], eps: float, weight_decay: float,
    config: dict | None = None,
) -> None:  # fmt: skip
    """AdamW on each segment's weight from its gradient grad_out[:, its rows].T @ x, in place.

    `config` pins the tile config instead of autotuning (keys of `_config`'s dict plus
    num_warps and num_stages; the tests use it to cover every epilogue split).
    """
    _check(grad_out, x, segments)
    if not segments or x.shape[1] == 0:
        return
    start = 0
    for first in range(0, len(segments), MAX_SEGMENTS):
        chunk = list(segments[first:first + MAX_SEGMENTS])
        width = sum(seg.param.shape[0] for seg in chunk)
        _launch(grad_out[:, start:start + width], x, chunk, step_offset, lr, betas, eps, weight_decay,
                config)
        start += width


def _launch(
    grad_out: torch.Tensor, x: torch.Tensor, chunk: list[Segment], step_offset: float, lr: float,
    betas: tuple[float, float], eps: float, weight_decay: float, config: dict | None,
) -> None:  # fmt: skip
    t, n = x.shape
    padded = chunk + [Segment(chunk[0].param, chunk[0].exp_avg, chunk[0].exp_avg_sq, chunk[0].step,
                              chunk[0].shadow)] * (MAX_SEGMENTS - len(chunk))
    rows = [seg.param.shape[0] if i < len(chunk) else 0 for i, seg in enumerate(padded)]
    state = []
    for seg, r in zip(padded, rows, strict=True):
        shadow = seg.shadow if seg.shadow is not None else seg.param
        state += [seg.param, seg.exp_avg, seg.exp_avg_sq, shadow, seg.step, r]

    def grid(meta):
        tiles_m = sum(triton.cdiv(r, meta["BLOCK_M"]) for r in rows)
        return (tiles_m * triton.cdiv(n, meta["BLOCK_N"]),)

    kernel = _adamw_gemm_kernel if config is None else _adamw_gemm_kernel.fn  # .fn: untuned
    kernel[grid](
        grad_out, x, grad_out.stride(0), x.stride(0), t, n, *state,
        step_offset, lr, betas[0], betas[1], eps, weight_decay,
        SEGMENTS=len(chunk), HAS_SHADOW=chunk[0].shadow is not None,
        DOT_PREC="ieee" if x.dtype == torch.float32 else "tf32", **(config or {}),
    )  # fmt: skip
