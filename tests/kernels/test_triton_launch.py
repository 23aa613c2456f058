"""DirectLaunch and its specialisation key, on CPU with stand-in kernels (no GPU, no interpreter).

The key must separate every pair of arguments that Triton compiles different binaries for: it is
checked against Triton's own argument specialisation, and the launcher must send each new
specialisation through JITFunction.run instead of reusing a kernel compiled for another.
"""

from __future__ import annotations

import itertools

import pytest
import torch

triton = pytest.importorskip("triton")

from lmscope.kernels import triton_launch as tlaunch  # noqa: E402
from lmscope.kernels.triton_launch import DirectLaunch, FixedArgs, tensor_key  # noqa: E402


def _aligned_and_not(dtype=torch.bfloat16):
    base = torch.empty(64, dtype=dtype)
    assert base.data_ptr() % 16 == 0
    return base, base[1:]  # one element on: 2 or 4 bytes off 16-byte alignment


INTS = [0, 1, 2, 3, 15, 16, 17, 32, -1, -16, -17, 2**31 - 16, 2**31 - 1, 2**31, 2**31 + 1,
        -(2**31), -(2**31) - 1, -(2**31) - 16, 2**40, 2**40 + 3, 2**63 - 1, 2**63, 2**63 + 1,
        2**64 - 16]  # fmt: skip


def _tensors() -> list:
    bf_a, bf_u = _aligned_and_not(torch.bfloat16)
    f32_a, f32_u = _aligned_and_not(torch.float32)
    return [bf_a, bf_u, bf_a[8:], f32_a, f32_u, torch.empty(3, dtype=torch.float16)]


def _scalars() -> list:
    return [*INTS, 0.5, 1.0, -3.0, 0.0, -0.0, True, False, None]


def _native():
    libtriton = pytest.importorskip("triton._C.libtriton")
    native = getattr(libtriton, "native_specialize_impl", None)
    if native is None:
        pytest.skip("this Triton has no native_specialize_impl")
    from triton.backends.compiler import BaseBackend

    return lambda a: native(BaseBackend, a, False, True, True)


def test_tensor_key_separates_whatever_triton_specialises_on():
    """Equal keys imply equal Triton specialisation (type and attribute), for every pair."""
    native, samples = _native(), _tensors()
    theirs = [native(a) for a in samples]
    ours = [tensor_key((a,)) for a in samples]
    for (i, a), (j, b) in itertools.combinations(enumerate(samples), 2):
        if ours[i] == ours[j]:
            assert theirs[i] == theirs[j], (a, b, theirs[i], theirs[j])


def test_fixed_args_know_the_kinds_triton_specialises_by_value():
    """Every scalar kind is one FixedArgs knows (so a kept kernel is keyed on the object that
    holds exactly these values); objects of other kinds send launches through JITFunction.run."""
    native = _native()
    for a in _scalars():
        native(a)  # a kind Triton takes as a kernel argument
        assert FixedArgs((a,)).plain
    assert FixedArgs((*INTS, 0.5, None)).args == (*INTS, 0.5, None)
    assert not FixedArgs(("ieee",)).plain and not FixedArgs((3, object())).plain


def test_tensor_key_on_the_cases_that_matter():
    aligned, misaligned = _aligned_and_not()
    assert tensor_key((aligned,)) != tensor_key((misaligned,))
    assert tensor_key((aligned,)) != tensor_key((aligned.float(),))
    assert tensor_key((aligned,)) == tensor_key((aligned[8:],))  # 16 bytes on: still aligned
    assert tensor_key((aligned, misaligned)) != tensor_key((misaligned, aligned))  # per position
    assert tensor_key((aligned, aligned.float())) != tensor_key((aligned.float(), aligned))


class FakeCompiled:
    """Stands in for a CompiledKernel: records the launcher's calls."""

    function, packed_metadata = "cu-function", ("packed",)

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def run(self, *call):
        self.calls.append(call)


class FakeJit:
    """Stands in for a JITFunction: each run 'compiles' a new kernel for its specialisation."""

    def __init__(self) -> None:
        self.runs: list[tuple] = []
        self.pre_run_hooks: list = []

    def run(self, *args, grid, warmup, **kwargs):
        assert not warmup
        self.runs.append((args, grid, kwargs))
        return FakeCompiled()


def _direct(supported=True):
    jit = FakeJit()
    launch = DirectLaunch(jit, supported=supported)
    launch._device, launch._stream = (lambda: 0), (lambda device: 1000 + device)
    return jit, launch


TAIL = (64, "tf32", 128)  # constexprs after the positional arguments
KW = {"HEAD_DIM": 64, "DOT_PREC": "tf32", "BLOCK": 128, "num_warps": 4}


def test_second_launch_goes_straight_to_the_compiled_kernel():
    jit, launch = _direct()
    kept: dict = {}
    x, _ = _aligned_and_not()
    fixed = FixedArgs((48, 7, 0.125))
    launch.launch(kept, (3, 5), (x,), fixed, TAIL, KW)
    assert len(jit.runs) == 1 and launch.direct == 0 and len(kept) == 1
    assert jit.runs[0] == ((x, 48, 7, 0.125), (3, 5), KW)
    kernel = next(iter(kept.values()))
    launch.launch(kept, (4, 5), (x,), fixed, TAIL, KW)
    assert len(jit.runs) == 1 and launch.direct == 1
    assert kernel.calls == [(4, 5, 1, 1000, "cu-function", ("packed",), None, None, None, x, 48, 7, 0.125,
                             *TAIL)]  # fmt: skip


@pytest.mark.parametrize("change", ["misaligned", "dtype", "device", "other values, another FixedArgs",
                                    "equal values, another FixedArgs"])  # fmt: skip
def test_a_new_specialisation_is_not_given_another_kernel(change):
    jit, launch = _direct()
    kept: dict = {}
    x, misaligned = _aligned_and_not()
    fixed = FixedArgs((48, 7))
    launch.launch(kept, (1, 1), (x,), fixed, TAIL, KW)
    tensors, values = {
        "misaligned": ((misaligned,), (48, 7)),
        "other values, another FixedArgs": ((x,), (47, 1)),  # what Triton specialises ints on
        "dtype": ((x.float(),), (48, 7)),
        "device": ((x,), (48, 7)),
        "equal values, another FixedArgs": ((x,), (48, 7)),
    }[change]
    if change == "device":
        launch._device = lambda: 1
    same = not change.endswith("another FixedArgs")
    other = fixed if same else FixedArgs(values)
    launch.launch(kept, (1, 1), tensors, other, TAIL, KW)
    assert launch.direct == 0 and len(jit.runs) == 2 and jit.runs[-1][0] == (*tensors, *values)
    assert len(kept) == 2
    launch.launch(kept, (1, 1), tensors, other, TAIL, KW)  # now known too
    assert launch.direct == 1 and len(jit.runs) == 2


def test_kept_aligned_finds_the_kernel_of_aligned_tensors_for_these_arguments():
    """What lmscope's C++ host path launches: the kept kernel for ``fixed`` with every tensor
    16-byte aligned on the current device; nothing for a misaligned launch or another device."""
    jit, launch = _direct()
    kept: dict = {}
    x, misaligned = _aligned_and_not()
    fixed = FixedArgs((48, 7))
    assert launch.kept_aligned(kept, fixed) is None
    launch.launch(kept, (1, 1), (misaligned,), fixed, TAIL, KW)
    assert launch.kept_aligned(kept, fixed) is None  # only a misaligned one kept
    launch.launch(kept, (1, 1), (x,), fixed, TAIL, KW)
    aligned = launch.kept_aligned(kept, fixed)
    assert aligned is not None and aligned is not launch.kept_aligned(kept, FixedArgs((48, 7)))
    assert launch.kept_aligned({k: v for k, v in kept.items() if v is not aligned}, fixed) is None
    launch._device = lambda: 1
    assert launch.kept_aligned(kept, fixed) is None


def test_launch_hooks_send_every_launch_through_the_jit_function():
    from triton import knobs

    jit, launch = _direct()
    kept: dict = {}
    x, _ = _aligned_and_not()
    fixed = FixedArgs((3,))
    launch.launch(kept, (1, 1), (x,), fixed, TAIL, KW)
    seen = []

    def hook(metadata):
        seen.append(metadata)

    chain = knobs.runtime.launch_enter_hook
    if hasattr(chain, "add"):
        chain.add(hook)
        restore = lambda: chain.remove(hook)  # noqa: E731
    else:  # a Triton whose hook is a plain attribute
        knobs.runtime.launch_enter_hook = hook
        restore = lambda: setattr(knobs.runtime, "launch_enter_hook", chain)  # noqa: E731
    try:
        launch.launch(kept, (1, 1), (x,), fixed, TAIL, KW)
    finally:
        restore()
    assert launch.direct == 0 and len(jit.runs) == 2
    launch.launch(kept, (1, 1), (x,), fixed, TAIL, KW)
    assert launch.direct == 1


def test_pre_run_hooks_and_unknown_arguments_and_unsupported_triton_use_the_jit_function():
    x, _ = _aligned_and_not()
    jit, launch = _direct()
    kept: dict = {}
    odd = FixedArgs(("not a kernel argument kind",))
    for _ in range(2):
        launch.launch(kept, (1, 1), (x,), odd, TAIL, KW)
    assert launch.direct == 0 and len(jit.runs) == 2 and not kept
    assert jit.runs[-1][0] == (x, "not a kernel argument kind")

    fixed = FixedArgs((3,))
    jit.pre_run_hooks.append(lambda *a, **k: None)
    for _ in range(2):
        launch.launch(kept, (1, 1), (x,), fixed, TAIL, KW)
    assert launch.direct == 0 and len(jit.runs) == 4

    jit, launch = _direct(supported=False)
    for _ in range(2):
        launch.launch(kept, (1, 1), (x,), fixed, TAIL, KW)
    assert launch.direct == 0 and len(jit.runs) == 2


def test_the_interpreter_kernel_is_not_launched_directly():
    assert not DirectLaunch(object()).supported  # not a JITFunction


def test_this_triton_launches_as_expected():
    """Triton 3.4 to 3.9 launch from JITFunction.run with the call DirectLaunch repeats; a
    failure here means a new Triton changed it (DirectLaunch then stays off: slower, correct)."""
    major, minor = (int(p) for p in triton.__version__.split(".")[:2])
    if not (3, 4) <= (major, minor) <= (3, 9):
        pytest.skip(f"Triton {triton.__version__} not checked")
    assert tlaunch.SUPPORTED


def test_kept_kernels_stay_bounded(monkeypatch):
    monkeypatch.setattr(tlaunch, "_MAX_KEPT", 2)
    jit, launch = _direct()
    kept: dict = {}
    x, _ = _aligned_and_not()
    fixed = {n: FixedArgs((n,)) for n in (5, 6, 7)}
    for n in (5, 6, 7, 7):
        launch.launch(kept, (1, 1), (x,), fixed[n], TAIL, KW)
    assert len(kept) == 1 and len(jit.runs) == 3 and launch.direct == 1  # cleared at the third


def test_fixed_args_cannot_change():
    """Kept kernels are keyed on the object: its arguments must stay what they were checked as."""
    fixed = FixedArgs([48, 7])
    assert fixed.args == (48, 7) and fixed.plain
    for name in ("args", "plain"):
        with pytest.raises(AttributeError, match="immutable"):
            setattr(fixed, name, (1,))
