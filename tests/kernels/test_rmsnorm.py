"""Triton RMSNorm against a float64 reference: forward, backward, mixed dtypes, real sizes on GPU.

Without CUDA the kernels run in Triton's interpreter, which must be switched on before Triton
decorates them: `test_rmsnorm_in_interpreter` reruns this file in a child pytest with
TRITON_INTERPRET=1, and the tests below skip in the parent.
"""

from __future__ import annotations

import pytest
import torch
from triton_child import module_under_test, rerun_in_interpreter

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# Triton's interpreter truncates float32 -> bfloat16/float16 stores (the GPU rounds to nearest),
# which doubles the rounding error; there the bound for 16-bit outputs is 3x PyTorch's error.
LOW_PRECISION_FACTOR = 3.0 if DEVICE == "cpu" else 2.0


def test_rmsnorm_in_interpreter() -> None:
    rerun_in_interpreter(__file__)


@pytest.fixture(scope="module")
def rms():
    return module_under_test("lmscope.kernels.rmsnorm", "test_rmsnorm_in_interpreter")


def _rel(a: torch.Tensor, ref: torch.Tensor) -> float:
    return ((a.double() - ref).norm() / ref.norm()).item()


def _check(rms, shape, x_dtype, out_dtype, seed: int) -> None:
    """Kernel error vs float64 <= 2x the error of PyTorch's same-dtype math (+ fp64 rounding)."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=gen).to(DEVICE, x_dtype).requires_grad_(True)
    w = (1 + 0.3 * torch.randn(shape[-1], generator=gen)).to(DEVICE).requires_grad_(True)
    dy = torch.randn(*shape, generator=gen).to(DEVICE, out_dtype or x_dtype)

    y = rms.rmsnorm(x, w, 1e-5, out_dtype)
    dx, dw = torch.autograd.grad(y, (x, w), dy)
    x64, w64 = (t.detach().double().requires_grad_(True) for t in (x, w))
    ref = rms.rmsnorm_reference(x64, w64, 1e-5)
    ref_dx, ref_dw = torch.autograd.grad(ref, (x64, w64), dy.double())
    same = rms.rmsnorm_reference(x, w, 1e-5, out_dtype)
    same_dx, same_dw = torch.autograd.grad(same, (x, w), dy)

    assert y.dtype == (out_dtype or x_dtype) and y.shape == x.shape
    assert dx.dtype == x_dtype and dw.dtype == torch.float32
    for name, ours, theirs, exact in (("y", y, same, ref), ("dx", dx, same_dx, ref_dx),
                                      ("dw", dw, same_dw, ref_dw)):
        factor = LOW_PRECISION_FACTOR if ours.dtype in (torch.bfloat16, torch.float16) else 2.0
        err, tol = _rel(ours, exact), factor * _rel(theirs, exact) + 1e-6
        assert err <= tol, f"{name}: error {err:.2e} > {tol:.2e}"


@pytest.mark.parametrize("shape", [(3, 7, 37), (1, 5), (11, 64), (2, 2, 129)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matches_reference(rms, shape, dtype) -> None:
    _check(rms, shape, dtype, None, seed=sum(shape))


@pytest.mark.parametrize(("x_dtype", "out_dtype"), [(torch.float32, torch.bfloat16),
                                                    (torch.bfloat16, torch.float32)])
def test_mixed_input_and_output_dtypes(rms, x_dtype, out_dtype) -> None:
    _check(rms, (4, 9, 48), x_dtype, out_dtype, seed=7)


@pytest.mark.parametrize(("shape", "x_dtype", "delta_dtype", "out_dtype"), [
    ((3, 7, 37), torch.float32, torch.bfloat16, torch.bfloat16),  # the fast model's residual stream
    ((2, 129), torch.float32, torch.float32, None),
    ((5, 64), torch.bfloat16, torch.bfloat16, None),
])
@pytest.mark.parametrize("residual_grad", [True, False])
def test_add_rmsnorm_matches_the_unfused_math(rms, shape, x_dtype, delta_dtype, out_dtype,
                                              residual_grad) -> None:
    _check_add(rms, shape, x_dtype, delta_dtype, out_dtype, residual_grad)


def _check_add(rms, shape, x_dtype, delta_dtype, out_dtype, residual_grad: bool) -> None:
    """(s, y) and the gradients of x, delta and w vs float64, within 2x PyTorch's own error."""
    gen = torch.Generator().manual_seed(sum(shape))
    x = torch.randn(*shape, generator=gen).to(DEVICE, x_dtype).requires_grad_(True)
    delta = (0.5 * torch.randn(*shape, generator=gen)).to(DEVICE, delta_dtype).requires_grad_(True)
    w = (1 + 0.3 * torch.randn(shape[-1], generator=gen)).to(DEVICE).requires_grad_(True)
    dy = torch.randn(*shape, generator=gen).to(DEVICE, out_dtype or x_dtype)
    ds = torch.randn(*shape, generator=gen).to(DEVICE, x_dtype) if residual_grad else None

    def grads(s, y, inputs):
        outs, seeds = ((s, y), (ds, dy)) if residual_grad else ((y,), (dy,))
        seeds = tuple(g.to(o.dtype) for g, o in zip(seeds, outs, strict=True))
        return torch.autograd.grad(outs, inputs, seeds)

    s, y = rms.add_rmsnorm(x, delta, w, 1e-5, out_dtype)
    ours = (s, y, *grads(s, y, (x, delta, w)))
    x64, d64, w64 = (t.detach().double().requires_grad_(True) for t in (x, delta, w))
    s64 = x64 + d64
    y64 = rms.rmsnorm_reference(s64, w64, 1e-5)
    exact = (s64, y64, *grads(s64, y64, (x64, d64, w64)))
    s_same = (x + delta).to(x_dtype)
    y_same = rms.rmsnorm_reference(s_same, w, 1e-5, out_dtype)
    same = (s_same, y_same, *grads(s_same, y_same, (x, delta, w)))

    assert s.dtype == x_dtype and y.dtype == (out_dtype or x_dtype)
    assert ours[2].dtype == x_dtype and ours[3].dtype == delta_dtype and ours[4].dtype == torch.float32
    for name, a, b, ref in zip(("s", "y", "dx", "ddelta", "dw"), ours, same, exact, strict=True):
        factor = LOW_PRECISION_FACTOR if a.dtype in (torch.bfloat16, torch.float16) else 2.0
        err, tol = _rel(a, ref), factor * _rel(b, ref) + 1e-6
        assert err <= tol, f"{name}: error {err:.2e} > {tol:.2e}"


def test_equals_the_model_module_in_fp32(rms) -> None:
    from lmscope.model.transformer import RMSNorm

    x = torch.randn(5, 23, device=DEVICE, requires_grad=True)
    module = RMSNorm(23).to(DEVICE)
    with torch.no_grad():
        module.weight.uniform_(0.5, 1.5)
    y = rms.rmsnorm(x, module.weight, module.eps)
    assert torch.allclose(y, module(x), rtol=1e-5, atol=1e-6)
    dy = torch.randn_like(y)
    ours = torch.autograd.grad(y, (x, module.weight), dy)
    theirs = torch.autograd.grad(module(x), (x, module.weight), dy)
    for a, b in zip(ours, theirs, strict=True):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-5)


def test_float64_inputs_are_computed_in_float64(rms) -> None:
    x = torch.randn(4, 19, dtype=torch.float64, device=DEVICE, requires_grad=True)
    w = torch.rand(19, dtype=torch.float64, device=DEVICE, requires_grad=True)
    y = rms.rmsnorm(x, w)
    ref = rms.rmsnorm_reference(x, w)
    assert y.dtype == torch.float64 and torch.allclose(y, ref, rtol=1e-12, atol=1e-12)
    dy = torch.randn_like(y)
    for a, b in zip(torch.autograd.grad(y, (x, w), dy), torch.autograd.grad(ref, (x, w), dy), strict=True):
        assert torch.allclose(a, b, rtol=1e-11, atol=1e-12)


@pytest.mark.parametrize("shape", [(1, 37), (3, 100), (5, 129), (9, 1600)])
def test_every_backward_program_writes_its_whole_partial_row(rms, monkeypatch, shape) -> None:
    """The partial sums behind dweight are not zero-filled: with them NaN-filled, dweight still
    matches float64. Covers one row (n = 1), fewer rows than the CPU's 4 programs (each then
    one row), programs left without rows (n = 5, 9: 2 or 3 rows each, the last gets none) and
    widths that are not powers of two."""
    monkeypatch.setattr(rms, "_partials", lambda p, d, dtype, device: torch.full(
        (p, d), float("nan"), dtype=dtype, device=device))  # fmt: skip
    _check(rms, shape, torch.float32, None, seed=shape[0])


def test_add_rmsnorm_dweight_with_nan_filled_partials(rms, monkeypatch) -> None:
    monkeypatch.setattr(rms, "_partials", lambda p, d, dtype, device: torch.full(
        (p, d), float("nan"), dtype=dtype, device=device))  # fmt: skip
    _check_add(rms, (7, 45), torch.float32, torch.bfloat16, torch.bfloat16, residual_grad=True)


@pytest.mark.parametrize(("p", "d", "max_block_p"), [(1, 37, 512), (11, 70, 4), (528, 1600, 512),
                                                     (528, 100, 64)])  # fmt: skip
def test_column_sums_match_float64(rms, p, d, max_block_p) -> None:
    """The dweight reduction alone: ragged row chunks (P not a multiple of the tile), ragged
    columns, the xl shape on an H100 (528 partial rows of 1600), in the output dtype directly;
    the order of the sum is fixed, so two calls agree bit for bit."""
    gen = torch.Generator().manual_seed(p * d)
    partial = torch.randn(p, d, generator=gen).to(DEVICE)
    exact = partial.double().sum(0)
    ours = rms._column_sums(partial, torch.float32, max_block_p)
    assert ours.dtype == torch.float32 and ours.shape == (d,)
    assert (ours.double() - exact).abs().max().item() <= 1e-6 * p ** 0.5 * 4
    assert torch.equal(ours, rms._column_sums(partial, torch.float32, max_block_p))
    low = rms._column_sums(partial, torch.bfloat16, max_block_p)  # cast in the store
    assert low.dtype == torch.bfloat16
    assert torch.allclose(low.double(), exact, rtol=2**-7, atol=1e-6 * p)


def test_column_sums_of_float64_partials_accumulate_in_float64(rms) -> None:
    gen = torch.Generator().manual_seed(5)
    partial = (1 + torch.rand(37, 45, generator=gen, dtype=torch.float64) * 1e-9).to(DEVICE)
    ours = rms._column_sums(partial, torch.float64, 16)
    # float32 accumulation would lose the 1e-9 parts (error ~1e-6); float64 keeps them.
    assert ours.dtype == torch.float64
    assert torch.allclose(ours, partial.sum(0), rtol=1e-14, atol=0)


def test_weight_gradient_comes_back_in_the_weight_dtype(rms) -> None:
    x = torch.randn(6, 40, device=DEVICE, requires_grad=True)
    w = torch.rand(40, device=DEVICE).to(torch.bfloat16).requires_grad_(True)
    dy = torch.randn(6, 40, device=DEVICE)
    dw = torch.autograd.grad(rms.rmsnorm(x, w), w, dy)[0]
    ref = (dy.double() * rms.rmsnorm_reference(x.detach().double(), torch.ones(40).double())).sum(0)
    assert dw.dtype == torch.bfloat16
    assert torch.allclose(dw.double(), ref, rtol=2**-7, atol=1e-6)


def test_zero_rows_give_a_zero_weight_gradient(rms) -> None:
    x = torch.randn(0, 3, 24, device=DEVICE, requires_grad=True)
    w = torch.rand(24, device=DEVICE, requires_grad=True)
    dx, dw = torch.autograd.grad(rms.rmsnorm(x, w), (x, w), torch.randn(0, 3, 24, device=DEVICE))
    assert dx.shape == x.shape and torch.equal(dw, torch.zeros(24, device=DEVICE))


def test_rejects_a_weight_of_the_wrong_width(rms) -> None:
    with pytest.raises(ValueError, match="does not match"):
        rms.rmsnorm(torch.randn(2, 8, device=DEVICE), torch.ones(7, device=DEVICE))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("width", [768, 1600, 2560])
@pytest.mark.parametrize(("x_dtype", "out_dtype"), [(torch.float32, torch.bfloat16),
                                                    (torch.bfloat16, None), (torch.float32, None)])
def test_real_sizes_on_gpu(rms, width, x_dtype, out_dtype) -> None:
    _check(rms, (4, 2048, width), x_dtype, out_dtype, seed=width)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("width", [1600, 2560])
def test_add_rmsnorm_real_sizes_on_gpu(rms, width) -> None:
    _check_add(rms, (4, 512, width), torch.float32, torch.bfloat16, torch.bfloat16, residual_grad=True)
