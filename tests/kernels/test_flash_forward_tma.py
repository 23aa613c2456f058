"""The TMA forward (lmscope.kernels.flash_forward_tma).

CPU: which inputs it serves (no GPU: none), and that plans without it keep the default forward.
GPU (compute capability 9.x): O, L and the gradients computed from them against a float64
reference within twice the error of PyTorch's same-dtype attention, with ``MIN_SEQ`` lowered so
odd and short shapes reach it (ragged tiles, n_q != n_k both ways, causal and not, (B, T, H, d)
memory); misaligned inputs and the off switch fall back to the default forward; a plan that uses
it is never handed to the C++ host path.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from lmscope.kernels import flash_attention as fa  # noqa: E402
from lmscope.kernels import flash_forward_tma as tma  # noqa: E402
from lmscope.kernels.attention_reference import (  # noqa: E402
    attention_naive,
    reference_with_grads,
    relative_error,
)

HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9
needs_hopper = pytest.mark.skipif(not HOPPER, reason="needs a compute capability 9.x GPU")


def test_cpu_inputs_are_not_served():
    q = torch.randn(1, 2, 8192, 128, dtype=torch.bfloat16)
    assert not tma.serves(q, q, q)
    assert not fa._plan(q, q, q, True).tma_fwd


@pytest.fixture
def short_shapes(monkeypatch):
    """Every sequence length qualifies; plans made before are forgotten. Returns the list that
    each call of the TMA forward appends to."""
    monkeypatch.setattr(tma, "MIN_SEQ", 1)
    monkeypatch.setattr(fa, "_PLANS", {})
    calls = []
    real = tma.forward

    def counted(*args, **kwargs):
        calls.append("forward")
        return real(*args, **kwargs)

    monkeypatch.setattr(tma, "forward", counted)
    return calls


def _inputs(b, h, nq, nk, d, dtype, seed, bthd=False):
    gen = torch.Generator().manual_seed(seed)
    q, k, v, do = (torch.randn(b, h, n, d, generator=gen) for n in (nq, nk, nk, nq))
    if bthd:  # (B, T, H, d) memory read through .transpose(1, 2), as the models pass it
        q, k, v = (x.transpose(1, 2).contiguous().transpose(1, 2) for x in (q, k, v))
    q, k, v, do = (x.to("cuda", dtype) for x in (q, k, v, do))
    return q, k, v, do


CASES = [  # (batch, heads, n_queries, n_keys, head dim, causal, dtype, (B, T, H, d) memory)
    (1, 2, 4096, 4096, 128, True, torch.bfloat16, False),
    (2, 3, 517, 333, 64, True, torch.bfloat16, False),
    (1, 3, 333, 517, 128, True, torch.bfloat16, True),
    (2, 2, 1000, 1000, 64, False, torch.float16, False),
    (1, 2, 777, 1029, 128, False, torch.bfloat16, True),
    (1, 1, 1, 300, 64, True, torch.bfloat16, False),
]


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[2]}x{c[3]}-d{c[4]}-c{int(c[5])}-{str(c[6])[6:]}"
                         + ("-bthd" if c[7] else ""))  # fmt: skip
def test_gpu_matches_reference(case, short_shapes):
    b, h, nq, nk, d, causal, dtype, bthd = case
    q, k, v, do = _inputs(b, h, nq, nk, d, dtype, seed=nq + nk + d, bthd=bthd)
    q, k, v = (x.requires_grad_(True) for x in (q, k, v))
    ref_o, ref_l, *ref_g = reference_with_grads(q, k, v, do, causal)
    naive_o = attention_naive(q, k, v, causal)
    naive_g = torch.autograd.grad(naive_o, (q, k, v), do)

    o, lse = fa.flash_attention_forward(q, k, v, causal)
    g = fa.flash_attention_backward(do, q, k, v, o, lse, causal)
    assert short_shapes == ["forward"], "the TMA forward did not run"
    assert (lse.double() - ref_l).abs().max().item() < 1e-4
    for name, ours, theirs, ref in zip(("O", "dQ", "dK", "dV"), (o, *g), (naive_o, *naive_g),
                                       (ref_o, *ref_g), strict=True):  # fmt: skip
        err, tol = relative_error(ours, ref), 2 * relative_error(theirs, ref)
        assert err <= tol, f"{name}: error {err:.2e} > 2x torch's {dtype} error ({tol:.2e})"


@pytest.mark.gpu
@needs_hopper
def test_gpu_falls_back_where_it_must(short_shapes, monkeypatch):
    """A q one element off 16 bytes, or the switch off: the default forward, same results within
    rounding; head dim 80 and fp32 are not served at all."""
    q, k, v, _ = _inputs(1, 2, 300, 300, 64, torch.bfloat16, seed=3)
    o_tma, _ = fa.flash_attention_forward(q, k, v, True)
    assert short_shapes == ["forward"]
    flat = torch.empty(q.numel() + 1, dtype=q.dtype, device="cuda")
    o_default, _ = fa.flash_attention_forward(flat[1:].view(q.shape).copy_(q), k, v, True)
    assert short_shapes == ["forward"]
    assert relative_error(o_default, o_tma) < 1e-2
    monkeypatch.setattr(tma, "ENABLED", False)
    monkeypatch.setattr(fa, "_PLANS", {})
    fa.flash_attention_forward(q, k, v, True)
    assert short_shapes == ["forward"]
    monkeypatch.setattr(tma, "ENABLED", True)
    for d, dtype in ((80, torch.bfloat16), (64, torch.float32)):
        x = torch.randn(1, 2, 64, d, device="cuda", dtype=dtype)
        assert not tma.serves(x, x, x)


@pytest.mark.gpu
@needs_hopper
def test_gpu_plans_with_it_stay_on_the_python_path(short_shapes, monkeypatch):
    """flash_attention called eagerly again and again: the C++ host path never gets the plan
    (it launches the default forward only), and every call still runs the TMA forward."""
    monkeypatch.setattr(fa, "_NATIVE", None)
    q, k, v, do = _inputs(1, 2, 513, 513, 128, torch.bfloat16, seed=5)
    q, k, v = (x.requires_grad_(True) for x in (q, k, v))
    for _ in range(5):
        o = fa.flash_attention(q, k, v, causal=True)
        torch.autograd.grad(o, (q, k, v), do)
    assert short_shapes == ["forward"] * 5
    assert fa._NATIVE is None
