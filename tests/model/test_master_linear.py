"""master_linear: stacked weight matmul in the compute dtype, weight gradients in the masters' dtype."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lmscope.model.fast_transformer import master_linear, matmul_into


@pytest.mark.parametrize("compute", [torch.float32, torch.bfloat16])
def test_matches_linear_on_the_cast_stack_and_returns_master_dtype_grads(compute) -> None:
    torch.manual_seed(7)
    weights = [torch.randn(rows, 19, dtype=torch.float32, requires_grad=True) for rows in (5, 3, 11)]
    x = torch.randn(2, 7, 19, dtype=compute, requires_grad=True)
    y = master_linear(x, *weights)
    grad = torch.randn_like(y)
    y.backward(grad)

    ref_w = [w.detach().to(torch.float64).requires_grad_() for w in weights]
    ref_x = x.detach().to(torch.float64).requires_grad_()
    stacked = torch.cat([w.to(compute).to(torch.float64) for w in ref_w])  # the same rounding
    ref_y = F.linear(ref_x, stacked)
    ref_y.backward(grad.to(torch.float64))

    tol = dict(rtol=2e-2, atol=2e-2) if compute == torch.bfloat16 else dict(rtol=1e-5, atol=1e-5)
    assert y.dtype == compute and x.grad.dtype == compute
    torch.testing.assert_close(y.to(torch.float64), ref_y, **tol)
    torch.testing.assert_close(x.grad.to(torch.float64), ref_x.grad, **tol)
    for w, ref in zip(weights, ref_w, strict=True):
        assert w.grad.dtype == torch.float32 and w.grad.shape == w.shape
        torch.testing.assert_close(w.grad.to(torch.float64), ref.grad, **tol)


def test_matmul_into_gives_the_asked_dtype() -> None:
    a, b = torch.randn(4, 6, dtype=torch.bfloat16), torch.randn(6, 3, dtype=torch.bfloat16)
    out = matmul_into(a, b, torch.float32)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, (a.float() @ b.float()), rtol=2e-2, atol=2e-2)
    assert matmul_into(a.float(), b.float(), torch.float32).dtype == torch.float32
