"""Chunked LM head + cross-entropy against F.cross_entropy on full logits (float64, bf16), GPU memory.

Without CUDA the kernel runs in Triton's interpreter, which must be switched on before Triton
decorates it: `test_fused_cross_entropy_in_interpreter` reruns this file in a child pytest with
TRITON_INTERPRET=1, and the tests below skip in the parent.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from triton_child import module_under_test, rerun_in_interpreter

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def test_fused_cross_entropy_in_interpreter() -> None:
    rerun_in_interpreter(__file__)


@pytest.fixture(scope="module")
def ce():
    return module_under_test("lmscope.kernels.fused_cross_entropy", "test_fused_cross_entropy_in_interpreter")


def _inputs(n: int, d: int, vocab: int, dtype: torch.dtype, seed: int):
    gen = torch.Generator().manual_seed(seed)
    hidden = (2 * torch.randn(n, d, generator=gen)).to(DEVICE, dtype).requires_grad_(True)
    master = torch.float64 if dtype == torch.float64 else torch.float32
    weight = (torch.randn(vocab, d, generator=gen) / d**0.5).to(DEVICE, master).requires_grad_(True)
    targets = torch.randint(0, vocab, (n,), generator=gen).to(DEVICE)
    return hidden, weight, targets


@pytest.mark.parametrize(("n", "d", "vocab", "chunk"), [(13, 9, 37, 5), (13, 9, 37, 1), (7, 16, 300, None),
                                                        (20, 5, 4100, 8), (6, 3, 2, 64)])
def test_float64_loss_and_gradients_equal_cross_entropy(ce, n, d, vocab, chunk) -> None:
    hidden, weight, targets = _inputs(n, d, vocab, torch.float64, seed=n * vocab + d)
    loss = ce.fused_linear_cross_entropy(hidden, weight, targets, chunk_tokens=chunk)
    ours = torch.autograd.grad(3.5 * loss, (hidden, weight))
    ref = F.cross_entropy(hidden @ weight.t(), targets)
    theirs = torch.autograd.grad(3.5 * ref, (hidden, weight))
    assert loss.dtype == torch.float64 and loss.ndim == 0
    assert abs(loss.item() - ref.item()) <= 1e-12 * abs(ref.item())
    for a, b in zip(ours, theirs, strict=True):
        assert torch.allclose(a, b, rtol=1e-10, atol=1e-13)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_low_precision_within_twice_the_unfused_error(ce, dtype) -> None:
    hidden, weight, targets = _inputs(33, 24, 301, dtype, seed=5)
    loss = ce.fused_linear_cross_entropy(hidden, weight, targets, chunk_tokens=10)
    ours = torch.autograd.grad(loss, (hidden, weight))
    unfused = ce.linear_cross_entropy_reference(hidden, weight, targets)  # the eager model's math
    theirs = torch.autograd.grad(unfused, (hidden, weight))
    h64, w64 = (t.detach().double().requires_grad_(True) for t in (hidden, weight))
    exact = F.cross_entropy(h64 @ w64.t(), targets)
    exact_grads = torch.autograd.grad(exact, (h64, w64))
    assert loss.dtype == torch.float32
    assert ours[0].dtype == dtype and ours[1].dtype == torch.float32
    assert abs(loss.item() - exact.item()) <= 2 * abs(unfused.item() - exact.item()) + 1e-6
    for a, b, ref in zip(ours, theirs, exact_grads, strict=True):
        err = ((a.double() - ref).norm() / ref.norm()).item()
        tol = 2 * ((b.double() - ref).norm() / ref.norm()).item() + 1e-6
        # the interpreter truncates fp32 -> bf16 where the GPU rounds (see test_rmsnorm)
        tol *= 1.5 if DEVICE == "cpu" and dtype == torch.bfloat16 else 1.0
        assert err <= tol, f"error {err:.2e} > {tol:.2e}"


def test_without_grad_only_the_loss_is_computed(ce) -> None:
    hidden, weight, targets = _inputs(9, 8, 50, torch.float64, seed=2)
    with torch.no_grad():
        loss = ce.fused_linear_cross_entropy(hidden, weight, targets, chunk_tokens=4)
    assert loss.grad_fn is None
    assert abs(loss.item() - F.cross_entropy(hidden @ weight.t(), targets).item()) < 1e-12


def test_frozen_weight_gets_no_gradient(ce) -> None:
    hidden, weight, targets = _inputs(9, 8, 50, torch.float64, seed=3)
    weight.requires_grad_(False)
    loss = ce.fused_linear_cross_entropy(hidden, weight, targets)
    loss.backward()
    ref = torch.autograd.grad(F.cross_entropy(hidden @ weight.t(), targets), (hidden,))[0]
    assert weight.grad is None and torch.allclose(hidden.grad, ref, rtol=1e-10, atol=1e-13)


@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize(("ignore_index", "chunk"), [(-100, 4), (7, None)])
def test_ignored_targets_count_nowhere_float64(ce, reduction, ignore_index, chunk) -> None:
    """F.cross_entropy's ignore_index: no loss, no gradient, not in the mean (as transformers'
    -100 labels); `sum` adds the kept tokens' losses."""
    hidden, weight, targets = _inputs(13, 9, 37, torch.float64, seed=21 + abs(ignore_index))
    targets[torch.tensor([0, 5, 6, 12])] = ignore_index
    loss = ce.fused_linear_cross_entropy(hidden, weight, targets, chunk_tokens=chunk,
                                         ignore_index=ignore_index, reduction=reduction)
    ours = torch.autograd.grad(2.5 * loss, (hidden, weight))
    ref = F.cross_entropy(hidden @ weight.t(), targets, ignore_index=ignore_index, reduction=reduction)
    theirs = torch.autograd.grad(2.5 * ref, (hidden, weight))
    assert abs(loss.item() - ref.item()) <= 1e-12 * abs(ref.item())
    for a, b in zip(ours, theirs, strict=True):
        assert torch.allclose(a, b, rtol=1e-10, atol=1e-13)
    assert ours[0][[0, 5, 6, 12]].abs().max().item() == 0.0  # ignored rows get no gradient
    with torch.no_grad():
        again = ce.fused_linear_cross_entropy(hidden, weight, targets, chunk_tokens=chunk,
                                              ignore_index=ignore_index, reduction=reduction)
    assert abs(again.item() - ref.item()) <= 1e-12 * abs(ref.item())


def test_rejects_bad_shapes(ce) -> None:
    hidden, weight, targets = _inputs(4, 8, 10, torch.float32, seed=4)
    with pytest.raises(ValueError, match="expected hidden"):
        ce.fused_linear_cross_entropy(hidden, weight[:, :5], targets)
    with pytest.raises(ValueError, match="targets shape"):
        ce.fused_linear_cross_entropy(hidden, weight, targets[:3])
    with pytest.raises(ValueError, match="chunk_tokens"):
        ce.fused_linear_cross_entropy(hidden, weight, targets, chunk_tokens=0)
    with pytest.raises(ValueError, match="reduction"):
        ce.fused_linear_cross_entropy(hidden, weight, targets, reduction="none")


@pytest.mark.parametrize(("inputs", "accumulator", "rtol"), [(torch.float64, torch.float64, 1e-12),
                                                             (torch.bfloat16, torch.float32, 1e-2),
                                                             (torch.bfloat16, torch.bfloat16, 3e-2)])
def test_weight_gradient_accumulates_in_place_in_its_dtype(ce, inputs, accumulator, rtol) -> None:
    """The chunks' d(weight) sum: a new tensor of the weight's dtype first, then added into it in
    place (on CUDA by the matmul: cuBLAS's beta = 1, fp32 out of bf16 inputs); float64 reference."""
    gen = torch.Generator().manual_seed(7)
    a1, a2 = (torch.randn(37, 11, generator=gen) for _ in range(2))
    b1, b2 = (torch.randn(11, 23, generator=gen) for _ in range(2))
    first = ce._add_product(None, a1.to(DEVICE, inputs), b1.to(DEVICE, inputs), accumulator)
    total = ce._add_product(first, a2.to(DEVICE, inputs), b2.to(DEVICE, inputs), accumulator)
    exact = a1.double() @ b1.double() + a2.double() @ b2.double()
    assert total is first and total.dtype == accumulator
    err = ((total.cpu().double() - exact).norm() / exact.norm()).item()
    assert err <= rtol


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("weight_dtype", [None, torch.bfloat16])
def test_real_size_on_gpu(ce, dtype, weight_dtype) -> None:
    """xl's head at batch 4 x 512 tokens: matches the unfused loss and gradients; also with the
    weight in bf16 (FSDP's gathered head), its gradient then summed over the chunks in bf16."""
    hidden, weight, targets = _inputs(2048, 1600, 10_000, dtype, seed=11)
    if weight_dtype is not None:
        weight = weight.detach().to(weight_dtype).requires_grad_(True)
    loss = ce.fused_linear_cross_entropy(hidden, weight, targets, chunk_tokens=700)
    ours = torch.autograd.grad(loss, (hidden, weight))
    h64, w64 = (t.detach().double().requires_grad_(True) for t in (hidden, weight))
    exact = F.cross_entropy(h64 @ w64.t(), targets)
    unfused = ce.linear_cross_entropy_reference(hidden, weight, targets)
    theirs = torch.autograd.grad(unfused, (hidden, weight))
    for a, b, ref in zip(ours, theirs, torch.autograd.grad(exact, (h64, w64)), strict=True):
        err = ((a.double() - ref).norm() / ref.norm()).item()
        assert err <= 2 * ((b.double() - ref).norm() / ref.norm()).item() + 1e-6
    assert abs(loss.item() - exact.item()) <= 2 * abs(unfused.item() - exact.item()) + 1e-5


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_never_holds_the_full_fp32_logits_on_gpu(ce) -> None:
    n, d, vocab = 16384, 1280, 10_000
    hidden, weight, targets = _inputs(n, d, vocab, torch.bfloat16, seed=12)
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    loss = ce.fused_linear_cross_entropy(hidden, weight, targets, chunk_tokens=2048)
    loss.backward()
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - base
    full_logits = n * vocab * 4
    assert extra < full_logits / 2, f"{extra / 2**20:.0f} MiB extra vs {full_logits / 2**20:.0f} MiB logits"
