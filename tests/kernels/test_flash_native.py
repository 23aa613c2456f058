"""The C++ host path of flash_attention (lmscope.kernels.flash_native, csrc/flash_native.cpp).

CPU: the parameter slots it builds from a compiled kernel's signature (Triton's launcher layout),
its refusals, and that the tensor table of the C++ file matches the kernels' argument names.
GPU: the C++ path gives the Python path's bits (same kernels and arguments) for several layouts,
and hands back to Python wherever it must (misaligned inputs, python_path(), other dO layouts).
"""

from __future__ import annotations

import re
import struct
from types import SimpleNamespace

import pytest
import torch
from flash_contract import assert_saves_lse

pytest.importorskip("triton")

from lmscope.kernels import flash_attention as fa  # noqa: E402
from lmscope.kernels import flash_native  # noqa: E402
from lmscope.kernels.flash_attention import native_path as fa_native  # noqa: E402
from lmscope.kernels.flash_attention import triton_kernels as fa_kernels  # noqa: E402


def _compiled(signature: dict, **meta) -> SimpleNamespace:
    """A stand-in CompiledKernel: what param_slots reads."""
    defaults = {"num_ctas": 1, "launch_cooperative_grid": False, "launch_pdl": False,
                "global_scratch_size": 0, "profile_scratch_size": 0}  # fmt: skip
    metadata = SimpleNamespace(**{**defaults, **meta})
    return SimpleNamespace(metadata=metadata, src=SimpleNamespace(signature=signature))


SIGNATURE = {"A": "*bf16", "B": "*fp32", "s0": "i32", "s1": "i64", "one": "constexpr",
             "scale": "fp32", "wide": "fp64", "BLOCK": "constexpr"}  # fmt: skip


def test_param_slots_follow_triton_launcher_layout():
    """Pointers become table slots, ints two's-complement bits, floats their IEEE bits,
    constexprs nothing; two null scratch pointers close the list."""
    rest = (-3, 2**40 + 7, 1, 0.3, -1.25, 64)
    tensors, values = flash_native.param_slots(_compiled(SIGNATURE), (5, 9), rest)
    assert tensors == [5, 9, -1, -1, -1, -1, -1, -1]
    fp32_bits = int.from_bytes(struct.pack("<f", 0.3), "little")
    fp64_bits = int.from_bytes(struct.pack("<d", -1.25), "little")
    assert values == [0, 0, (-3) & (2**64 - 1), 2**40 + 7, fp32_bits, fp64_bits, 0, 0]
    # the low four bytes of an i32 slot are the int32 the kernel reads
    assert struct.unpack("<i", values[2].to_bytes(8, "little")[:4])[0] == -3


@pytest.mark.parametrize(
    "signature, meta, rest",
    [
        (SIGNATURE, {"num_ctas": 2}, (1, 2, 1, 0.5, 0.5, 64)),  # a cluster launch
        (SIGNATURE, {"global_scratch_size": 128}, (1, 2, 1, 0.5, 0.5, 64)),  # scratch wanted
        (SIGNATURE, {"launch_pdl": True}, (1, 2, 1, 0.5, 0.5, 64)),
        (SIGNATURE, {}, (1, 2, 1, 0.5, 0.5)),  # one argument short
        ({**SIGNATURE, "scale": "fp16"}, {}, (1, 2, 1, 0.5, 0.5, 64)),  # a half scalar
        ({**SIGNATURE, "s0": ("i32", "i32")}, {}, ((1, 2), 2, 1, 0.5, 0.5, 64)),  # a tuple
        (SIGNATURE, {}, (1.5, 2, 1, 0.5, 0.5, 64)),  # a float where an int is compiled
        ({**SIGNATURE, "A": "i32"}, {}, (1, 2, 1, 0.5, 0.5, 64)),  # a tensor slot not a pointer
    ],
)
def test_param_slots_refuse_what_the_cpp_path_does_not_repeat(signature, meta, rest):
    assert flash_native.param_slots(_compiled(signature, **meta), (0, 1), rest) is None


def test_tensor_slots_match_the_cpp_table_and_the_kernels_arguments():
    """Each launch's slots name, in the C++ table, the tensors its kernel takes in that order."""
    source = flash_native._SOURCE.read_text()
    table = re.search(r"enum Slot : int \{([^}]*)\}", source).group(1)
    names = [n.strip() for n in table.split(",")]
    assert names[-1] == "N_TENSORS"
    alias = {"LSE": "L", "DELTA": "D"}  # the kernels' names for the C++ table's L and D
    for kernel, slots in ((fa_kernels._attn_fwd, fa_native._FWD_SLOTS),
                          (fa_kernels._attn_bwd_dq, fa_native._DQ_SLOTS),
                          (fa_kernels._attn_bwd_dkdv, fa_native._DKDV_SLOTS)):  # fmt: skip
        args = kernel.fn.arg_names[: len(slots)]
        assert [names[i] for i in slots] == [alias.get(a, a) for a in args]


def test_python_path_turns_the_cpp_path_off_while_open():
    with fa.python_path():
        with fa.python_path():
            assert not fa_native._native_allowed(fa.DQ_MODE)
        assert not fa_native._native_allowed(fa.DQ_MODE)
    assert fa_native._PYTHON_ONLY[0] == 0


def test_reset_starts_a_new_generation():
    before = flash_native.generation()
    flash_native.reset()
    assert flash_native.generation() == before + 1


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU-only answer")
def test_no_extension_without_cuda():
    assert flash_native.extension() is None


# --------------------------------------------------------------------------------------------
# GPU: the C++ path against the Python path
# --------------------------------------------------------------------------------------------

def _tensors(shape_q, shape_k, dtype, seed, model_layout=False):
    gen = torch.Generator().manual_seed(seed)
    made = [torch.randn(*s, generator=gen) for s in (shape_q, shape_k, shape_k, shape_q)]
    if model_layout:  # (B, T, H, d) memory seen as (B, H, T, d), as the model calls it
        made = [t.transpose(1, 2).contiguous().transpose(1, 2) for t in made]
    return [t.to(device="cuda", dtype=dtype) for t in made]


def _fwd_bwd(q, k, v, do, causal):
    q, k, v = (t.detach().requires_grad_(True) for t in (q, k, v))
    o = fa.flash_attention(q, k, v, causal)
    o.backward(do)
    return o, q.grad, k.grad, v.grad


def _is_native(o: torch.Tensor) -> bool:
    return "Native" in o.grad_fn.name()


def _register(q, k, v, do, causal):
    """Run forward+backward until a call takes the C++ path (the plan handed over)."""
    for _ in range(fa_native._NATIVE_TRIES + 1):
        if _is_native(_fwd_bwd(q, k, v, do, causal)[0]):
            return
    pytest.fail("the plan was not handed to the C++ path")


CASES = [  # (q shape, k shape, dtype, causal, model layout)
    ((2, 3, 77, 64), (2, 3, 77, 64), torch.bfloat16, True, False),
    ((1, 2, 130, 80), (1, 2, 130, 80), torch.float16, False, False),
    ((2, 2, 50, 32), (2, 2, 70, 32), torch.bfloat16, True, False),
    ((2, 4, 96, 64), (2, 4, 96, 64), torch.bfloat16, True, True),
    ((1, 2, 33, 16), (1, 2, 45, 16), torch.float32, True, False),
]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("shape_q, shape_k, dtype, causal", [
    ((2, 3, 77, 64), (2, 3, 90, 64), torch.bfloat16, True),
    ((1, 2, 130, 80), (1, 2, 61, 80), torch.float16, False),
])  # fmt: skip
def test_cpp_path_saves_exactly_one_lse(shape_q, shape_k, dtype, causal):
    """The saved-tensor contract on the C++ path too (its node shows no saved_tensors to
    Python; a saved-tensors hook sees what it saves): exactly one (..., n_queries) tensor, L;
    the backward from the hook's unpacked tensors gives the Python path's bits."""
    q, k, v, do = _tensors(shape_q, shape_k, dtype, seed=shape_q[2])
    _register(q, k, v, do, causal)
    with fa.python_path():
        python = _fwd_bwd(q, k, v, do, causal)
    saved = []
    leaves = [t.detach().requires_grad_(True) for t in (q, k, v)]
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        o = fa.flash_attention(*leaves, causal)
    assert _is_native(o)
    assert_saves_lse(tuple(saved), q, k, causal)
    o.backward(do)
    for name, a, b in zip(("O", "dQ", "dK", "dV"), (o, *(t.grad for t in leaves)), python, strict=True):
        assert torch.equal(a, b), name


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("shape_q, shape_k, dtype, causal, model_layout", CASES)
def test_cpp_path_gives_the_python_paths_bits(shape_q, shape_k, dtype, causal, model_layout):
    q, k, v, do = _tensors(shape_q, shape_k, dtype, seed=sum(shape_q), model_layout=model_layout)
    _register(q, k, v, do, causal)
    with fa.python_path():
        expected = _fwd_bwd(q, k, v, do, causal)
        assert not _is_native(expected[0])
    got = _fwd_bwd(q, k, v, do, causal)
    assert _is_native(got[0])
    assert got[0].stride() == expected[0].stride()
    for a, b in zip(got, expected, strict=True):
        assert torch.equal(a, b)
    # dO in another layout: copied into the kernels' layout, same bits
    other = do.contiguous() if model_layout else do.transpose(1, 2).contiguous().transpose(1, 2)
    assert other.stride() != do.stride()
    got_other = _fwd_bwd(q, k, v, other, causal)
    for a, b in zip(got_other, expected, strict=True):
        assert torch.equal(a, b)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cpp_path_hands_back_to_python_where_it_must(monkeypatch):
    q, k, v, do = _tensors((2, 2, 64, 64), (2, 2, 64, 64), torch.bfloat16, seed=3)
    _register(q, k, v, do, True)
    # misaligned inputs (another binary's specialisation): the Python path, same values
    base = torch.empty(q.numel() + 1, device="cuda", dtype=q.dtype)
    q_off = base[1:].view(q.shape)
    q_off.copy_(q)
    o_off, *grads_off = _fwd_bwd(q_off, k, v, do, True)
    assert not _is_native(o_off)
    o, *grads = _fwd_bwd(q, k, v, do, True)
    assert _is_native(o)
    for a, b in zip((o, *grads), (o_off, *grads_off), strict=True):  # another binary: close
        torch.testing.assert_close(a, b, atol=2e-2, rtol=2e-2)
    # a signature it has not seen: Python; under no_grad: the C++ forward, same O
    o_new, *_ = _fwd_bwd(q[:, :1], k[:, :1], v[:, :1], do[:, :1], True)
    assert not _is_native(o_new)
    with torch.no_grad():
        assert torch.equal(fa.flash_attention(q, k, v, True), o)
    # atomic dQ mode (its plans are never handed over): Python
    default_mode = fa.DQ_MODE
    monkeypatch.setattr(fa, "DQ_MODE", "atomic")
    assert not _is_native(_fwd_bwd(q, k, v, do, True)[0])
    monkeypatch.setattr(fa, "DQ_MODE", default_mode)
    # a cleared autotuner cache (re-tuning): Python, which learns again and resets the C++ plans
    fa_kernels._attn_fwd.cache.clear()
    assert not _is_native(_fwd_bwd(q, k, v, do, True)[0])
    _register(q, k, v, do, True)
    # after a reset: Python again until handed over anew
    flash_native.reset()
    o_reset, *_ = _fwd_bwd(q, k, v, do, True)
    assert not _is_native(o_reset)
    _register(q, k, v, do, True)
    assert _is_native(_fwd_bwd(q, k, v, do, True)[0])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cpp_path_on_another_thread():
    """A new Python thread, which may have no current CUDA context, gets the same bits from the
    C++ path (it binds the device's primary context as Triton's launcher does)."""
    import threading

    q, k, v, do = _tensors((2, 2, 64, 64), (2, 2, 64, 64), torch.bfloat16, seed=2)
    _register(q, k, v, do, True)
    expected, got = _fwd_bwd(q, k, v, do, True), []
    thread = threading.Thread(target=lambda: got.append(_fwd_bwd(q, k, v, do, True)))
    thread.start()
    thread.join()
    assert _is_native(got[0][0])
    for a, b in zip(got[0], expected, strict=True):
        assert torch.equal(a, b)
