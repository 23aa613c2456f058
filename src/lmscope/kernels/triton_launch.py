"""Launch an already compiled Triton kernel without ``JITFunction.run``'s per-call work.

``JITFunction.run`` spends most of a small kernel's host time before the launch itself: it binds
and specialises every argument (the binder), builds a cache key from the result, checks the
globals the kernel read, and builds launch metadata for the launch hooks. ``DirectLaunch`` keeps
the ``CompiledKernel`` that ``JITFunction.run`` returned for one set of launch options and calls
its launcher with the same arguments, the way ``JITFunction.run`` calls it on a cache hit:
``kernel.run(grid0, grid1, grid2, stream, kernel.function, kernel.packed_metadata,
launch_metadata, enter_hook, exit_hook, *all_args)``.

A kept kernel is reused only where Triton would pick the same binary: ``spec_key`` records, per
argument, everything Triton specialises on (a tensor's dtype and 16-byte alignment; an int's
== 1, divisibility by 16 and 32/64-bit range; the kind of float, bool and None), and the key
also holds the current device and the knobs ``JITFunction.run`` adds to the options (debug,
instrumentation mode, fpsan casts). Everything else (the constexprs, num_warps, ...) is fixed per
``DirectLaunch.launch`` caller's ``kept`` dict, which belongs to one set of launch options.

Every call goes through ``JITFunction.run`` instead where that is needed to stay exact or
observable: a Triton whose ``JITFunction.run`` does not launch as above (checked once, from its
source), a kernel that is not a ``JITFunction`` (e.g. the CPU interpreter's), launch hooks
installed (profilers such as proton read kernel names from them), pre-run hooks on the kernel,
a stages-inspection hook, or an argument of a kind ``spec_key`` does not know.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

import torch

__all__ = ["DirectLaunch", "spec_key", "SUPPORTED"]

_I32_LO, _I32_HI, _U64_LO = -(2**31), 2**31, 2**63

# JITFunction.run's launch on a cache hit, whitespace removed: the call DirectLaunch repeats.
_LAUNCH_CALL = (
    "kernel.run(grid_0,grid_1,grid_2,stream,kernel.function,kernel.packed_metadata,launch_metadata,"
    "knobs.runtime.launch_enter_hook,knobs.runtime.launch_exit_hook,*bound_args.values())"
)
# The options JITFunction.run takes from Triton's knobs on every call (part of its cache key).
_KNOB_OPTIONS = {"debug", "instrumentation_mode", "fpsan_homomorphic_casts"}


def spec_key(args: tuple) -> tuple | None:
    """Per positional argument, what Triton specialises a kernel on; None for an argument kind
    this does not know.

    Tensor -> (dtype, data_ptr % 16 == 0); int -> -1 for 1 (Triton makes it a constant),
    else (divisible by 16) + 2 * (0: int32 range, 1: int64, 2: uint64); float -> "f";
    bool -> "b"; None -> None. Ints are keyed on all of these even where a kernel's
    ``do_not_specialize`` drops some: keying on more than Triton only compiles no more.
    """
    key = []
    append = key.append
    for a in args:
        kind = type(a)
        if kind is int:
            if a == 1:
                append(-1)
            else:
                size = 0 if _I32_LO <= a < _I32_HI else (1 if a < _U64_LO else 2)
                append((a % 16 == 0) + 2 * size)
        elif kind is float:
            append("f")
        elif isinstance(a, torch.Tensor):
            append((a.dtype, a.data_ptr() % 16 == 0))
        elif kind is bool:
            append("b")
        elif a is None:
            append(None)
        else:
            return None
    return tuple(key)


def _supported() -> bool:
    """Whether this Triton's JITFunction.run launches a compiled kernel as DirectLaunch does."""
    try:
        from triton import knobs
        from triton.runtime.jit import JITFunction

        source = "".join(inspect.getsource(JITFunction.run).split())
    except Exception:  # no knobs (Triton < 3.4), no source: stay on JITFunction.run
        return False
    assigned = (part.partition('"]') for part in source.split('kwargs["')[1:])
    options = {name for name, _, rest in assigned if rest.startswith("=")}
    return (
        _LAUNCH_CALL in source
        and options <= _KNOB_OPTIONS
        and hasattr(knobs.runtime, "launch_enter_hook")
        and hasattr(knobs.runtime, "launch_exit_hook")
    )


SUPPORTED = _supported()
"""True where this Triton's JITFunction.run launches the way DirectLaunch repeats (checked once)."""


def _hook_set(hook) -> bool:
    # Triton >= 3.4 holds an empty HookChain (which calls nothing) where no hook is installed.
    return hook is not None and bool(getattr(hook, "calls", True))


class DirectLaunch:
    """Launches one JIT function, through its kept ``CompiledKernel`` where Triton would reuse it.

    ``launch(kept, grid, args, tail, kwargs)``: ``args`` are the positional arguments,
    ``kwargs`` the constexprs and launch options (always the same ones for one ``kept`` dict),
    ``tail`` the constexpr values in the kernel's parameter order after ``args``. ``direct``
    counts the launches that bypassed ``JITFunction.run`` (for tests).
    """

    def __init__(self, jit, supported: bool | None = None):
        self.jit = jit
        if supported is None:
            from triton.runtime.jit import JITFunction

            supported = SUPPORTED and isinstance(jit, JITFunction)
        self.supported = supported
        self.direct = 0
        self._device: Callable[[], int] | None = None
        self._stream: Callable[[int], int] | None = None

    def _state(self) -> tuple | None:
        """(device, knob options) for the key, or None where JITFunction.run must launch."""
        from triton import knobs

        rt, comp = knobs.runtime, knobs.compilation
        if (
            _hook_set(rt.launch_enter_hook)
            or _hook_set(rt.launch_exit_hook)
            or getattr(rt, "add_stages_inspection_hook", None) is not None
            or getattr(self.jit, "pre_run_hooks", None)
        ):
            return None
        if self._device is None:
            from triton.runtime import driver

            self._device, self._stream = driver.active.get_current_device, driver.active.get_current_stream
        return (
            self._device(),
            rt.debug,
            comp.instrumentation_mode,
            getattr(comp, "fpsan_homomorphic_casts", None),
        )

    def launch(self, kept: dict, grid: tuple[int, int], args: tuple, tail: tuple, kwargs: dict) -> None:
        state = self._state() if self.supported else None
        spec = spec_key(args) if state is not None else None
        if spec is None:
            self.jit.run(*args, grid=grid, warmup=False, **kwargs)
            return
        key = (state, spec)
        kernel = kept.get(key)
        if kernel is None:  # first launch with this specialisation: Triton compiles or finds it
            kernel = self.jit.run(*args, grid=grid, warmup=False, **kwargs)
            if all(hasattr(kernel, a) for a in ("run", "function", "packed_metadata")):
                kept[key] = kernel
            return
        self.direct += 1
        kernel.run(grid[0], grid[1], 1, self._stream(state[0]), kernel.function,
                   kernel.packed_metadata, None, None, None, *args, *tail)  # fmt: skip
