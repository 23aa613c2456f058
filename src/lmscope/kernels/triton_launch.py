"""Launch an already compiled Triton kernel without ``JITFunction.run``'s per-call work.

``JITFunction.run`` spends most of a small kernel's host time before the launch itself: it binds
and specialises every argument (the binder), builds a cache key from the result, checks the
globals the kernel read, and builds launch metadata for the launch hooks. ``DirectLaunch`` keeps
the ``CompiledKernel`` that ``JITFunction.run`` returned for one set of launch options and calls
its launcher with the same arguments, the way ``JITFunction.run`` calls it on a cache hit:
``kernel.run(grid0, grid1, grid2, stream, kernel.function, kernel.packed_metadata,
launch_metadata, enter_hook, exit_hook, *all_args)``.

A kept kernel is reused only where Triton would pick the same binary: ``spec_key`` holds each
tensor's dtype and 16-byte alignment and every other argument's value and type (which decide
what Triton specialises an int on: == 1, divisibility by 16, 32/64-bit range), and the key also
holds the current device and the knobs ``JITFunction.run`` adds to the options (debug,
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

_PLAIN = frozenset((int, float, bool, type(None)))
# Kept kernels per caller's dict before it is cleared (spec_key holds exact lengths and strides).
_MAX_KEPT = 256

# JITFunction.run's launch on a cache hit, whitespace removed: the call DirectLaunch repeats.
_LAUNCH_CALL = (
    "kernel.run(grid_0,grid_1,grid_2,stream,kernel.function,kernel.packed_metadata,launch_metadata,"
    "knobs.runtime.launch_enter_hook,knobs.runtime.launch_exit_hook,*bound_args.values())"
)
# The options JITFunction.run takes from Triton's knobs on every call (part of its cache key).
_KNOB_OPTIONS = {"debug", "instrumentation_mode", "fpsan_homomorphic_casts"}


def spec_key(args: tuple) -> tuple | None:
    """A key that is equal for two argument tuples only where Triton specialises them alike;
    None where the arguments are of kinds this does not know.

    Leading tensors give (dtype, data_ptr % 16 == 0) each, what Triton specialises a pointer on;
    the other arguments (ints, floats, bools, None) give their values and types as they are.
    That is finer than Triton's own key for ints (== 1, divisible by 16, 32/64-bit range: all
    follow from the value), and costs a few C-level tuple operations instead of a Python step
    per argument; a new length or stride only sends one more launch through JITFunction.run.
    """
    n = 0
    tensors = []
    for a in args:
        if not isinstance(a, torch.Tensor):
            break
        tensors.append(a.dtype)
        tensors.append(a.data_ptr() % 16 == 0)
        n += 1
    rest = args[n:]
    kinds = tuple(map(type, rest))
    if not _PLAIN.issuperset(kinds):
        return None
    return tuple(tensors), rest, kinds


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
        self._device: Callable[[], int] | None = None  # Triton's driver's; tests set stand-ins
        self._stream: Callable[[int], int] | None = None
        self._knobs = None  # (runtime knobs, compilation knobs, has fpsan casts), on first use

    def _state(self) -> tuple | None:
        """(device, knob options) for the key, or None where JITFunction.run must launch."""
        if self._knobs is None:
            from triton import knobs

            comp = knobs.compilation
            self._knobs = (knobs.runtime, comp, hasattr(comp, "fpsan_homomorphic_casts"))
        rt, comp, has_fpsan = self._knobs
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
        fpsan = comp.fpsan_homomorphic_casts if has_fpsan else None
        return (self._device(), rt.debug, comp.instrumentation_mode, fpsan)

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
                if len(kept) >= _MAX_KEPT:  # many shapes: start again rather than grow
                    kept.clear()
                kept[key] = kernel
            return
        self.direct += 1
        kernel.run(grid[0], grid[1], 1, self._stream(state[0]), kernel.function,
                   kernel.packed_metadata, None, None, None, *args, *tail)  # fmt: skip
