"""The flash-attention launcher: through triton.autotune once per key, then the JIT function.

These tests run Triton's real Autotuner (with the kernels' own config lists and pruner) around a
stand-in JIT function that records launches instead of running them, so they need neither a GPU
nor the interpreter: each launch's arguments, grid and options are compared as data.
"""

from __future__ import annotations

import inspect

import pytest
import torch

triton = pytest.importorskip("triton")

from lmscope.kernels.flash_attention import launcher as fa_launcher  # noqa: E402
from lmscope.kernels.flash_attention import tuning as fa_tuning  # noqa: E402
from lmscope.kernels.triton_launch import DirectLaunch, FixedArgs  # noqa: E402

if "do_bench" not in inspect.signature(triton.autotune).parameters:
    pytest.skip("this Triton's autotune takes no do_bench", allow_module_level=True)
if fa_tuning._INTERPRET:  # its lists hold one small config, which the autotuner launches untimed
    pytest.skip("the config lists under TRITON_INTERPRET=1 have nothing to tune", allow_module_level=True)

ARG_NAMES = ["Q", "n", "NQ_BUCKET", "NK_BUCKET",
             "HEAD_DIM", "D_PAD", "CAUSAL", "DOT_PREC", "BLOCK_M", "BLOCK_N", "HEAD_MAJOR"]  # fmt: skip
NAMES = ("BLOCK_M", "BLOCK_N")
WINNER = (64, False)  # (BLOCK_M, HEAD_MAJOR) that the fake benchmark times fastest


class FakeJit:
    """Stands in for a JITFunction: records (args, grid, kwargs) of each launch."""

    def __init__(self) -> None:
        def kernel(*args):  # the Autotuner looks for the Python function under .fn
            return None

        self.fn = kernel
        self.arg_names = ARG_NAMES
        self.launches: list[tuple] = []

    def run(self, *args, grid, warmup, **kwargs):
        assert not warmup
        meta = {**dict(zip(self.arg_names, args, strict=False)), **kwargs}
        self.launches.append((args, tuple(grid(meta) if callable(grid) else grid), kwargs))
        return FakeCompiled()


class FakeCompiled:
    """Stands in for the CompiledKernel JITFunction.run returns: records direct launches."""

    function, packed_metadata = "function", "packed"

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def run(self, *call):
        self.calls.append(call)


def _setup():
    jit = FakeJit()

    def bench(kernel_call, quantiles=None):
        kernel_call()
        kw = jit.launches[-1][2]
        t = 1.0 if (kw["BLOCK_M"], kw["HEAD_MAJOR"]) == WINNER else 2.0 + kw["BLOCK_M"] / 1000
        return [t, t, t]

    tuned = triton.autotune(
        configs=fa_tuning._configs(fa_tuning._FWD, NAMES),
        key=fa_tuning._TUNE_KEY,
        prune_configs_by={"early_config_prune": fa_tuning._pruner(fa_tuning._FWD, NAMES)},
        do_bench=bench,
    )(jit)
    return jit, tuned, fa_launcher._Launcher(tuned, "BLOCK_M")


FIXED: dict[int, FixedArgs] = {}  # kept per n, as flash attention keeps them per plan


def _call(launcher, bh: int, n: int = 200):
    q = torch.empty(bh, 1, 0, 64, dtype=torch.bfloat16)  # the pruner reads dtype and shape
    key = (64, True, torch.bfloat16, 256, 256, False, bh > 65535)
    launcher(key, n, bh, (q,), FIXED.setdefault(n, FixedArgs((n, 256, 256))))
    return q


def test_second_call_bypasses_the_autotuner_with_the_same_launch():
    jit, tuned, launcher = _setup()
    q = _call(launcher, bh=8)
    assert launcher.direct_launches == 0
    assert len(jit.launches) == 4 + 1  # 4 configs benchmarked (one launch each), then the run
    tuned_launch = jit.launches[-1]
    assert (tuned_launch[2]["BLOCK_M"], tuned_launch[2]["HEAD_MAJOR"]) == WINNER
    assert tuned_launch[1] == (4, 8)  # cdiv(200, 64) query tiles, then batch*heads

    launcher((64, True, torch.bfloat16, 256, 256, False, False), 200, 8, (q,), FixedArgs((200, 256, 256)))
    assert launcher.direct_launches == 1
    assert len(jit.launches) == 6  # one launch, no benchmarking
    assert jit.launches[-1] == tuned_launch  # same args, grid and options
    assert tuned.best_config.kwargs["BLOCK_M"] == 64


def test_cleared_autotuner_cache_sends_the_next_call_through_the_autotuner():
    jit, tuned, launcher = _setup()
    _call(launcher, bh=8)
    _call(launcher, bh=8)
    assert launcher.direct_launches == 1
    tuned.cache.clear()  # what re-tuning does (e124d15:benchmarks/flash_tune.py)
    _call(launcher, bh=8)
    assert launcher.direct_launches == 1
    assert len(jit.launches) == 5 + 1 + 5  # benchmarked again
    _call(launcher, bh=8)
    assert launcher.direct_launches == 2


def test_without_the_direct_path_every_call_is_autotuned():
    jit, _, launcher = _setup()
    launcher.run = None  # as on a Triton whose JIT function lacks run(grid=, warmup=)
    _call(launcher, bh=8)
    _call(launcher, bh=8)
    assert launcher.direct_launches == 0
    assert len(jit.launches) == 6  # tuned once (Triton's own cache), then autotuned launches
    (_, *first), (_, *second) = jit.launches[4][0], jit.launches[5][0]
    assert first == second and jit.launches[4][1:] == jit.launches[5][1:]


def test_many_heads_get_a_head_major_config_after_a_tuning_with_few():
    """Triton's key holds no batch*heads: the non-head-major choice made at 8 must not be
    reused at 70000, whose grid axis 1 would then exceed 65535."""
    jit, _, launcher = _setup()
    _call(launcher, bh=8)
    assert jit.launches[-1][2]["HEAD_MAJOR"] is False
    _call(launcher, bh=70000)
    args, grid, kw = jit.launches[-1]
    assert kw["HEAD_MAJOR"] is True and grid[0] == 70000
    _call(launcher, bh=70000)
    assert launcher.direct_launches == 1 and jit.launches[-1][1] == grid
    _call(launcher, bh=8)  # the few-heads choice is still known
    assert launcher.direct_launches == 2 and jit.launches[-1][2]["HEAD_MAJOR"] is False


def test_known_choice_launches_the_compiled_kernel_with_the_jit_launchs_arguments():
    """With the direct path on: the first launch at a known key goes through the JIT function
    (which returns the compiled kernel); the next ones call that kernel's launcher with the grid,
    stream, and every argument in the kernel's parameter order, constexprs included."""
    jit, _, launcher = _setup()
    launcher.compiled = DirectLaunch(jit, supported=True)
    launcher.compiled._device, launcher.compiled._stream = (lambda: 0), (lambda device: 77)
    _call(launcher, bh=8)  # autotuned
    _call(launcher, bh=8)  # known: through the JIT function, which compiles for these arguments
    jit_args, jit_grid, jit_kwargs = jit.launches[-1]
    assert launcher.compiled.direct == 0 and launcher.direct_launches == 1
    q = _call(launcher, bh=8)
    assert launcher.compiled.direct == 1 and len(jit.launches) == 6
    (compiled,) = next(iter(launcher.known.values()))[5].values()
    grid0, grid1, grid2, stream, function, packed, meta, enter, exit_, *args = compiled.calls[-1]
    assert (grid0, grid1, grid2) == (*jit_grid, 1) and stream == 77
    assert (function, packed, meta, enter, exit_) == ("function", "packed", None, None, None)
    assert args[0] is q and args[1:4] == [200, 256, 256]
    named = dict(zip(ARG_NAMES[1:], args[1:], strict=True))
    assert named == {**dict(zip(ARG_NAMES[1:], jit_args[1:], strict=False)),
                     **{n: v for n, v in jit_kwargs.items() if n in ARG_NAMES}}  # fmt: skip
