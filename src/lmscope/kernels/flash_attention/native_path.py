"""Handing a plan to the C++ host path (lmscope.kernels.flash_native), and when it may serve.

Once a plan's three Triton kernels have been launched directly (kept by the launchers),
``_hand_to_native`` gives the C++ extension the same binaries, arguments and grids, launched
with cuLaunchKernel; ``flash_attention`` then calls ``_NATIVE`` while ``_native_allowed``.
``LMSCOPE_FLASH_NATIVE=0`` turns it off; ``python_path()`` keeps the Python Function for a block.
Host cost per call: docs/kernels/flash_attention_host_notes.md.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator

import torch

from lmscope.kernels import flash_native
from lmscope.kernels.flash_attention.launcher import _DKDV_LAUNCH, _DQ_LAUNCH, _FWD_LAUNCH, _LAUNCHERS
from lmscope.kernels.flash_attention.plan import _bwd_args, _Plan, _scratch

# The C++ host path (flash_native): the extension once a plan has been handed over, and how
# many ``python_path()`` blocks are open (the FLOP counter patches the Python Function).
_NATIVE = None
_PYTHON_ONLY = [0]
_NATIVE_TRIES = 4  # Python backwards per plan that may try the hand-over (kernels kept by the 2nd)
# The CompiledKernels whose CUfunctions C++ plans launch: kept alive here for good (newer Tritons
# unload a kernel's module when its CompiledKernel is collected; Triton's own caches hold them too).
_NATIVE_KERNELS: set = set()
# Tensor table indices of csrc/flash_native.cpp (Q K V O L D DO DQ DK DV DQ_ACC), per launch in
# the kernels' argument order.
_FWD_SLOTS = (0, 1, 2, 3, 4)  # Q K V O LSE
_DQ_SLOTS = (0, 1, 2, 6, 3, 4, 5, 7)  # Q K V DO O LSE DELTA DQ
_DKDV_SLOTS = (0, 1, 2, 6, 4, 5, 8, 9, 10)  # Q K V DO LSE DELTA DK DV DQ_ACC


def _hand_to_native(
    plan: _Plan, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, do_strides: tuple
) -> None:
    """Give ``plan`` to the C++ host path once all three of its kernels have been launched
    directly (kept), for dO of ``do_strides``; a few tries per plan and ``flash_native``
    generation, then no more."""
    global _NATIVE
    generation = flash_native.generation()
    tries = plan.native.get(generation, 0)
    if tries < 0 or tries >= _NATIVE_TRIES or type(q) is not torch.Tensor or not q.is_cuda or plan.sm90:
        return
    if not (plan.bh and plan.n_q and plan.scalars[2]):
        return  # nothing to launch
    plan.native.clear()
    plan.native[generation] = tries + 1
    dq_args, dkdv_args = _bwd_args(plan, do_strides)
    launches, kernels = [], []
    for launcher, fixed, n, slots in (
        (_FWD_LAUNCH, plan.fwd, plan.n_q, _FWD_SLOTS),
        (_DQ_LAUNCH, dq_args, plan.n_q, _DQ_SLOTS),
        (_DKDV_LAUNCH, dkdv_args, plan.scalars[2], _DKDV_SLOTS),
    ):
        kept = launcher.kept_kernel(plan.key, fixed)
        if kept is None:
            return
        compiled, block, head_major, tail = kept
        params = flash_native.param_slots(compiled, slots, (*fixed.args, *tail))
        if params is None:
            plan.native[generation] = _NATIVE_TRIES
            return
        tiles = -(-n // block)
        grid = (plan.bh, tiles) if head_major else (tiles, plan.bh)
        meta = compiled.metadata
        launches.append((compiled.function, *grid, 32 * meta.num_warps, meta.shared, *params))
        kernels.append(compiled)
    ext = flash_native.extension()
    if ext is None:
        plan.native[generation] = _NATIVE_TRIES
        return
    _NATIVE_KERNELS.update(kernels)
    try:
        ext.add_plan(q, k, v, plan.key[1], list(plan.o_strides_nd or ()), plan.l_size + _scratch(plan, False),
                     plan.l_size, list(do_strides), plan.dq_acc, *launches)  # fmt: skip
    except RuntimeError as error:  # e.g. the CUDA driver's entry points not found: stay on Python
        plan.native[generation] = _NATIVE_TRIES
        warnings.warn(f"lmscope flash attention: the C++ host path refused a plan ({error}); "
                      "this shape stays on the Python path", stacklevel=2)  # fmt: skip
        return
    plan.native[generation] = -1
    _NATIVE = ext


@contextlib.contextmanager
def python_path() -> Iterator[None]:
    """Inside, every ``flash_attention`` call goes through ``FlashAttentionTriton`` (Python), not
    the C++ host path: for code that patches or observes the Python Function (FLOP counting)."""
    _PYTHON_ONLY[0] += 1
    try:
        yield
    finally:
        _PYTHON_ONLY[0] -= 1


def _native_allowed(dq_mode: str) -> bool:
    """Whether the C++ path may launch now: nobody asked for the Python path, no compiler is
    tracing, the dQ mode (``dq_mode``: the package's ``DQ_MODE``) is not the atomic one (its
    plans were made in separate mode, which "auto" is for every plan it hands over: the Gluon
    kernels' plans stay in Python), no
    autotuner's cache was cleared since (re-tuning: the Python path learns again and resets the
    C++ plans), and Triton would launch the kept kernels as they are (no launch or pre-run
    hooks, default debug and instrumentation knobs)."""
    return (
        not _PYTHON_ONLY[0]
        and dq_mode != "atomic"
        and not torch.compiler.is_compiling()
        and all(len(launcher.kernel.cache) == launcher.n_tuned for launcher in _LAUNCHERS)
        and _FWD_LAUNCH.compiled.unhooked()
        and not getattr(_DQ_LAUNCH.kernel.fn, "pre_run_hooks", None)
        and not getattr(_DKDV_LAUNCH.kernel.fn, "pre_run_hooks", None)
    )
