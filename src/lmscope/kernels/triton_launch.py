"""Launch an already compiled Triton kernel without ``JITFunction.run``'s per-call work.

``JITFunction.run`` spends most of a small kernel's host time before the launch itself: it binds
and specialises every argument (the binder), builds a cache key from the result, checks the
globals the kernel read, and builds launch metadata for the launch hooks. ``DirectLaunch`` keeps
the ``CompiledKernel`` that ``JITFunction.run`` returned for one set of launch options and calls
its launcher with the same arguments, the way ``JITFunction.run`` calls it on a cache hit:
``kernel.run(grid0, grid1, grid2, stream, kernel.function, kernel.packed_metadata,
launch_metadata, enter_hook, exit_hook, *all_args)``.

A kept kernel is reused only where Triton would pick the same binary. The key holds each
tensor's dtype and 16-byte alignment (``tensor_key``, computed per launch: what Triton specialises
a pointer on), the non-tensor arguments (a ``FixedArgs`` object, held by identity: it is built once
from values whose kinds it checks and never changes, and its values and their types decide
what Triton specialises them on: an int's == 1, divisibility by 16, 32/64-bit range), the
current device and the knobs ``JITFunction.run`` adds to the options (debug,
instrumentation mode, fpsan casts). Everything else (the constexprs, num_warps, ...) is fixed per
``DirectLaunch.launch`` caller's ``kept`` dict, which belongs to one set of launch options.
Callers keep their ``FixedArgs`` (e.g. per input shape), so that a launch only reads its
tensors; a new ``FixedArgs`` object, even with equal values, sends its first launch through
``JITFunction.run`` (which finds the binary in Triton's cache).

Every call goes through ``JITFunction.run`` instead where that is needed to stay exact or
observable: a Triton whose ``JITFunction.run`` does not launch as above (checked once, from its
source), a kernel that is not a ``JITFunction`` (e.g. the CPU interpreter's), launch hooks
installed (profilers such as proton read kernel names from them), pre-run hooks on the kernel,
a stages-inspection hook, or a non-tensor argument of a kind the key does not know.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

import torch

__all__ = ["DirectLaunch", "FixedArgs", "SUPPORTED", "tensor_key"]

_PLAIN = frozenset((int, float, bool, type(None)))
# Kept kernels per caller's dict before it is cleared (a key per FixedArgs object).
_MAX_KEPT = 256

# JITFunction.run's launch on a cache hit, whitespace removed: the call DirectLaunch repeats.
_LAUNCH_CALL = (
    "kernel.run(grid_0,grid_1,grid_2,stream,kernel.function,kernel.packed_metadata,launch_metadata,"
    "knobs.runtime.launch_enter_hook,knobs.runtime.launch_exit_hook,*bound_args.values())"
)
# The options JITFunction.run takes from Triton's knobs on every call (part of its cache key).
_KNOB_OPTIONS = {"debug", "instrumentation_mode", "fpsan_homomorphic_casts"}


def tensor_key(tensors: tuple[torch.Tensor, ...], *head: object) -> tuple:
    """``head``, then what Triton specialises the tensor arguments on: each one's dtype and
    whether its data is 16-byte aligned, as one flat tuple (one Python loop; no tuple per
    tensor)."""
    key = list(head)
    for t in tensors:
        key.append(t.dtype)
        key.append(t.data_ptr() % 16 == 0)
    return tuple(key)


class FixedArgs:
    """The non-tensor arguments of a launch (after its tensors, before its constexprs), checked
    once: ``plain`` says whether all are ints, floats, bools or None, the kinds whose value and
    type decide Triton's specialisation. ``DirectLaunch`` keys kept kernels on the object itself
    (identity): two objects with equal values are two keys, which costs one more launch through
    ``JITFunction.run``, never a wrong binary. ``args`` must not change (it is a tuple)."""

    __slots__ = ("args", "plain")

    def __init__(self, args: tuple) -> None:
        object.__setattr__(self, "args", tuple(args))
        object.__setattr__(self, "plain", _PLAIN.issuperset(map(type, self.args)))

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(
            "FixedArgs is immutable: kept kernels are keyed on the object, so its "
            "arguments must not change; make a new one"
        )

    def __repr__(self) -> str:
        return f"FixedArgs{self.args!r}"


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


class DirectLaunch:
    """Launches one JIT function, through its kept ``CompiledKernel`` where Triton would reuse it.

    ``launch(kept, grid, tensors, fixed, tail, kwargs)``: the positional arguments are
    ``tensors`` then ``fixed.args``; ``kwargs`` the constexprs and launch options (always the
    same ones for one ``kept`` dict), ``tail`` the constexpr values in the kernel's parameter
    order after the positional ones. ``direct`` counts the launches that bypassed
    ``JITFunction.run`` (for tests).
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
        enter, exit_ = rt.launch_enter_hook, rt.launch_exit_hook
        # Triton >= 3.4 holds an empty HookChain (which calls nothing) where no hook is installed.
        if (
            (enter is not None and getattr(enter, "calls", True))
            or (exit_ is not None and getattr(exit_, "calls", True))
            or getattr(rt, "add_stages_inspection_hook", None) is not None
            or getattr(self.jit, "pre_run_hooks", None)
        ):
            return None
        if self._device is None:
            from triton.runtime import driver

            self._device, self._stream = driver.active.get_current_device, driver.active.get_current_stream
        fpsan = comp.fpsan_homomorphic_casts if has_fpsan else None
        return (self._device(), rt.debug, comp.instrumentation_mode, fpsan)

    def unhooked(self) -> bool:
        """Whether a kept kernel launched outside Triton (lmscope's C++ host path) is what
        ``JITFunction.run`` would launch now: no hooks, debug and instrumentation knobs off."""
        state = self._state() if self.supported else None
        return state is not None and not any(state[1:])

    def kept_aligned(self, kept: dict, fixed: FixedArgs):
        """The CompiledKernel in ``kept`` that a launch with ``fixed`` and 16-byte aligned tensors
        would use now (this device and knobs), once one has run; None before, or where launches
        go through ``JITFunction.run``."""
        state = self._state() if self.supported else None
        if state is None:
            return None
        head = (fixed, *state)  # tensor_key's head; then each tensor's (dtype, aligned)
        for key, kernel in kept.items():
            if key[: len(head)] == head and all(key[len(head) + 1 :: 2]):
                return kernel
        return None

    def launch(
        self, kept: dict, grid: tuple[int, int], tensors: tuple, fixed: FixedArgs, tail: tuple, kwargs: dict
    ) -> None:
        """Launch over ``grid`` (two axes): the kept kernel for this key, else JITFunction.run."""
        state = self._state() if self.supported and fixed.plain else None
        if state is None:
            self.jit.run(*tensors, *fixed.args, grid=grid, warmup=False, **kwargs)
            return
        key = tensor_key(tensors, fixed, *state)
        kernel = kept.get(key)
        if kernel is None:  # first launch with this specialisation: Triton compiles or finds it
            kernel = self.jit.run(*tensors, *fixed.args, grid=grid, warmup=False, **kwargs)
            if all(hasattr(kernel, a) for a in ("run", "function", "packed_metadata")):
                if len(kept) >= _MAX_KEPT:  # many shapes: start again rather than grow
                    kept.clear()
                kept[key] = kernel
            return
        self.direct += 1
        kernel.run(grid[0], grid[1], 1, self._stream(state[0]), kernel.function,
                   kernel.packed_metadata, None, None, None, *tensors, *fixed.args, *tail)  # fmt: skip
