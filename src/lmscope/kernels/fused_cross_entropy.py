"""LM head + cross-entropy fused over chunks of tokens: the full logits never exist.

API
    ``fused_linear_cross_entropy(hidden, weight, targets, chunk_tokens=None, ignore_index=None,
    reduction="mean")`` -> the cross-entropy of ``hidden @ weight.T`` against ``targets``
    (differentiable in hidden and weight), averaged over the tokens or (``reduction="sum"``)
    summed; with ``ignore_index`` the tokens whose target is that value count neither in the
    loss nor in the mean, as in ``F.cross_entropy`` (transformers' -100 for padding and the last
    position). ``linear_cross_entropy_reference`` is the unfused PyTorch math it equals.

Algorithm
    For each chunk of tokens: logits = hidden_chunk @ weight.T in hidden's dtype (one matmul,
    as autocast would run the LM head), then a Triton kernel reads each row of logits once for
    an online max / log-sum-exp (in float32, float64 for float64), writes the row's loss and
    overwrites the logits in place with softmax - onehot; two matmuls turn that into the
    chunk's d(hidden) and its share of d(weight), accumulated in weight's dtype (the fp32 master
    weight, so no bf16 accumulation across chunks) by the matmul itself (cuBLAS's beta = 1; on
    CUDA from 16-bit inputs into the fp32 gradient through aten's ``out_dtype``), not by a
    separate add over the (V, d) gradient per chunk. Gradients are computed in the forward when
    autograd will need them; backward only scales them by grad_output / tokens. Peak extra
    memory is one chunk of logits (at most ``CHUNK_BYTES``), d(hidden) and d(weight) instead of
    fp32 logits, their log-softmax and their gradient for every token.

Shapes and dtypes
    hidden (N, d) float16, bfloat16, float32 or float64; weight (V, d) of any float dtype (cast
    to hidden's dtype for the matmuls); targets (N,) integer class ids in [0, V). Returns a
    0-dim tensor: float32 (float64 for float64 hidden).

Hardware
    Written for NVIDIA H100 (sm_90); the matmuls are cuBLAS, the kernel is memory bound.

Caveats
    No label smoothing, class weights or z-loss; targets outside [0, V) other than ignore_index
    are not checked (checking would synchronize the host). The mean with ignore_index divides by
    the count of kept targets as a device tensor (no host synchronization). Under
    ``TRITON_INTERPRET=1`` (CPU, tests) the variable must be set before this module is imported.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

__all__ = [
    "CHUNK_BYTES",
    "FusedLinearCrossEntropy",
    "fused_linear_cross_entropy",
    "linear_cross_entropy_reference",
]

CHUNK_BYTES = 256 * 2**20
"""Largest chunk of logits held at once, in bytes (chunks have at least 256 tokens)."""


def linear_cross_entropy_reference(
    hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, ignore_index: int | None = None,
    reduction: str = "mean",
) -> torch.Tensor:  # fmt: skip
    """cross-entropy of hidden @ weight.T, unfused (materializes all logits)."""
    logits = hidden @ weight.to(hidden.dtype).t()
    acc = torch.float64 if hidden.dtype == torch.float64 else torch.float32
    ignore = -100 if ignore_index is None else ignore_index
    return F.cross_entropy(logits.to(acc), targets, ignore_index=ignore, reduction=reduction)


@triton.jit
def _cross_entropy_rows(
    LOGITS, TARGETS, LOSS, stride_row, V, ignore_index,
    WRITE_GRAD: tl.constexpr, HAS_IGNORE: tl.constexpr, BLOCK_V: tl.constexpr, ACC: tl.constexpr,
):  # fmt: skip
    """Per row: loss = logsumexp(x) - x[target]; optionally x <- softmax(x) - onehot(target).

    With HAS_IGNORE a row whose target is ignore_index gets loss 0 and a zero gradient row."""
    row = tl.program_id(0).to(tl.int64)
    base = LOGITS + row * stride_row
    cols = tl.arange(0, BLOCK_V)
    x = tl.load(base + cols, mask=cols < V, other=-float("inf")).to(ACC)
    m = tl.max(x, axis=0)
    s = tl.sum(tl.exp(x - m), axis=0)
    for start in range(BLOCK_V, V, BLOCK_V):
        idx = start + cols
        x = tl.load(base + idx, mask=idx < V, other=-float("inf")).to(ACC)
        m_new = tl.maximum(m, tl.max(x, axis=0))
        s = s * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new), axis=0)
        m = m_new
    lse = m + tl.log(s)
    target = tl.load(TARGETS + row).to(tl.int64)
    if HAS_IGNORE:
        keep = target != ignore_index
        target = tl.where(keep, target, 0)
    loss = lse - tl.load(base + target).to(ACC)
    if HAS_IGNORE:
        loss = tl.where(keep, loss, 0.0)
    tl.store(LOSS + row, loss)
    if WRITE_GRAD:
        for start in range(0, V, BLOCK_V):
            idx = start + cols
            x = tl.load(base + idx, mask=idx < V, other=0.0).to(ACC)
            grad = tl.exp(x - lse) - tl.where(idx == target, 1.0, 0.0)
            if HAS_IGNORE:
                grad = tl.where(keep, grad, 0.0)
            tl.store(base + idx, grad.to(LOGITS.dtype.element_ty), mask=idx < V)


def _chunk_tokens(n: int, vocab: int, itemsize: int, chunk_tokens: int | None) -> int:
    if chunk_tokens is not None:
        if chunk_tokens < 1:
            raise ValueError(f"chunk_tokens must be positive, got {chunk_tokens}")
        return chunk_tokens
    return max(256, CHUNK_BYTES // (vocab * itemsize))


def _chunked_loss_and_grads(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    chunk: int,
    needs: tuple[bool, bool] = (False, False),
    ignore_index: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Sum of the per-token losses, and the unscaled d(hidden), d(weight) where `needs` says."""
    n, vocab = hidden.shape[0], weight.shape[0]
    acc = torch.float64 if hidden.dtype == torch.float64 else torch.float32
    losses = torch.empty(n, dtype=acc, device=hidden.device)
    dhidden = torch.empty_like(hidden) if needs[0] else None
    dweight = None
    block = min(triton.next_power_of_2(vocab), 4096)
    with torch.autocast(hidden.device.type, enabled=False):  # the matmuls run in hidden's dtype
        w = weight.to(hidden.dtype)
        for start in range(0, n, chunk):
            h = hidden[start : start + chunk]
            logits = h @ w.t()
            _cross_entropy_rows[(h.shape[0],)](
                logits, targets[start : start + chunk], losses[start : start + chunk],
                logits.stride(0), vocab, 0 if ignore_index is None else ignore_index,
                WRITE_GRAD=any(needs), HAS_IGNORE=ignore_index is not None, BLOCK_V=block,
                ACC=tl.float64 if acc == torch.float64 else tl.float32,
                num_warps=8 if block >= 2048 else 4,
            )  # fmt: skip
            if needs[0]:
                torch.mm(logits, w, out=dhidden[start : start + chunk])
            if needs[1]:
                dweight = _add_product(dweight, logits.t(), h, weight.dtype)
    return losses.sum(), dhidden, dweight


# cuBLAS matmuls of 16-bit inputs into a float32 result (aten's mm/addmm ``out_dtype``, CUDA only)
_MIXED_MATMUL = hasattr(torch.ops.aten.addmm, "dtype_out") and hasattr(torch.ops.aten.mm, "dtype")


def _add_product(acc: torch.Tensor | None, a: torch.Tensor, b: torch.Tensor,
                 dtype: torch.dtype) -> torch.Tensor:
    """``acc + a @ b`` in `dtype` (a new tensor when `acc` is None), accumulated by the matmul where
    cuBLAS can: a (V, d) weight gradient summed over chunks of a few hundred tokens is a matmul
    whose output is far larger than its inputs, and a separate add per chunk read and wrote that
    output once more (at the 8B shape's vocabulary, as long as the chunk's matmul itself)."""
    if a.dtype == dtype:
        return a @ b if acc is None else acc.addmm_(a, b)
    if a.is_cuda and _MIXED_MATMUL and dtype == torch.float32 and a.dtype in (torch.bfloat16, torch.float16):
        if acc is None:
            return torch.mm(a, b, out_dtype=dtype)
        return torch.addmm(acc, a, b, out_dtype=dtype, out=acc)
    part = a @ b
    return part.to(dtype) if acc is None else acc.add_(part)


REDUCTIONS = ("mean", "sum")


def _divisor(targets: torch.Tensor, ignore_index: int | None, reduction: str) -> torch.Tensor | int:
    """What the summed loss is divided by: 1 (sum), the token count, or the count of kept targets
    as a device tensor (no host synchronization)."""
    if reduction == "sum":
        return 1
    if ignore_index is None:
        return targets.shape[0]
    return (targets != ignore_index).sum()


class FusedLinearCrossEntropy(torch.autograd.Function):
    """``FusedLinearCrossEntropy.apply(hidden, weight, targets, chunk, ignore_index, reduction)`` ->
    the loss.

    Saves d(hidden) (N, d) and d(weight) (V, d), computed during the forward.
    """

    @staticmethod
    def forward(ctx, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, chunk: int,
                ignore_index: int | None = None, reduction: str = "mean"):  # fmt: skip
        needs = (ctx.needs_input_grad[0], ctx.needs_input_grad[1])
        total, dhidden, dweight = _chunked_loss_and_grads(hidden, weight, targets, chunk, needs, ignore_index)
        ctx.save_for_backward(dhidden, dweight)
        ctx.divisor = _divisor(targets, ignore_index, reduction)
        return total / ctx.divisor

    @staticmethod
    def backward(ctx, grad_loss: torch.Tensor):
        dhidden, dweight = ctx.saved_tensors
        scale = grad_loss / ctx.divisor
        dh = dhidden * scale.to(dhidden.dtype) if dhidden is not None else None
        dw = dweight * scale.to(dweight.dtype) if dweight is not None else None
        return dh, dw, None, None, None, None


def fused_linear_cross_entropy(
    hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, chunk_tokens: int | None = None,
    ignore_index: int | None = None, reduction: str = "mean",
) -> torch.Tensor:  # fmt: skip
    """Cross-entropy of hidden (N, d) @ weight (V, d).T against targets (N,), fused by chunks: the
    mean over the tokens (kept ones with `ignore_index`) or, with reduction="sum", the sum."""
    if hidden.ndim != 2 or weight.ndim != 2 or hidden.shape[1] != weight.shape[1]:
        raise ValueError(
            f"expected hidden (N, d) and weight (V, d), got {tuple(hidden.shape)}, {tuple(weight.shape)}"
        )
    if targets.shape != hidden.shape[:1]:
        raise ValueError(f"targets shape {tuple(targets.shape)} must be ({hidden.shape[0]},)")
    if hidden.shape[0] == 0:
        raise ValueError("cross-entropy of zero tokens is undefined: pass at least one token")
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {', '.join(REDUCTIONS)}, got {reduction!r}")
    chunk = _chunk_tokens(hidden.shape[0], weight.shape[0], hidden.element_size(), chunk_tokens)
    targets = targets.contiguous()
    if torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad):
        return FusedLinearCrossEntropy.apply(hidden, weight, targets, chunk, ignore_index, reduction)
    total, _, _ = _chunked_loss_and_grads(hidden, weight, targets, chunk, ignore_index=ignore_index)
    return total / _divisor(targets, ignore_index, reduction)
