"""The Gluon Hopper forward (lmscope.kernels.flash_sm90): when it serves, and what it computes.

The choice (``serves``, ``describable``) is tested on the CPU. The kernel itself has no CPU
interpreter: its tests are marked ``gpu`` and need a compute-capability 9.0 device; they compare
O and L with a float64 reference beside torch's own same-dtype error, and the whole
``flash_attention`` forward+backward with the Gluon forward against the Triton one.
"""

from __future__ import annotations

import pytest
import torch
from flash_contract import assert_saves_lse

pytest.importorskip("triton")

from lmscope.kernels import flash_attention as fa  # noqa: E402
from lmscope.kernels import flash_sm90, flash_sm90_dkdv  # noqa: E402
from lmscope.kernels.attention_reference import (  # noqa: E402
    attention_naive,
    reference_with_grads,
    relative_error,
)
from lmscope.kernels.flash_attention import dispatch as fa_dispatch  # noqa: E402
from lmscope.kernels.flash_attention import plan as fa_plan  # noqa: E402

HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
needs_hopper = pytest.mark.skipif(
    not (HOPPER and flash_sm90.HAVE_GLUON), reason="needs an sm_90 GPU and Gluon"
)


def test_not_served_on_the_cpu_or_for_short_or_unsupported_inputs():
    q = torch.zeros(1, 2, 8, 64)
    assert not flash_sm90.serves(q, flash_sm90.MIN_WORK)
    assert not flash_sm90.serves(q.to(torch.bfloat16), flash_sm90.MIN_WORK)  # CPU


def test_served_by_dtype_head_dim_capability_and_work(monkeypatch):
    """The choice on a stand-in CUDA tensor: bf16/fp16, head dim 64 or 128, sm_90, enough work."""
    if not flash_sm90.HAVE_GLUON:
        pytest.skip("this Triton has no Gluon")
    from types import SimpleNamespace

    capability = [(9, 0)]
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability[0])

    def q(dtype=torch.bfloat16, d=128):
        return SimpleNamespace(is_cuda=True, dtype=dtype, shape=(1, 16, 8192, d), device="cuda:0")

    work = flash_sm90.MIN_WORK
    assert flash_sm90.serves(q(), work) and flash_sm90.serves(q(torch.float16, 64), work)
    assert not flash_sm90.serves(q(), work - 1)  # host-bound calls keep the Triton kernels
    assert not flash_sm90.serves(q(torch.float32), work)
    assert not flash_sm90.serves(q(d=96), work)
    capability[0] = (8, 0)
    assert not flash_sm90.serves(q(), work)
    capability[0] = (9, 0)
    monkeypatch.setattr(flash_sm90, "ENABLED", False)  # LMSCOPE_FLASH_SM90=0
    assert not flash_sm90.serves(q(), work)


@pytest.mark.parametrize("token_major", [False, True])
def test_describable_layouts(token_major):
    def make(n, h=3, d=64):
        if token_major:
            return torch.zeros(2, n, h, d, dtype=torch.bfloat16).transpose(1, 2)
        return torch.zeros(2, h, n, d, dtype=torch.bfloat16)

    q, k = make(40), make(24)
    assert flash_sm90.token_major(q) == token_major
    assert flash_sm90.describable(q, k, k, q)
    # mixed axis orders need two kinds of descriptor: the Triton forward serves them
    other = (
        make(24).transpose(1, 2).contiguous().transpose(1, 2) if not token_major else make(24).contiguous()
    )
    assert flash_sm90.token_major(other) != token_major
    assert not flash_sm90.describable(q, other, other, q)


def test_not_describable_when_misaligned_or_strided_last_dim():
    base = torch.zeros(2 * 3 * 40 * 64 + 1, dtype=torch.bfloat16)
    shifted = base[1:].view(2, 3, 40, 64)  # 2-byte offset: not 16-byte aligned
    assert not flash_sm90.describable(shifted)
    padded_rows = torch.zeros(2, 3, 40, 72, dtype=torch.bfloat16)[..., :64]  # 144-byte rows: fine
    assert flash_sm90.describable(padded_rows) is True
    rows_not_16 = torch.zeros(2, 3, 40, 65, dtype=torch.bfloat16)[..., :64]  # 130-byte rows
    assert not flash_sm90.describable(rows_not_16)
    assert not flash_sm90.describable(torch.zeros(2, 3, 64, 40, dtype=torch.bfloat16).transpose(-1, -2))


CASES = [  # (B, H, n_q, n_k, d, causal, token_major, dtype)
    (1, 2, 256, 256, 64, True, False, torch.bfloat16),
    (2, 3, 1000, 1000, 128, True, True, torch.bfloat16),
    (2, 3, 1000, 1000, 128, True, False, torch.float16),
    (1, 4, 777, 777, 64, False, True, torch.bfloat16),
    (1, 2, 300, 700, 128, True, False, torch.bfloat16),
    (1, 2, 700, 300, 64, True, True, torch.float16),
    (1, 2, 300, 700, 128, False, False, torch.bfloat16),
    (1, 1, 64, 64, 128, True, False, torch.bfloat16),
    (1, 3, 129, 4099, 64, False, True, torch.bfloat16),
    (1, 2, 256, 700, 64, True, False, torch.bfloat16),  # causal key blocks past n_q: no query tiles
    (1, 2, 256, 700, 128, True, True, torch.bfloat16),  # the same at 128 (dQ's halves)
]


def _inputs(b, h, n_q, n_k, d, token_major, dtype, seed):
    gen = torch.Generator().manual_seed(seed)

    def one(n):
        if token_major:
            return torch.randn(b, n, h, d, generator=gen).to("cuda", dtype).transpose(1, 2)
        return torch.randn(b, h, n, d, generator=gen).to("cuda", dtype)

    return one(n_q), one(n_k), one(n_k)


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[2]}x{c[3]}-d{c[4]}-c{int(c[5])}-t{int(c[6])}")
@pytest.mark.parametrize("pingpong", [True, False], ids=["pingpong", "no-pingpong"])
def test_gpu_forward_matches_reference(case, pingpong):
    b, h, n_q, n_k, d, causal, token_major, dtype = case
    q, k, v = _inputs(b, h, n_q, n_k, d, token_major, dtype, seed=n_q + n_k + d)
    o = torch.empty_like(q)
    lse = torch.empty(q.shape[:-1], device="cuda", dtype=torch.float32)
    flash_sm90.forward(q, k, v, o, lse, causal, fa_plan.LOG2E / d**0.5, pingpong=pingpong)
    ref_o, ref_l, *_ = reference_with_grads(q, k, v, torch.zeros_like(q), causal)
    naive = attention_naive(q, k, v, causal)
    visible = ref_l.isfinite()  # causal rows with no key (n_q > n_k) have no softmax
    assert (lse.double() - ref_l)[visible].abs().max().item() < 1e-4
    ours, theirs = o[visible], naive[visible]
    assert relative_error(ours, ref_o[visible]) <= 2 * relative_error(theirs, ref_o[visible])


def _assert_within_twice_torch(q, k, v, do, causal, o, grads, lse=None) -> None:
    """O (and L, if given), dQ, dK, dV within 2x the error of torch's naive same-dtype attention
    against float64; causal rows with no key (n_q > n_k) have no softmax and are left out of O,
    L and dQ."""
    ref_o, ref_l, *ref_g = reference_with_grads(q, k, v, do, causal)
    leaves = [t.detach().requires_grad_(True) for t in (q, k, v)]
    naive_o = attention_naive(*leaves, causal)
    naive = (naive_o, *torch.autograd.grad(naive_o, leaves, do))
    visible = ref_l.isfinite()
    if lse is not None:
        assert lse.shape == ref_l.shape
        assert (lse.double() - ref_l)[visible].abs().max().item() < 1e-4
    refs = (ref_o, *ref_g)
    for name, ours, theirs, ref in zip(("O", "dQ", "dK", "dV"), (o, *grads), naive, refs, strict=True):
        assert ours.shape == ref.shape, name
        rows = visible if name in ("O", "dQ") else slice(None)
        err, tol = relative_error(ours[rows], ref[rows]), 2 * relative_error(theirs[rows], ref[rows])
        assert err <= tol, f"{name}: error {err:.2e} > 2x torch's {q.dtype} error ({tol:.2e})"


def _float64_stand_ins(monkeypatch) -> dict:
    """The three Gluon launches replaced by float64 computations with their contracts (O and L;
    dQ and D; dK and dV written into the buffers they are given), counted: on the CPU, the
    dispatch around them runs as it does on a Hopper GPU."""
    from lmscope.kernels import flash_sm90_dkdv, flash_sm90_dq

    calls = {"forward": 0, "dq": 0, "dkdv": 0}

    def forward(q, k, v, o, lse, causal, qk_scale):
        assert q.ndim == k.ndim == v.ndim == o.ndim == 4 and flash_sm90.describable(q, k, v)
        calls["forward"] += 1
        ref_o, ref_l, *_ = reference_with_grads(q, k, v, torch.zeros_like(q), causal)
        o.copy_(ref_o)
        lse.view(-1)[: ref_l.numel()].copy_(ref_l.flatten())  # by pointer, as the kernel writes

    def grads(q, k, v, do, lse, causal):
        assert q.ndim == do.ndim == 4 and lse.dtype == torch.float32
        return reference_with_grads(q, k, v, do, causal)[2:]

    def dq(q, k, v, do, o, lse, delta, dq_out, causal, qk_scale, sm_scale):
        assert o.ndim == 4 and dq_out.shape == q.shape and dq_out.is_contiguous()
        calls["dq"] += 1
        dq_out.copy_(grads(q, k, v, do, lse, causal)[0])
        delta.view(-1)[: q.shape[:-1].numel()].copy_((do.double() * o.double()).sum(-1).flatten())

    def dkdv(q, k, v, do, lse, delta, dk, dv, causal, qk_scale, sm_scale, dq_acc=None):
        assert dk.shape == dv.shape == k.shape and dk.is_contiguous()
        calls["dkdv"] += 1
        ref_dq, ref_dk, ref_dv = grads(q, k, v, do, lse, causal)
        dk.copy_(ref_dk)
        dv.copy_(ref_dv)
        if dq_acc is not None:  # dQ / sm_scale added to the zeroed float32 rows
            dq_acc[: ref_dq.numel()].view(ref_dq.shape).add_(ref_dq.double() / sm_scale)

    class Preprocess:
        """The Triton kernel of the atomic dQ mode that computes D = rowsum(dO * O) and zeroes
        the dQ accumulator, by its launch arguments."""

        def __getitem__(self, grid):
            def launch(o, do, delta, dq_acc, *args, **constants):
                rows = (do.double() * fa_plan._as4d(o).double()).sum(-1)
                delta[: do.shape[:-1].numel()].copy_(rows.flatten())
                dq_acc.fill_(float("nan"))  # the kernel zeroes the rows dQ's shares are added to
                dq_acc[: do.numel()].zero_()

            return launch

    monkeypatch.setattr(flash_sm90, "serves", lambda q, work: True)
    monkeypatch.setattr(flash_sm90, "HAVE_TMA_REDUCE", True)  # whatever this Triton has
    monkeypatch.setattr(flash_sm90, "forward", forward)
    monkeypatch.setattr(flash_sm90_dq, "dq", dq)
    monkeypatch.setattr(flash_sm90_dkdv, "dkdv", dkdv)
    monkeypatch.setattr(fa_dispatch, "_bwd_preprocess", Preprocess())
    for module in (fa_plan, fa_dispatch):  # let CPU tensors through the input check
        monkeypatch.setattr(module, "_INTERPRET", True)
    fa_plan._PLANS.clear()
    return calls


@pytest.mark.parametrize("have_reduce", [True, False], ids=["reduce", "no-reduce"])
@pytest.mark.parametrize("shape", [(3, 40, 64), (2, 3, 1, 33, 128), (40, 64), (2, 3, 37, 64)],
                         ids=["3d", "5d", "2d", "4d"])  # fmt: skip
def test_dispatch_to_the_gluon_kernels_on_the_cpu(shape, have_reduce, monkeypatch):
    """The plumbing around the Gluon kernels, with float64 stand-ins for them: inputs of any rank
    reach them as 4-d views (O as well, in the backward), their outputs come back in the inputs'
    shapes, through the autograd Function and the direct functions, and ``last_kernels`` says
    so. A 4-d input's O has (B, T, H, d) memory: the forward gets it in that order."""
    calls = _float64_stand_ins(monkeypatch)
    monkeypatch.setattr(flash_sm90, "HAVE_TMA_REDUCE", have_reduce)
    gen = torch.Generator().manual_seed(len(shape))
    q, k, v, do = (torch.randn(*shape, generator=gen, dtype=torch.bfloat16) for _ in range(4))
    leaves = [t.detach().requires_grad_(True) for t in (q, k, v)]
    o = fa.FlashAttentionTriton.apply(*leaves, True)
    o.backward(do)
    atomic = have_reduce  # the "auto" dQ mode's choice: the reduce-adds wherever they exist
    assert calls == {"forward": 1, "dq": int(not atomic), "dkdv": 1}
    dq_kind = "gluon-sm90-atomic" if atomic else "gluon-sm90"
    assert fa.last_kernels() == {"forward": "gluon-sm90", "dq": dq_kind, "dkdv": "gluon-sm90"}
    _assert_within_twice_torch(q, k, v, do, True, o, [t.grad for t in leaves])
    o2, lse = fa.flash_attention_forward(q, k, v, True)
    grads = fa.flash_attention_backward(do, q, k, v, o2, lse, True)
    _assert_within_twice_torch(q, k, v, do, True, o2, grads, lse)
    fa_plan._PLANS.clear()


@pytest.mark.parametrize("shape", [(3, 40, 64), (2, 3, 37, 128)], ids=["3d", "4d"])
def test_atomic_dq_mode_dispatches_to_the_gluon_dkdv_kernel_on_the_cpu(shape, monkeypatch):
    """In the atomic dQ mode the Gluon dK/dV kernel also accumulates dQ (no dQ kernel): D from the
    preprocess, dQ from the float32 rows it adds to, scaled and cast; float64 stand-ins."""
    calls = _float64_stand_ins(monkeypatch)
    gen = torch.Generator().manual_seed(len(shape) + 11)
    q, k, v, do = (torch.randn(*shape, generator=gen, dtype=torch.bfloat16) for _ in range(4))
    o, lse = fa.flash_attention_forward(q, k, v, True)
    grads = fa.flash_attention_backward(do, q, k, v, o, lse, True, dq_mode="atomic")
    assert calls == {"forward": 1, "dq": 0, "dkdv": 1}
    assert fa.last_kernels() == {"forward": "gluon-sm90", "dq": "gluon-sm90-atomic", "dkdv": "gluon-sm90"}
    _assert_within_twice_torch(q, k, v, do, True, o, grads, lse)
    fa_plan._PLANS.clear()


DQ_MODES = ("auto", "separate", "atomic")


@pytest.mark.parametrize("dq_mode", DQ_MODES)
@pytest.mark.parametrize("shape", [(2, 3, 37, 64), (40, 128)], ids=["4d", "2d"])
def test_gluon_path_saves_exactly_one_lse_on_the_cpu(shape, dq_mode, monkeypatch):
    """The saved-tensor contract (docs/kernels/flash_attention.md) where the Gluon kernels serve,
    in every dQ mode, with float64 stand-ins for them: exactly one saved (..., n_queries) tensor,
    float32, the log-sum-exp; the backward reads it and the scratch from what was saved."""
    _float64_stand_ins(monkeypatch)
    monkeypatch.setattr(fa, "DQ_MODE", dq_mode)
    gen = torch.Generator().manual_seed(len(shape) + 17)
    q, k, v, do = (torch.randn(*shape, generator=gen, dtype=torch.bfloat16) for _ in range(4))
    leaves = [t.detach().requires_grad_(True) for t in (q, k, v)]
    o = fa.FlashAttentionTriton.apply(*leaves, True)
    assert fa.last_kernels()["forward"] == "gluon-sm90"
    assert_saves_lse(o.grad_fn.saved_tensors, q, k, True)
    o.backward(do)
    _assert_within_twice_torch(q, k, v, do, True, o, [t.grad for t in leaves])
    fa_plan._PLANS.clear()


def _count_gluon_launches(monkeypatch) -> dict:
    """Counters of the three Gluon kernels' launches, through the module functions."""
    from lmscope.kernels import flash_sm90_dkdv, flash_sm90_dq

    calls = {"forward": 0, "dq": 0, "dkdv": 0}
    for module, name in ((flash_sm90, "forward"), (flash_sm90_dq, "dq"), (flash_sm90_dkdv, "dkdv")):
        real = getattr(module, name)

        def counted(*args, _name=name, _real=real, **kwargs):
            calls[_name] += 1
            return _real(*args, **kwargs)

        monkeypatch.setattr(module, name, counted)
    return calls


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("dq_mode", ["separate", "atomic"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[2]}x{c[3]}-d{c[4]}-c{int(c[5])}-t{int(c[6])}")
def test_gpu_gluon_kernels_match_reference(case, dq_mode, monkeypatch):
    """Forward and backward through the Gluon kernels (the work threshold lowered so small
    shapes take them), with the dQ kernel or with dQ's shares added by the dK/dV kernel's TMA
    reduce-adds: O, L, dQ, dK, dV within 2x torch's same-dtype error of float64."""
    b, h, n_q, n_k, d, causal, token_major, dtype = case
    monkeypatch.setattr(flash_sm90, "MIN_WORK", 1)
    fa_plan._PLANS.clear()
    calls = _count_gluon_launches(monkeypatch)
    atomic = dq_mode == "atomic"
    q, k, v = _inputs(b, h, n_q, n_k, d, token_major, dtype, seed=(5 if atomic else 3) * n_q + n_k + d)
    do = torch.randn_like(q)
    o, lse = fa.flash_attention_forward(q, k, v, causal)
    grads = fa.flash_attention_backward(do, q, k, v, o, lse, causal, dq_mode=dq_mode)
    fa_plan._PLANS.clear()
    assert calls == {"forward": 1, "dq": int(not atomic), "dkdv": 1}
    assert fa.last_kernels()["dq"] == ("gluon-sm90-atomic" if atomic else "gluon-sm90")
    _assert_within_twice_torch(q, k, v, do, causal, o, grads, lse)


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("dq_mode", DQ_MODES)
@pytest.mark.parametrize("case", [CASES[3], CASES[4]], ids=lambda c: f"{c[2]}x{c[3]}-d{c[4]}-c{int(c[5])}")
def test_gpu_gluon_path_saves_exactly_one_lse_in_every_dq_mode(case, dq_mode, monkeypatch):
    """The saved-tensor contract through the Gluon kernels (the work threshold lowered) in each
    dQ mode: exactly one saved (..., n_queries) tensor, float32, within 1e-4 of the float64
    log-sum-exp; the backward from what was saved within 2x torch's same-dtype error."""
    b, h, n_q, n_k, d, causal, token_major, dtype = case
    monkeypatch.setattr(flash_sm90, "MIN_WORK", 1)
    monkeypatch.setattr(fa, "DQ_MODE", dq_mode)
    fa_plan._PLANS.clear()
    q, k, v = _inputs(b, h, n_q, n_k, d, token_major, dtype, seed=13 * n_q + d)
    do = torch.randn_like(q)
    leaves = [t.detach().requires_grad_(True) for t in (q, k, v)]
    o = fa.FlashAttentionTriton.apply(*leaves, causal)
    assert fa.last_kernels()["forward"] == "gluon-sm90"
    assert_saves_lse(o.grad_fn.saved_tensors, q, k, causal)
    o.backward(do)
    fa_plan._PLANS.clear()
    reduce_adds = flash_sm90.HAVE_TMA_REDUCE
    expected = {"auto": "gluon-sm90-atomic" if reduce_adds else "gluon-sm90", "separate": "gluon-sm90",
                "atomic": "gluon-sm90-atomic" if reduce_adds else "triton-atomic"}  # fmt: skip
    assert fa.last_kernels()["dq"] == expected[dq_mode]
    _assert_within_twice_torch(q, k, v, do, causal, o, [t.grad for t in leaves])


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("d", flash_sm90.HEAD_DIMS)
def test_gpu_atomic_dq_on_time_matches_reference(d, monkeypatch):
    """The five-matmul backward with each tile's dQ share added at the end of that tile
    (``DQ_LAG = 0``, not the default): O and gradients within 2x torch's error of float64."""
    monkeypatch.setattr(flash_sm90, "MIN_WORK", 1)
    monkeypatch.setattr(flash_sm90_dkdv, "DQ_LAG", 0)
    fa_plan._PLANS.clear()
    q, k, v = _inputs(1, 3, 450, 517, d, True, torch.bfloat16, seed=11 * d)
    do = torch.randn_like(q)
    o, lse = fa.flash_attention_forward(q, k, v, True)
    grads = fa.flash_attention_backward(do, q, k, v, o, lse, True, dq_mode="atomic")
    fa_plan._PLANS.clear()
    assert fa.last_kernels()["dq"] == "gluon-sm90-atomic"
    _assert_within_twice_torch(q, k, v, do, True, o, grads, lse)


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("shape", [(3, 600, 64), (2, 3, 1, 700, 128), (700, 128)], ids=["3d", "5d", "2d"])
def test_gpu_gluon_kernels_serve_inputs_of_other_ranks(shape, monkeypatch):
    """(batch, seq, d) inputs (the classic study's), 5-d and 2-d ones through the autograd Function
    with the Gluon kernels: O and gradients within 2x torch's same-dtype error of float64."""
    monkeypatch.setattr(flash_sm90, "MIN_WORK", 1)
    fa_plan._PLANS.clear()
    calls = _count_gluon_launches(monkeypatch)
    gen = torch.Generator().manual_seed(len(shape))
    q, k, v, do = (torch.randn(*shape, generator=gen).to("cuda", torch.bfloat16) for _ in range(4))
    leaves = [t.detach().requires_grad_(True) for t in (q, k, v)]
    o = fa.flash_attention(*leaves, causal=True)
    o.backward(do)
    fa_plan._PLANS.clear()
    atomic = flash_sm90.HAVE_TMA_REDUCE  # the "auto" dQ mode's choice
    assert calls == {"forward": 1, "dq": int(not atomic), "dkdv": 1}
    _assert_within_twice_torch(q, k, v, do, True, o, [t.grad for t in leaves])


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("token_major", [False, True])
def test_gpu_flash_attention_takes_the_gluon_kernels_and_keeps_the_gradients(token_major, monkeypatch):
    """Through ``flash_attention`` (the autograd Function), with the work threshold lowered so a
    small shape takes the Gluon kernels: outputs and gradients against the Triton kernels' run."""
    q, k, v = _inputs(2, 3, 520, 520, 128, token_major, torch.bfloat16, seed=7)
    do = torch.randn_like(q)
    results = []
    calls = _count_gluon_launches(monkeypatch)
    for min_work in (1, 1 << 40):  # the Gluon kernels, then the Triton ones
        monkeypatch.setattr(flash_sm90, "MIN_WORK", min_work)
        fa_plan._PLANS.clear()
        before = dict(calls)
        leaves = [t.detach().requires_grad_(True) for t in (q, k, v)]
        o = fa.flash_attention(*leaves, causal=True)
        o.backward(do)
        launched = {name: calls[name] - before[name] for name in calls}
        gluon = min_work == 1
        atomic = gluon and flash_sm90.HAVE_TMA_REDUCE  # the "auto" dQ mode's choice
        assert launched == {"forward": int(gluon), "dq": int(gluon and not atomic), "dkdv": int(gluon)}
        kind = "gluon-sm90" if gluon else "triton"
        dq_kind = "gluon-sm90-atomic" if atomic else kind
        assert fa.last_kernels() == {"forward": kind, "dq": dq_kind, "dkdv": kind}
        results.append((o.detach(), *(t.grad for t in leaves)))
    fa_plan._PLANS.clear()
    for name, ours, triton in zip(("O", "dQ", "dK", "dV"), *results, strict=True):
        assert relative_error(ours, triton) <= 2e-2, name


@pytest.mark.parametrize("head_dim", flash_sm90.HEAD_DIMS)
@pytest.mark.parametrize("kernel", ["forward", "dq", "dkdv", "dkdv-atomic"])
def test_compiles_for_sm90_without_a_gpu(kernel, head_dim):
    """Each kernel builds for sm_90 with the installed Triton (its Gluon API moves between
    releases) into warp-specialised wgmma code fed by TMA; on the CPU, from host-side
    descriptors (``benchmarks/attention/sm90_builds.py``), with (B, H, n, d) inputs and an output
    or dO of (B, n, H, d) memory."""
    if not flash_sm90.HAVE_GLUON:
        pytest.skip("this Triton has no Gluon")
    from scripts import load_script

    builds = load_script("benchmarks/attention/sm90_builds.py", "sm90_builds")
    ptx, shared = builds.gluon_build(kernel, head_dim)
    assert "wgmma.mma_async" in ptx and "setmaxnreg" in ptx and "cp.async.bulk.tensor" in ptx
    assert ("cp.reduce.async.bulk.tensor" in ptx) == (kernel == "dkdv-atomic")  # dQ's TMA reduce-adds
    assert 0 < shared <= 232448  # sm_90's shared memory per block
