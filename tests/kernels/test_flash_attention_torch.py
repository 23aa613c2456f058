"""Tiled PyTorch FlashAttention-2 against a float64 naive reference (CPU)."""

from __future__ import annotations

import random

import pytest
import torch

from lmscope.kernels.attention_reference import (
    attention_naive,
    attention_reference,
    reference_with_grads,
    relative_error,
)
from lmscope.kernels.flash_attention_torch import (
    FlashAttentionTorch,
    flash_attention_torch,
    flash_attention_torch_forward,
)

CASES = [  # (leading dims, n_queries, n_keys, head dim, causal, block_q, block_k)
    ((2, 3), 37, 37, 16, True, 16, 8),
    ((2, 3), 29, 53, 32, False, 16, 16),
    ((3,), 45, 19, 16, True, 8, 16),
    ((3,), 23, 61, 24, True, 16, 32),
    ((), 41, 41, 32, False, 64, 64),
    ((2, 1, 2), 13, 27, 16, True, 4, 8),
]


def _inputs(lead, nq, nk, d, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(*lead, nq, d, generator=gen).to(dtype).requires_grad_(True)
    k = torch.randn(*lead, nk, d, generator=gen).to(dtype).requires_grad_(True)
    v = torch.randn(*lead, nk, d, generator=gen).to(dtype).requires_grad_(True)
    do = torch.randn(*lead, nq, d, generator=gen).to(dtype)
    return q, k, v, do


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("case", CASES)
def test_matches_reference_within_twice_torch_error(case, dtype):
    lead, nq, nk, d, causal, bq, bk = case
    seed = 10 * CASES.index(case) + [torch.float32, torch.bfloat16, torch.float16].index(dtype)
    q, k, v, do = _inputs(lead, nq, nk, d, dtype, seed=seed)
    ref_o, ref_l, *ref_g = reference_with_grads(q, k, v, do, causal)
    naive_o = attention_naive(q, k, v, causal)
    naive_g = torch.autograd.grad(naive_o, (q, k, v), do)

    o = flash_attention_torch(q, k, v, causal, block_q=bq, block_k=bk)
    lse = o.grad_fn.saved_tensors[4]
    g = torch.autograd.grad(o, (q, k, v), do)

    assert o.dtype == dtype and o.shape == q.shape
    for name, ours, theirs, ref in zip(
        ("O", "dQ", "dK", "dV"), (o, *g), (naive_o, *naive_g), (ref_o, *ref_g), strict=True
    ):
        err, tol = relative_error(ours, ref), 2 * relative_error(theirs, ref)
        assert err <= tol, f"{name}: error {err:.2e} > 2x torch's {dtype} error ({tol:.2e})"
    assert lse.dtype == torch.float32 and lse.shape == (*lead, nq)
    assert (lse.double() - ref_l).abs().max().item() < 1e-5


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
def test_equal_value_rows_give_vanishing_dq_and_dk(dtype, causal):
    """With every value row the same, O is that row whatever Q and K are, so dQ and dK are zero.
    The backward gets them from dS = P * (dP - D), D = rowsum(dO * O): they vanish only as far
    as D agrees with dP. D summed in float64 leaves fp32 rounding, far under the bound; D in a
    16-bit input dtype would leave that dtype's rounding, far over it."""
    lead, nq, nk, d = (2, 3), 37, 29, 16
    q, k = (torch.randn(*lead, n, d).to(dtype).requires_grad_(True) for n in (nq, nk))
    row = 3 * torch.randn(*lead, 1, d)
    v = row.expand(*lead, nk, d).to(dtype).contiguous().requires_grad_(True)
    do = torch.randn(*lead, nq, d).to(dtype)
    o = flash_attention_torch(q, k, v, causal, block_q=16, block_k=8)
    dq, dk, dv = torch.autograd.grad(o, (q, k, v), do)
    ref_dv = reference_with_grads(q, k, v, do, causal)[4]
    assert relative_error(dv, ref_dv) <= 2 * relative_error(torch.autograd.grad(
        attention_naive(q, k, v, causal), v, do)[0], ref_dv)  # fmt: skip
    for name, grad in (("dQ", dq), ("dK", dk)):
        size = (grad.double().norm() / dv.double().norm()).item()
        assert size < 1e-5, f"{name} is {size:.1e} of dV's size, not ~0"


def test_saves_q_k_v_o_and_one_fp32_lse():
    q, k, v, _ = _inputs((2, 3), 17, 21, 16, torch.bfloat16, seed=1)
    o = FlashAttentionTorch.apply(q, k, v, True)
    saved = o.grad_fn.saved_tensors
    assert len(saved) == 5
    assert [t.shape for t in saved[:4]] == [q.shape, k.shape, v.shape, o.shape]
    assert saved[4].shape == (2, 3, 17) and saved[4].dtype == torch.float32
    ref_o, ref_l = attention_reference(q, k, v, True)
    assert torch.allclose(saved[4].double(), ref_l, atol=1e-5)


@pytest.mark.parametrize("nq,nk,causal", [(6, 6, True), (5, 8, False), (8, 5, True), (7, 7, False)])
def test_gradcheck_float64(nq, nk, causal):
    gen = torch.Generator().manual_seed(nq * 100 + nk + causal)
    q = torch.randn(1, nq, 4, dtype=torch.float64, generator=gen, requires_grad=True)
    k = torch.randn(1, nk, 4, dtype=torch.float64, generator=gen, requires_grad=True)
    v = torch.randn(1, nk, 4, dtype=torch.float64, generator=gen, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda q, k, v: FlashAttentionTorch.apply(q, k, v, causal, 4, 3), (q, k, v)
    )


def test_expanded_upstream_gradient():
    """o.sum() hands backward an expanded, stride-0 dO."""
    q, k, v, _ = _inputs((2, 2), 19, 26, 16, torch.float32, seed=7)
    flash_attention_torch(q, k, v, True, block_q=8, block_k=8).sum().backward()
    q2, k2, v2 = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    attention_reference(q2, k2, v2, True)[0].sum().backward()
    for a, b in ((q, q2), (k, k2), (v, v2)):
        assert relative_error(a.grad, b.grad) < 1e-5


@pytest.mark.parametrize("nq,nk", [(11, 30), (30, 11)])
def test_causal_convention_matches_sdpa(nq, nk):
    """Top-left causal alignment, as torch SDPA's is_causal, also for n_queries != n_keys."""
    q, k, v, _ = _inputs((3,), nq, nk, 16, torch.float64, seed=nq)
    ours = flash_attention_torch(q, k, v, True, block_q=8, block_k=8)
    sdpa = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert relative_error(ours, sdpa) < 1e-12


def test_random_shapes_float32():
    """Fresh random shapes and tiles each run."""
    rng = random.Random()
    for _ in range(3):
        nq, nk, d = rng.randint(1, 50), rng.randint(1, 50), rng.choice([8, 16, 24])
        causal = rng.random() < 0.5
        q, k, v, _ = _inputs((2,), nq, nk, d, torch.float64, seed=rng.randrange(2**31))
        o, lse = flash_attention_torch_forward(
            q, k, v, causal, block_q=rng.randint(1, 20), block_k=rng.randint(1, 20)
        )
        ref_o, ref_l = attention_reference(q, k, v, causal)
        assert relative_error(o, ref_o) < 1e-12, (nq, nk, d, causal)
        assert relative_error(lse, ref_l) < 1e-12


def test_rejects_bad_shapes():
    q = torch.randn(2, 5, 16)
    with pytest.raises(ValueError, match="n_queries"):
        flash_attention_torch(q, torch.randn(3, 5, 16), torch.randn(3, 5, 16))
    with pytest.raises(ValueError, match="dtype"):
        flash_attention_torch(q, q.double(), q.double())
