"""Triton SwiGLU (silu(a) * b on packed [a | b]) against a float64 reference, forward and backward.

Without CUDA the kernels run in Triton's interpreter, which must be switched on before Triton
decorates them: `test_swiglu_in_interpreter` reruns this file in a child pytest with
TRITON_INTERPRET=1, and the tests below skip in the parent.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from triton_child import module_under_test, rerun_in_interpreter

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# Triton's interpreter truncates float32 -> bfloat16/float16 stores (the GPU rounds to nearest),
# which doubles the rounding error; there the bound for 16-bit outputs is 3x PyTorch's error.
LOW_PRECISION_FACTOR = 3.0 if DEVICE == "cpu" else 2.0


def test_swiglu_in_interpreter() -> None:
    rerun_in_interpreter(__file__)


@pytest.fixture(scope="module")
def sw():
    return module_under_test("lmscope.kernels.swiglu", "test_swiglu_in_interpreter")


def _rel(a: torch.Tensor, ref: torch.Tensor) -> float:
    return ((a.double() - ref).norm() / ref.norm()).item()


def _eager(gate_up: torch.Tensor) -> torch.Tensor:
    """What the eager model computes: silu(w1 x) * (w3 x) in the activations' dtype."""
    a, b = gate_up.chunk(2, dim=-1)
    return F.silu(a) * b


def _check(sw, shape, dtype, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    gu = (2 * torch.randn(*shape, generator=gen)).to(DEVICE, dtype).requires_grad_(True)
    dy = torch.randn(*shape[:-1], shape[-1] // 2, generator=gen).to(DEVICE, dtype)
    y = sw.swiglu(gu)
    (dgu,) = torch.autograd.grad(y, (gu,), dy)
    gu64 = gu.detach().double().requires_grad_(True)
    ref = sw.swiglu_reference(gu64)
    (ref_dgu,) = torch.autograd.grad(ref, (gu64,), dy.double())
    same = _eager(gu)
    (same_dgu,) = torch.autograd.grad(same, (gu,), dy)
    assert y.dtype == dtype and y.shape == (*shape[:-1], shape[-1] // 2)
    assert dgu.dtype == dtype and dgu.shape == gu.shape
    factor = LOW_PRECISION_FACTOR if dtype in (torch.bfloat16, torch.float16) else 2.0
    for name, ours, theirs, exact in (("y", y, same, ref), ("dgu", dgu, same_dgu, ref_dgu)):
        err, tol = _rel(ours, exact), factor * _rel(theirs, exact) + 1e-7
        assert err <= tol, f"{name}: error {err:.2e} > {tol:.2e}"


@pytest.mark.parametrize("shape", [(3, 5, 2 * 37), (1, 2), (7, 2 * 1100), (2, 3, 4, 2 * 9)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_matches_reference(sw, shape, dtype) -> None:
    _check(sw, shape, dtype, seed=sum(shape))


def test_float64_matches_the_reference_exactly(sw) -> None:
    gu = torch.randn(6, 2 * 13, dtype=torch.float64, device=DEVICE, requires_grad=True)
    y, ref = sw.swiglu(gu), sw.swiglu_reference(gu)
    assert torch.allclose(y, ref, rtol=1e-12, atol=1e-14)
    dy = torch.randn_like(y)
    (ours,), (theirs,) = torch.autograd.grad(y, (gu,), dy), torch.autograd.grad(ref, (gu,), dy)
    assert torch.allclose(ours, theirs, rtol=1e-11, atol=1e-13)


def test_reads_a_strided_input_in_place(sw) -> None:
    wide = torch.randn(5, 40, device=DEVICE)
    gu = wide[:, 4:36]  # row stride 40, last dim contiguous
    assert torch.allclose(sw.swiglu(gu), sw.swiglu_reference(gu), rtol=1e-6, atol=1e-6)


def test_rejects_an_odd_packed_width(sw) -> None:
    with pytest.raises(ValueError, match="even"):
        sw.swiglu(torch.randn(3, 7, device=DEVICE))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("d_ff", [3072, 6400, 10240])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_real_sizes_on_gpu(sw, d_ff, dtype) -> None:
    _check(sw, (4, 512, 2 * d_ff), dtype, seed=d_ff)
