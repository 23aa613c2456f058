"""Triton FlashAttention-2 against a float64 reference.

Without CUDA the kernels run in Triton's CPU interpreter at tiny shapes, in a child pytest that
`test_flash_triton_in_interpreter` starts with TRITON_INTERPRET=1 (see tests/support/
triton_child.py); in the parent those tests skip. Tests marked ``gpu`` run the compiled kernels
at real sizes.
"""

from __future__ import annotations

import random

import pytest
import torch
from flash_contract import assert_saves_lse
from triton_child import rerun_in_interpreter, skip_in_parent

pytest.importorskip("triton")

from lmscope.kernels import flash_attention as fa  # noqa: E402
from lmscope.kernels.attention_reference import (  # noqa: E402
    attention_naive,
    attention_reference,
    reference_with_grads,
    relative_error,
)
from lmscope.kernels.flash_attention import dispatch as fa_dispatch  # noqa: E402
from lmscope.kernels.flash_attention import launcher as fa_launcher  # noqa: E402
from lmscope.kernels.flash_attention import plan as fa_plan  # noqa: E402

PARENT = "test_flash_triton_in_interpreter"


def test_flash_triton_in_interpreter() -> None:
    rerun_in_interpreter(__file__)


@pytest.fixture(autouse=True)
def _kernels_run_here(request):
    if request.node.name != PARENT and not request.node.get_closest_marker("gpu"):
        skip_in_parent(PARENT)


DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def _inputs(lead, nq, nk, d, dtype, seed, device=DEVICE):
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(*lead, n, d, generator=gen) for n in (nq, nk, nk))
    do = torch.randn(*lead, nq, d, generator=gen)
    q, k, v, do = (t.to(device=device, dtype=dtype) for t in (q, k, v, do))
    for t in (q, k, v):
        t.requires_grad_(True)
    return q, k, v, do


def _assert_layout(o):
    """O of a (..., H, n, d) input is a view of (..., n, H, d) memory; 2-d/3-d O is contiguous."""
    if o.ndim < 4:
        assert o.is_contiguous()
    else:
        assert o.transpose(-3, -2).is_contiguous(), o.stride()


def _check_against_reference(q, k, v, do, causal, dq_mode=None):
    """Assert O, L, dQ, dK, dV are within 2x the error of torch's naive same-dtype attention."""
    o, lse = fa.flash_attention_forward(q, k, v, causal)
    g = fa.flash_attention_backward(do, q, k, v, o, lse, causal, dq_mode=dq_mode)

    assert o.dtype == q.dtype and o.shape == q.shape
    _assert_layout(o)
    assert lse.dtype == torch.float32 and lse.shape == q.shape[:-1]
    _assert_within_twice_torch(q, k, v, do, causal, o, g, lse)


def _assert_within_twice_torch(q, k, v, do, causal, o, grads, lse=None):
    """O, dQ, dK, dV within 2x the error of torch's naive same-dtype attention against float64;
    L (if given) within 1e-4 of float64."""
    ref_o, ref_l, *ref_g = reference_with_grads(q, k, v, do, causal)
    leaves = [t.detach().requires_grad_(True) for t in (q, k, v)]
    naive_o = attention_naive(*leaves, causal)
    naive_g = torch.autograd.grad(naive_o, leaves, do)
    if lse is not None:
        assert (lse.double() - ref_l).abs().max().item() < 1e-4
    for name, ours, theirs, ref in zip(
        ("O", "dQ", "dK", "dV"), (o, *grads), (naive_o, *naive_g), (ref_o, *ref_g), strict=True
    ):
        err, tol = relative_error(ours, ref), 2 * relative_error(theirs, ref)
        assert err <= tol, f"{name}: error {err:.2e} > 2x torch's {q.dtype} error ({tol:.2e})"


CPU_CASES = [  # (leading dims, n_queries, n_keys, head dim, causal, dtype)
    ((2, 3), 37, 37, 16, True, "fp32"),
    ((2, 3), 37, 37, 16, False, "bf16"),
    ((2, 2), 23, 40, 32, True, "bf16"),
    ((3,), 40, 19, 16, True, "fp32"),
    ((3,), 29, 33, 16, False, "fp16"),
    ((), 33, 17, 32, False, "fp32"),
    ((2,), 21, 21, 24, True, "bf16"),  # head dim padded to 32 inside the kernel
    ((2,), 19, 19, 80, True, "bf16"),  # 2.7B's head dim: column tiles 64 + 16 (split_head_dim)
    ((), 17, 22, 96, False, "fp32"),  # 64 + 32
    ((2,), 13, 29, 40, True, "bf16"),  # 32 + 16, the tail tile half masked
]


@pytest.mark.parametrize("case", CPU_CASES, ids=lambda c: f"{c[0]}-{c[1]}x{c[2]}-d{c[3]}-{c[5]}")
def test_matches_reference(case):
    lead, nq, nk, d, causal, dt = case
    q, k, v, do = _inputs(lead, nq, nk, d, DTYPES[dt], seed=CPU_CASES.index(case))
    _check_against_reference(q, k, v, do, causal)


@pytest.mark.parametrize("causal", [False, True])
def test_atomic_dq_mode(causal):
    q, k, v, do = _inputs((2, 2), 35, 26, 16, torch.float32, seed=11 + causal)
    _check_against_reference(q, k, v, do, causal, dq_mode="atomic")


def test_unknown_dq_mode_refused_with_the_modes_there_are():
    q, k, v, do = _inputs((1, 1), 8, 8, 16, torch.float32, seed=3)
    o, lse = fa.flash_attention_forward(q.detach(), k.detach(), v.detach())
    with pytest.raises(ValueError, match="separate, atomic, got 'fast'"):
        fa.flash_attention_backward(do, q, k, v, o, lse, dq_mode="fast")


DQ_MODES = ("auto", "separate", "atomic")
# (leading dims, n_queries, n_keys, head dim, causal): 4-d with fewer queries than keys, and 2-d
# with more (a 2-d input's L has n_queries floats, as many as the separate backward's scratch).
CONTRACT_CASES = [((2, 3), 19, 26, 16, True), ((), 23, 17, 16, False)]


@pytest.mark.parametrize("dq_mode", DQ_MODES)
@pytest.mark.parametrize("case", CONTRACT_CASES, ids=lambda c: f"{len(c[0]) + 2}d-{c[1]}x{c[2]}-c{int(c[4])}")
def test_function_saves_exactly_one_lse_in_every_dq_mode(case, dq_mode, monkeypatch):
    """The documented contract (docs/kernels/flash_attention.md): among ``o.grad_fn``'s saved
    tensors exactly one has shape (..., n_queries), and it is L, float32, equal to the float64
    log-sum-exp of the scaled scores, whichever dQ mode the backward will take."""
    monkeypatch.setattr(fa, "DQ_MODE", dq_mode)
    lead, nq, nk, d, causal = case
    q, k, v, _ = _inputs(lead, nq, nk, d, torch.float32, seed=nq + len(lead))
    o = fa.FlashAttentionTriton.apply(q, k, v, causal)
    assert_saves_lse(o.grad_fn.saved_tensors, q, k, causal)


def test_saved_lse_shares_one_allocation_with_the_backward_scratch_and_expanded_grad():
    """Separate dQ mode: L is a view of the head of one float32 buffer, saved beside it, whose
    tail (16-byte aligned) is the backward's D (one allocation for both; the separate mode's
    dK/dV kernel gets the plan's unused dQ accumulator); o.sum() gives backward an expanded,
    stride-0 dO."""
    q, k, v, _ = _inputs((2, 2), 19, 26, 16, torch.float32, seed=5)
    o = fa.FlashAttentionTriton.apply(q, k, v, True)
    *_, lse, buffer = o.grad_fn.saved_tensors
    # L (76 floats), D (76 floats) at 128
    assert lse.shape == (2, 2, 19) and lse.data_ptr() == buffer.data_ptr()
    assert buffer.dtype == torch.float32 and buffer.ndim == 1 and buffer.numel() == 128 + 76
    o.sum().backward()
    q2, k2, v2 = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    attention_reference(q2, k2, v2, True)[0].sum().backward()
    for a, b in ((q, q2), (k, k2), (v, v2)):
        assert relative_error(a.grad, b.grad) < 1e-5


@pytest.mark.parametrize("dq_mode", ["separate", "atomic"])
def test_autograd_gives_the_bits_of_the_direct_functions(dq_mode, monkeypatch):
    """The Function's backward reuses the forward's plan and buffer: same bits as calling
    flash_attention_forward and flash_attention_backward (5-d input: the plan's reshapes)."""
    monkeypatch.setattr(fa, "DQ_MODE", dq_mode)
    q, k, v, do = _inputs((2, 1, 2), 21, 18, 24, torch.bfloat16, seed=31)
    o = fa.flash_attention(q, k, v, causal=True)
    grads = torch.autograd.grad(o, (q, k, v), do)
    direct = _fwd_bwd(q.detach(), k.detach(), v.detach(), do, True, dq_mode)
    for name, a, b in zip(("O", "dQ", "dK", "dV"), (o, *grads), (direct[0], *direct[2:]), strict=True):
        assert a.shape == b.shape and torch.equal(a, b), name


def test_strided_bthd_inputs():
    """(B, T, H, d) storage read through .transpose(1, 2) without a copy."""
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, n, 3, 16, generator=gen).to(DEVICE).transpose(1, 2)
               for n in (25, 31, 31))  # fmt: skip
    o = fa.flash_attention(q, k, v, causal=True)
    ref, _ = attention_reference(q, k, v, True)
    assert relative_error(o, ref) < 1e-5


def test_output_is_a_view_of_bthd_memory_and_backward_copies_nothing(monkeypatch):
    """The fast model's path: q, k, v strided (B, H, T, d) views of (B, T, H, d) memory;
    O.transpose(1, 2).reshape(B, T, H*d) is a view of O's memory, and the gradient of that
    (contiguous (B, T, H*d)) reaches the backward kernels as a strided view: no input of the
    backward (dO, O, q, k, v) is copied. Forward and backward match float64 (odd sizes, d
    padded in the kernel)."""
    b, h, t, d = 2, 3, 29, 24
    gen = torch.Generator().manual_seed(17)
    qkv = [torch.randn(b, t, h, d, generator=gen).to(DEVICE, torch.bfloat16) for _ in range(3)]
    q, k, v = (x.transpose(1, 2).requires_grad_(True) for x in qkv)  # non-leaf views: leaves
    g = torch.randn(b, t, h * d, generator=gen).to(DEVICE, torch.bfloat16)

    copies = []
    as4d = fa_plan._as4d

    def spy(x):
        out = as4d(x)
        copies.append(out.data_ptr() != x.data_ptr())
        return out

    for module in (fa, fa_dispatch, fa_plan):  # each module that takes 4-d views
        monkeypatch.setattr(module, "_as4d", spy)
    o = fa.flash_attention(q, k, v, causal=True)
    assert o.shape == (b, h, t, d) and o.stride() == (t * h * d, d, h * d, 1)
    merged = o.transpose(1, 2).reshape(b, t, h * d)
    assert merged.data_ptr() == o.data_ptr() and merged._base is o
    assert o._base is None  # its own tensor, not a view: it may be modified in place
    dq, dk, dv = torch.autograd.grad(merged, (q, k, v), g)
    assert copies and not any(copies), copies  # forward: q, k, v, O; backward: q, k, v, O, dO

    do = g.view(b, t, h, d).transpose(1, 2)
    ref_o, _, *ref_g = reference_with_grads(q, k, v, do, True)
    naive_o = attention_naive(q, k, v, True)
    naive_g = torch.autograd.grad(naive_o, (q, k, v), do)
    for name, ours, theirs, ref in zip(("O", "dQ", "dK", "dV"), (o, dq, dk, dv),
                                       (naive_o, *naive_g), (ref_o, *ref_g), strict=True):  # fmt: skip
        err, tol = relative_error(ours, ref), 2 * relative_error(theirs, ref)
        assert err <= tol, f"{name}: error {err:.2e} > 2x torch's error ({tol:.2e})"


def test_five_dim_inputs_keep_the_layout_and_match():
    """(A, B, H, n, d): O is a view of (A, B, n, H, d) memory, read back in place by backward."""
    q, k, v, do = _inputs((2, 2, 2), 19, 23, 16, torch.float32, seed=8)
    _check_against_reference(q, k, v, do, True)


def test_random_shape():
    """A fresh random shape every run (kept tiny for the interpreter)."""
    rng = random.Random()
    nq, nk = rng.randint(1, 40), rng.randint(1, 40)
    causal = rng.random() < 0.5
    q, k, v, do = _inputs((2,), nq, nk, 16, torch.float32, seed=rng.randrange(2**31))
    o, lse = fa.flash_attention_forward(q, k, v, causal)
    ref_o, ref_l = attention_reference(q, k, v, causal)
    assert relative_error(o, ref_o) < 1e-5, (nq, nk, causal)
    assert (lse.double() - ref_l).abs().max().item() < 1e-4


def _fwd_bwd(q, k, v, do, causal, dq_mode=None):
    o, lse = fa.flash_attention_forward(q, k, v, causal)
    return (o, lse, *fa.flash_attention_backward(do, q, k, v, o, lse, causal, dq_mode=dq_mode))


@pytest.mark.parametrize("dq_mode", ["separate", "atomic"])
def test_direct_launch_after_the_first_call_gives_identical_results(dq_mode):
    """The first call at a key goes through triton.autotune; the next ones launch the JIT
    function directly with its choice (host cost, docs/kernels/flash_attention.md): same bits."""
    q, k, v, do = _inputs((2, 2), 27, 33, 16, torch.bfloat16, seed=21)
    launchers = [fa_launcher._FWD_LAUNCH, fa_launcher._DKDV_LAUNCH]
    launchers += [fa_launcher._DQ_LAUNCH] if dq_mode == "separate" else []
    for launcher in launchers:
        launcher.known.clear()  # forget earlier tests' choices: the next call is autotuned
    before = [launcher.direct_launches for launcher in launchers]
    autotuned = _fwd_bwd(q, k, v, do, True, dq_mode)
    assert [launcher.direct_launches for launcher in launchers] == before
    direct = _fwd_bwd(q, k, v, do, True, dq_mode)
    assert [launcher.direct_launches for launcher in launchers] == [n + 1 for n in before]
    for name, a, b in zip(("O", "L", "dQ", "dK", "dV"), autotuned, direct, strict=True):
        assert torch.equal(a, b), name


def test_plans_are_kept_per_signature_and_checked_once(monkeypatch):
    """The forward's checks and plan run once per (shapes, strides, dtypes, devices, causal):
    a hit skips them, a change of any of those makes a new plan (the key is exact)."""
    checked = []
    check = fa_plan._check_inputs
    monkeypatch.setattr(fa_plan, "_check_inputs", lambda *t: (checked.append(t), check(*t)))
    monkeypatch.setattr(fa_plan, "_PLANS", {})
    q, k, v, _ = _inputs((2, 3), 17, 17, 16, torch.float32, seed=41)
    plan = fa_plan._plan_for(q, k, v, True)
    assert fa_plan._plan_for(q.detach().clone(), k.clone(), v.clone(), True) is plan and len(checked) == 1
    bthd = q.detach().transpose(1, 2).contiguous().transpose(1, 2)  # same shape, other strides
    others = [(bthd, k, v, True), (q, k, v, False), (q.bfloat16(), k.bfloat16(), v.bfloat16(), True),
              (q[:, :, :16], k, v, True), (q, k.half(), v, True)]  # fmt: skip
    plans = [fa_plan._plan_for(*args) for args in others[:4]]
    assert len({id(p) for p in (plan, *plans)}) == 5 and len(checked) == 5
    assert plans[0].strides[:3] == bthd.stride()[:3] and plans[1].key[1] is False
    with pytest.raises(ValueError, match="dtypes differ"):
        fa_plan._plan_for(*others[4])
    assert len(fa_plan._PLANS) == 5  # the refused signature is not kept


def test_plans_stay_bounded(monkeypatch):
    monkeypatch.setattr(fa_plan, "_PLANS", {})
    monkeypatch.setattr(fa_plan, "_MAX_PLANS", 2)
    for n in (9, 10, 11):
        q, k, v, _ = _inputs((1, 2), n, n, 16, torch.float32, seed=n)
        fa_plan._plan_for(q, k, v, True)
    assert len(fa_plan._PLANS) == 1  # cleared when the third came


class _Subclass(torch.Tensor):
    """Stands in for a tensor subclass such as a compiler's fake tensor."""


def test_plans_of_tensor_subclasses_are_not_kept(monkeypatch):
    monkeypatch.setattr(fa_plan, "_PLANS", {})
    q, k, v, _ = _inputs((1, 2), 9, 9, 16, torch.float32, seed=8)
    sub = [t.detach().as_subclass(_Subclass) for t in (q, k, v)]
    plan = fa_plan._plan_for(*sub, True)
    assert fa_plan._PLANS == {} and fa_plan._plan_for(*sub, True) is not plan
    fa_plan._plan_for(q, k, v, True)
    assert len(fa_plan._PLANS) == 1


def test_bad_inputs_raise_at_every_call():
    """A refused signature is never kept: the same one-line error every time."""
    q = torch.randn(2, 5, 16, device=DEVICE)
    for _ in range(2):
        with pytest.raises(ValueError, match="n_queries"):
            fa.flash_attention(q, torch.randn(3, 5, 16, device=DEVICE), torch.randn(3, 5, 16))


def test_backward_launch_arguments_are_kept_per_do_layout(monkeypatch):
    monkeypatch.setattr(fa_plan, "_MAX_LAYOUTS", 2)
    q, k, v, _ = _inputs((2, 3), 17, 17, 16, torch.float32, seed=43)
    plan = fa_plan._plan(q, k, v, True)
    first = fa_plan._bwd_args(plan, (1, 2, 3, 1))
    assert fa_plan._bwd_args(plan, (1, 2, 3, 1)) is first
    assert first[0].args[9:12] == (1, 2, 3) and first[1].args[9:12] == (1, 2, 3)
    assert first[0].args[12:15] == plan.o_strides and first[1].args[12:] == plan.scalars
    fa_plan._bwd_args(plan, (4, 5, 6, 1))
    fa_plan._bwd_args(plan, (7, 8, 9, 1))
    assert len(plan.bwd) == 1 and fa_plan._bwd_args(plan, (1, 2, 3, 1)) is not first


def test_direct_backward_with_o_in_another_layout():
    """flash_attention_backward reads O through the strides it is given, not the plan's."""
    q, k, v, do = _inputs((2, 2), 21, 18, 16, torch.float32, seed=45)
    q, k, v = q.detach(), k.detach(), v.detach()
    o, lse = fa.flash_attention_forward(q, k, v, True)
    ours = fa.flash_attention_backward(do, q, k, v, o, lse, True)
    dense = o.contiguous()
    assert dense.stride() != o.stride()
    theirs = fa.flash_attention_backward(do, q, k, v, dense, lse, True)
    for name, a, b in zip("QKV", ours, theirs, strict=True):
        assert torch.equal(a, b), name
    plan = fa_plan._plan_for(q, k, v, True)
    assert list(plan.other_o) == [fa_plan._as4d(dense).stride()[:3]]  # kept: the next call reuses it
    fa.flash_attention_backward(do, q, k, v, dense, lse, True)
    assert len(plan.other_o) == 1


def test_plan_made_under_inference_mode_serves_training_calls(monkeypatch):
    """The plan's dQ-accumulator argument is a normal tensor (the autotuner zeroes it)."""
    monkeypatch.setattr(fa_plan, "_PLANS", {})
    q, k, v, _ = _inputs((1, 2), 11, 11, 16, torch.float32, seed=47)
    with torch.inference_mode():
        plan = fa_plan._plan_for(q.detach(), k.detach(), v.detach(), True)
    assert not plan.dq_acc.is_inference()
    plan.dq_acc.zero_()


def test_rejects_bad_inputs():
    q = torch.randn(2, 5, 16, device=DEVICE)
    with pytest.raises(ValueError, match="n_queries"):
        fa.flash_attention(q, torch.randn(3, 5, 16, device=DEVICE), torch.randn(3, 5, 16))
    with pytest.raises(ValueError, match="dtype"):
        fa.flash_attention(q.double(), q.double(), q.double())
    with pytest.raises(ValueError, match="head dim"):
        big = torch.randn(1, 4, 256, device=DEVICE)
        fa.flash_attention(big, big, big)


# ------------------------------------------------------------------------------ GPU, real sizes

GPU_CASES = [  # (batch, heads, n_queries, n_keys, head dim, causal, dtype)
    (2, 4, 1000, 1000, 64, True, "bf16"),
    (2, 4, 1000, 1000, 64, False, "bf16"),
    (2, 4, 1000, 1000, 64, True, "fp32"),
    (2, 4, 1000, 1000, 64, False, "fp32"),
    (1, 2, 4096, 4096, 128, True, "bf16"),
    (1, 2, 4096, 4096, 128, False, "bf16"),
    (1, 2, 4096, 4096, 128, True, "fp32"),
    (1, 3, 517, 333, 128, True, "bf16"),
    (2, 2, 77, 1029, 32, True, "fp16"),
    (2, 4, 1000, 1000, 80, True, "bf16"),  # 2.7B's head dim
    (1, 3, 517, 777, 96, False, "bf16"),
]


def _gpu_case_id(c):
    return f"{c[2]}x{c[3]}-d{c[4]}-c{int(c[5])}-{c[6]}"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("case", GPU_CASES, ids=_gpu_case_id)
def test_gpu_matches_reference(case):
    b, h, nq, nk, d, causal, dt = case
    q, k, v, do = _inputs((b, h), nq, nk, d, DTYPES[dt], seed=GPU_CASES.index(case), device="cuda")
    _check_against_reference(q, k, v, do, causal, dq_mode="separate")


ATOMIC_CASES = [GPU_CASES[0], GPU_CASES[2], (1, 3, 517, 333, 128, False, "bf16"),
                (1, 3, 333, 517, 128, True, "bf16"), (2, 2, 1000, 1000, 80, True, "bf16"),
                (1, 3, 517, 777, 96, False, "fp16"), (2, 2, 77, 1029, 16, True, "bf16")]  # fmt: skip


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("case", ATOMIC_CASES, ids=_gpu_case_id)
def test_gpu_atomic_dq_mode(case):
    """dQ accumulated by the dK/dV kernel with atomics (ragged n_q, n_q != n_k both ways,
    padded head dims, fp32)."""
    b, h, nq, nk, d, causal, dt = case
    q, k, v, do = _inputs((b, h), nq, nk, d, DTYPES[dt], seed=99 + nq + d, device="cuda")
    _check_against_reference(q, k, v, do, causal, dq_mode="atomic")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dq_mode", DQ_MODES)
@pytest.mark.parametrize("case", [(2, 3, 517, 333, 64, True, "bf16"), (1, 2, 300, 701, 80, False, "fp16"),
                                  (1, 2, 129, 131, 64, True, "fp32")], ids=_gpu_case_id)  # fmt: skip
def test_gpu_function_saves_exactly_one_lse_in_every_dq_mode(case, dq_mode, monkeypatch):
    """The saved-tensor contract with the compiled Triton kernels in each dQ mode (the Gluon
    kernels' in tests/kernels/test_flash_sm90.py), and the backward that reads what was saved:
    gradients within 2x torch's same-dtype error of float64."""
    monkeypatch.setattr(fa, "DQ_MODE", dq_mode)
    b, h, nq, nk, d, causal, dt = case
    q, k, v, do = _inputs((b, h), nq, nk, d, DTYPES[dt], seed=7 * nq + d, device="cuda")
    o = fa.FlashAttentionTriton.apply(q, k, v, causal)
    assert fa.last_kernels()["forward"] == "triton"
    assert_saves_lse(o.grad_fn.saved_tensors, q, k, causal)
    grads = torch.autograd.grad(o, (q, k, v), do)
    assert fa.last_kernels()["dq"] == ("triton-atomic" if dq_mode == "atomic" else "triton")
    _assert_within_twice_torch(q, k, v, do, causal, o, grads)


def _launchers():
    names = ["_FWD_LAUNCH", "_DKDV_LAUNCH"] + (["_DQ_LAUNCH"] if fa.DQ_MODE != "atomic" else [])
    return [getattr(fa_launcher, name).compiled for name in names]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("case", [(2, 3, 517, 333, 64, True), (1, 5, 1000, 1000, 80, True),
                                  (3, 2, 77, 1029, 80, False), (2, 2, 300, 300, 64, False)],
                         ids=lambda c: f"{c[2]}x{c[3]}-d{c[4]}-c{int(c[5])}")  # fmt: skip
@pytest.mark.parametrize("misaligned", [False, True], ids=["aligned", "misaligned"])
def test_gpu_compiled_launch_is_used_and_bit_identical_to_the_jit_launch(case, misaligned, monkeypatch):
    """After the first calls, every launch goes straight to the kept CompiledKernel
    (lmscope.kernels.triton_launch) and gives the bits of JITFunction.run's launch. A misaligned
    q (its data one element off 16 bytes) gets a kernel compiled for that, not the aligned one.
    Separate dQ mode: no atomics, so equal launches give equal bits."""
    monkeypatch.setattr(fa, "DQ_MODE", "separate")
    b, h, nq, nk, d, causal = case
    launchers = _launchers()
    assert all(launcher.supported for launcher in launchers), "this Triton's launch is not the expected one"
    q, k, v, do = _inputs((b, h), nq, nk, d, torch.bfloat16, seed=nq + d, device="cuda")
    if misaligned:
        flat = torch.empty(q.numel() + 1, dtype=q.dtype, device="cuda")
        q = flat[1:].view(q.shape).copy_(q.detach()).requires_grad_(True)
        assert q.data_ptr() % 16 != 0

    def fwd_bwd():  # the Python Function's launches (the C++ host path has its own test file)
        with fa.python_path():
            o = fa.flash_attention(q, k, v, causal=causal)
            return (o, *torch.autograd.grad(o, (q, k, v), do))

    fwd_bwd()
    fwd_bwd()  # tuned, and each launcher's kernel kept for these arguments
    before = [launcher.direct for launcher in launchers]
    direct = fwd_bwd()
    assert [launcher.direct for launcher in launchers] == [n + 1 for n in before]
    for launcher in launchers:
        launcher.supported = False
    try:
        through_jit = fwd_bwd()
    finally:
        for launcher in launchers:
            launcher.supported = True
    assert [launcher.direct for launcher in launchers] == [n + 1 for n in before]
    for name, a, ref in zip(("O", "dQ", "dK", "dV"), direct, through_jit, strict=True):
        assert torch.equal(a, ref), name
    ref_o, _ = attention_reference(q, k, v, causal)
    assert relative_error(direct[0], ref_o) < 2e-2


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("layout", ["bhtd", "bthd"])
def test_gpu_direct_functions_reuse_their_plan_and_launch_directly(layout, monkeypatch):
    """flash_attention_forward and flash_attention_backward keep their plan (and its launch
    arguments) per input signature too: from the third call every launch goes straight to the
    kept CompiledKernel, with the bits of JITFunction.run's launch, for contiguous inputs and
    for (B, T, H, d) memory read through .transpose(1, 2)."""
    monkeypatch.setattr(fa, "DQ_MODE", "separate")
    q, k, v, do = _inputs((2, 3), 300, 300, 64, torch.bfloat16, seed=7, device="cuda")
    q, k, v = q.detach(), k.detach(), v.detach()
    if layout == "bthd":
        q, k, v = (x.transpose(1, 2).contiguous().transpose(1, 2) for x in (q, k, v))
    launchers = _launchers()
    _fwd_bwd(q, k, v, do, True)
    _fwd_bwd(q, k, v, do, True)
    before = [launcher.direct for launcher in launchers]
    direct = _fwd_bwd(q, k, v, do, True)
    assert [launcher.direct for launcher in launchers] == [n + 1 for n in before]
    for launcher in launchers:
        launcher.supported = False
    try:
        through_jit = _fwd_bwd(q, k, v, do, True)
    finally:
        for launcher in launchers:
            launcher.supported = True
    for name, a, b in zip(("O", "L", "dQ", "dK", "dV"), direct, through_jit, strict=True):
        assert torch.equal(a, b), name


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_launch_hooks_see_every_kernel():
    """With a launch hook installed (what Triton's profiler does) launches go through
    JITFunction.run, and the hook sees each kernel's name."""
    from triton import knobs

    q, k, v, do = _inputs((2, 3), 200, 200, 64, torch.bfloat16, seed=4, device="cuda")
    for _ in range(2):
        torch.autograd.grad(fa.flash_attention(q, k, v, causal=True), (q, k, v), do)
    names: list[str] = []
    chain = knobs.runtime.launch_enter_hook
    hook = lambda metadata: names.append(metadata.get()["name"])  # noqa: E731
    chain.add(hook)
    before = [launcher.direct for launcher in _launchers()]
    try:
        torch.autograd.grad(fa.flash_attention(q, k, v, causal=True), (q, k, v), do)
    finally:
        chain.remove(hook)
    assert [launcher.direct for launcher in _launchers()] == before
    expected = ["_attn_fwd", "_attn_bwd_dq", "_attn_bwd_dkdv"] if fa.DQ_MODE != "atomic" else [
        "_attn_fwd", "_attn_bwd_dkdv"]  # fmt: skip
    seen = [n for n in names if "_attn_" in n]
    assert len(seen) == len(expected), names
    assert all(e in n for e, n in zip(expected, seen, strict=True)), names


def test_split_head_dim_tiles():
    """Powers of two stay one tile; others split where two tiles are narrower than the padding."""
    assert [fa.split_head_dim(d) for d in (16, 24, 40, 64, 80, 96, 112, 128)] == [
        (16, 0), (32, 0), (32, 16), (64, 0), (64, 16), (64, 32), (128, 0), (128, 0)]  # fmt: skip


@pytest.mark.parametrize("d", [40, 80])
def test_split_head_dim_atomic_dq_matches_separate(d):
    """The dK/dV kernel's atomic dQ adds both column tiles into the padded accumulator."""
    q, k, v, do = _inputs((2,), 21, 26, d, torch.float32, seed=d)
    o, lse = fa.flash_attention_forward(q.detach(), k.detach(), v.detach(), True)
    separate = fa.flash_attention_backward(do, q, k, v, o, lse, True, dq_mode="separate")
    atomic = fa.flash_attention_backward(do, q, k, v, o, lse, True, dq_mode="atomic")
    for name, a, b in zip(("dQ", "dK", "dV"), separate, atomic, strict=True):
        assert relative_error(a, b) < 1e-5, name


@pytest.mark.parametrize("lead", [(2, 3), (2, 2, 3)], ids=["4d", "5d"])
def test_saved_tensors_unpacked_in_another_layout(lead):
    """A saved-tensor hook may give Q, K, V, O back in another layout (save_on_cpu does): the
    backward plans for the tensors it got, and the gradients keep the inputs' shapes."""
    q, k, v, do = (t.detach() for t in _inputs(lead, 21, 21, 16, torch.float32, seed=len(lead)))
    q, k, v = (t.transpose(-3, -2).contiguous().transpose(-3, -2).requires_grad_(True) for t in (q, k, v))
    with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t.contiguous()):
        o = fa.flash_attention(q, k, v, causal=True)
    o.backward(do)
    q2, k2, v2 = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    attention_reference(q2, k2, v2, True)[0].backward(do)
    for a, b in ((q, q2), (k, k2), (v, v2)):
        assert a.grad.shape == a.shape
        assert relative_error(a.grad, b.grad) < 1e-5
