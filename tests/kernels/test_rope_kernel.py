"""Triton RoPE on packed q|k|v against the model's RotaryEmbedding and a float64 reference.

Without CUDA the kernels run in Triton's interpreter, which must be switched on before Triton
decorates them: `test_rope_in_interpreter` reruns this file in a child pytest with
TRITON_INTERPRET=1, and the tests below skip in the parent.
"""

from __future__ import annotations

import pytest
import torch
from triton_child import module_under_test, rerun_in_interpreter

from lmscope.model.rope import RotaryEmbedding

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# Triton's interpreter truncates float32 -> bfloat16/float16 stores (the GPU rounds to nearest),
# which doubles the rounding error; there the bound for 16-bit outputs is 3x PyTorch's error.
LOW_PRECISION_FACTOR = 3.0 if DEVICE == "cpu" else 2.0


def test_rope_in_interpreter() -> None:
    rerun_in_interpreter(__file__)


@pytest.fixture(scope="module")
def rk():
    return module_under_test("lmscope.kernels.rope", "test_rope_in_interpreter")


def _rel(a: torch.Tensor, ref: torch.Tensor) -> float:
    return ((a.double() - ref).norm() / ref.norm()).item()


def _eager(qkv: torch.Tensor, rope: RotaryEmbedding, heads: int) -> tuple[torch.Tensor, ...]:
    """The eager model's path: split heads, rotate q and k with RotaryEmbedding."""
    batch, seq, width = qkv.shape
    q, k, v = (t.view(batch, seq, heads, -1).transpose(1, 2) for t in qkv.split(width // 3, dim=-1))
    return rope(q), rope(k), v


@pytest.mark.parametrize(("batch", "seq", "heads", "head_dim"), [(2, 5, 3, 6), (1, 13, 4, 16),
                                                                 (3, 7, 1, 2), (2, 9, 5, 10)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matches_eager_and_float64(rk, batch, seq, heads, head_dim, dtype) -> None:
    gen = torch.Generator().manual_seed(batch * 1000 + seq * 10 + heads)
    rope = RotaryEmbedding(head_dim, seq + 3, theta=10_000.0).to(DEVICE)
    qkv = torch.randn(batch, seq, 3 * heads * head_dim, generator=gen).to(DEVICE, dtype)
    qkv.requires_grad_(True)
    grads = [torch.randn(batch, heads, seq, head_dim, generator=gen).to(DEVICE, dtype) for _ in range(3)]

    ours = rk.rope_qkv(qkv, rope.cos, rope.sin, heads)
    (d_ours,) = torch.autograd.grad(ours, (qkv,), grads)
    qkv64 = qkv.detach().double().requires_grad_(True)
    exact = rk.rope_qkv_reference(qkv64, rope.cos, rope.sin, heads)
    (d_exact,) = torch.autograd.grad(exact, (qkv64,), [g.double() for g in grads])
    eager = _eager(qkv, rope, heads)
    (d_eager,) = torch.autograd.grad(eager, (qkv,), grads)

    assert [t.shape for t in ours] == [(batch, heads, seq, head_dim)] * 3
    assert all(t.is_contiguous() and t.dtype == dtype for t in ours)
    assert torch.equal(ours[2], eager[2])  # v is copied, not rotated
    factor = LOW_PRECISION_FACTOR if dtype == torch.bfloat16 else 2.0
    for name, a, b, ref in zip(("q", "k", "v", "dqkv"), (*ours, d_ours), (*eager, d_eager),
                               (*exact, d_exact), strict=True):
        err, tol = _rel(a, ref), factor * _rel(b, ref) + 1e-6
        assert err <= tol, f"{name}: error {err:.2e} > {tol:.2e}"


def _hf_tables(batch: int, seq: int, head_dim: int, per_batch: bool, gen: torch.Generator):
    """transformers' (batch or 1, seq, head_dim) cos/sin: cat(freqs, freqs), positions per row."""
    inv_freq = 10_000.0 ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    rows = batch if per_batch else 1
    positions = torch.stack([torch.randperm(seq + 5, generator=gen)[:seq] for _ in range(rows)])
    angles = positions[..., None].double() * inv_freq
    emb = torch.cat((angles, angles), dim=-1)
    return emb.cos().float().to(DEVICE), emb.sin().float().to(DEVICE)


def _hf_eager(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, heads: int, kv: int):
    """transformers' Llama path in the input dtype: rotate_half on q and k, then repeat_kv."""
    batch, seq, width = qkv.shape
    head_dim = width // (heads + 2 * kv)
    q, k, v = (t.unflatten(-1, (-1, head_dim)).transpose(1, 2)
               for t in qkv.split([heads * head_dim, kv * head_dim, kv * head_dim], dim=-1))
    c, s = cos.to(qkv.dtype).unsqueeze(1), sin.to(qkv.dtype).unsqueeze(1)

    def rotate(x: torch.Tensor) -> torch.Tensor:
        first, second = x.chunk(2, dim=-1)
        return x * c + torch.cat((-second, first), dim=-1) * s

    return rotate(q), *(t.repeat_interleave(heads // kv, 1) for t in (rotate(k), v))


@pytest.mark.parametrize(("batch", "seq", "heads", "kv", "head_dim", "per_batch"),
                         [(2, 5, 4, 2, 6, False), (1, 13, 6, 1, 16, True), (3, 7, 3, 3, 10, True),
                          (2, 9, 14, 2, 8, False)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_halves_and_grouped_kv_match_transformers_and_float64(rk, batch, seq, heads, kv, head_dim,
                                                               per_batch, dtype) -> None:
    """transformers' layout: rotate_half pairs, per-sequence positions, key/value heads repeated to
    the query heads; the backward sums each group back into its key/value head."""
    gen = torch.Generator().manual_seed(batch * 1000 + seq * 10 + heads + kv)
    cos, sin = _hf_tables(batch, seq, head_dim, per_batch, gen)
    half = head_dim // 2
    qkv = torch.randn(batch, seq, (heads + 2 * kv) * head_dim, generator=gen).to(DEVICE, dtype)
    qkv.requires_grad_(True)
    grads = [torch.randn(batch, heads, seq, head_dim, generator=gen).to(DEVICE, dtype) for _ in range(3)]

    ours = rk.rope_qkv(qkv, cos[..., :half], sin[..., :half], heads, kv_heads=kv, halves=True)
    (d_ours,) = torch.autograd.grad(ours, (qkv,), grads)
    qkv64 = qkv.detach().double().requires_grad_(True)
    exact = rk.rope_qkv_reference(qkv64, cos[..., :half], sin[..., :half], heads, kv_heads=kv, halves=True)
    (d_exact,) = torch.autograd.grad(exact, (qkv64,), [g.double() for g in grads])
    exact_hf = _hf_eager(qkv64, cos.double(), sin.double(), heads, kv)
    eager = _hf_eager(qkv, cos, sin, heads, kv)
    (d_eager,) = torch.autograd.grad(eager, (qkv,), grads)

    for a, b in zip(exact, exact_hf, strict=True):  # the reference is transformers' math
        assert torch.allclose(a, b, rtol=1e-12, atol=1e-12)
    assert [t.shape for t in ours] == [(batch, heads, seq, head_dim)] * 3
    assert all(t.is_contiguous() and t.dtype == dtype for t in ours)
    assert torch.equal(ours[2], eager[2])  # v is repeated, not rotated
    factor = LOW_PRECISION_FACTOR if dtype == torch.bfloat16 else 2.0
    for name, a, b, ref in zip(("q", "k", "v", "dqkv"), (*ours, d_ours), (*eager, d_eager),
                               (*exact, d_exact), strict=True):
        err, tol = _rel(a, ref), factor * _rel(b, ref) + 1e-6
        assert err <= tol, f"{name}: error {err:.2e} > {tol:.2e}"


def test_grouped_rejects_heads_that_do_not_divide(rk) -> None:
    cos = torch.ones(6, 2, device=DEVICE)
    with pytest.raises(ValueError, match="multiple of kv_heads"):
        rk.rope_qkv(torch.randn(1, 6, (3 + 2 * 2) * 4, device=DEVICE), cos, cos, 3, kv_heads=2)
    with pytest.raises(ValueError, match="tables"):
        rk.rope_qkv(torch.randn(2, 6, 3 * 4, device=DEVICE), cos.expand(3, 6, 2), cos.expand(3, 6, 2), 1)


def test_float64_and_the_inverse_rotation(rk) -> None:
    rope = RotaryEmbedding(8, 11).to(DEVICE)
    qkv = torch.randn(2, 11, 3 * 2 * 8, dtype=torch.float64, device=DEVICE, requires_grad=True)
    ours = rk.rope_qkv(qkv, rope.cos, rope.sin, 2)
    exact = rk.rope_qkv_reference(qkv, rope.cos, rope.sin, 2)
    for a, b in zip(ours, exact, strict=True):
        assert torch.allclose(a, b, rtol=1e-12, atol=1e-12)
    # the rotation is orthogonal (up to the fp32 tables): the gradient of sum(out^2) is 2 * qkv
    (grad,) = torch.autograd.grad(sum((t * t).sum() for t in ours), (qkv,))
    assert torch.allclose(grad, 2 * qkv, rtol=1e-6, atol=1e-6)
    assert not torch.allclose(ours[0], qkv[..., :16].reshape(2, 11, 2, 8).transpose(1, 2), atol=1e-3)


def test_unused_outputs_get_zero_gradients(rk) -> None:
    rope = RotaryEmbedding(4, 6).to(DEVICE)
    qkv = torch.randn(1, 6, 3 * 3 * 4, device=DEVICE, requires_grad=True)
    q, _, _ = rk.rope_qkv(qkv, rope.cos, rope.sin, 3)
    (grad,) = torch.autograd.grad(q.sum(), (qkv,))
    assert grad[..., 12:].abs().max().item() == 0.0 and grad[..., :12].abs().min().item() > 0.0


def test_rejects_bad_shapes(rk) -> None:
    rope = RotaryEmbedding(4, 6).to(DEVICE)
    with pytest.raises(ValueError, match="even head_dim"):
        rk.rope_qkv(torch.randn(1, 6, 3 * 2 * 3, device=DEVICE), rope.cos, rope.sin, 2)
    with pytest.raises(ValueError, match="tables"):
        rk.rope_qkv(torch.randn(1, 9, 3 * 2 * 4, device=DEVICE), rope.cos, rope.sin, 2)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize(("heads", "head_dim"), [(12, 64), (25, 64), (32, 80)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_real_sizes_on_gpu(rk, heads, head_dim, dtype) -> None:
    test_matches_eager_and_float64(rk, 4, 512, heads, head_dim, dtype)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize(("heads", "kv", "head_dim"), [(32, 8, 64), (14, 2, 64), (32, 8, 128)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_transformers_layout_at_real_sizes_on_gpu(rk, heads, kv, head_dim, dtype) -> None:
    test_halves_and_grouped_kv_match_transformers_and_float64(rk, 2, 2048, heads, kv, head_dim, True, dtype)
