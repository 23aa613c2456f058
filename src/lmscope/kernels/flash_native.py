"""The C++ host path of ``flash_attention`` (csrc/flash_native.cpp), built on first use.

Why: per eager forward+backward, a Python ``autograd.Function`` with three Triton launches costs
more host time than SDPA's whole C++ path (docs/kernels/flash_attention_host_notes.md). Once
Python has tuned and compiled the three kernels for an input signature, this module hands the
compiled kernels (their CUfunction, grid, threads, shared memory and parameter slots) to a small
C++ extension whose autograd Function allocates and launches exactly what the Python path would:
the same binaries, arguments and grids. Python stays in charge of everything else (checks,
tuning, compiling, fallbacks); ``apply`` returns None wherever no plan matches.

Built with ``torch.utils.cpp_extension.load`` (a C++ compiler and ninja; no CUDA headers: the
stream and device come through c10's device-generic interface), once per machine into torch's
extension cache. ``LMSCOPE_FLASH_NATIVE=0`` turns the path off; a failed build warns once and
leaves the Python path in charge.

A plan's parameter slots follow Triton's own launcher: the kernel's non-constexpr arguments in
order (pointers from the tensors, integers and floats as their bit patterns), then the global
and profile scratch pointers (null: refused where the kernel asks for scratch). Kernels with
cluster, cooperative or PDL launches, tensor descriptors or instrumentation are refused.
"""

from __future__ import annotations

import struct
import warnings
from pathlib import Path

import torch

from lmscope.envflags import env_flag

__all__ = ["ENABLED", "extension", "generation", "param_slots", "reset"]

ENABLED = env_flag("LMSCOPE_FLASH_NATIVE", default=True)
_SOURCE = Path(__file__).with_name("csrc") / "flash_native.cpp"
_INTS = frozenset(("i1", "i8", "i16", "i32", "i64", "u1", "u8", "u16", "u32", "u64"))
_FLOATS = {"fp32": "<f", "f32": "<f", "fp64": "<d"}
_MASK64 = (1 << 64) - 1
_state: dict = {"ext": None, "failed": False, "generation": 0}


def extension():
    """The built extension, or None (turned off, no CUDA, or the build failed: warned once)."""
    if _state["ext"] is not None or _state["failed"] or not ENABLED:
        return _state["ext"]
    if not torch.cuda.is_available():
        return None
    try:
        from torch.utils import cpp_extension

        _state["ext"] = cpp_extension.load(
            name="lmscope_flash_native",
            sources=[str(_SOURCE)],
            extra_cflags=["-O2"],
            verbose=False,
        )
    except Exception as exc:  # noqa: BLE001 - any build failure leaves the Python path in charge
        _state["failed"] = True
        warnings.warn(
            f"lmscope flash attention: the C++ host path did not build ({type(exc).__name__}: "
            f"{str(exc).splitlines()[0] if str(exc) else ''}); using the Python path "
            "(set LMSCOPE_FLASH_NATIVE=0 to skip the attempt)",
            stacklevel=2,
        )
    return _state["ext"]


def reset() -> None:
    """Forget every C++ plan (after re-tuning: the kept kernels may no longer be the choice) and
    start a new generation, so that plans are handed over again."""
    _state["generation"] += 1
    if _state["ext"] is not None:
        _state["ext"].clear()


def generation() -> int:
    """How many times ``reset`` has run: a plan handed over in an older generation is gone."""
    return _state["generation"]


def param_slots(compiled, tensor_slots: tuple[int, ...], rest: tuple) -> tuple[list[int], list[int]] | None:
    """The kernel parameters of one launch as (tensor slot or -1, constant bits) lists, the way
    Triton's launcher passes the arguments to ``compiled``: ``len(tensor_slots)`` tensors first
    (each slot a table index of csrc/flash_native.cpp), then ``rest`` (the fixed arguments and
    constexprs, in the kernel's parameter order). None where that launch is not one the C++
    path repeats exactly."""
    meta = compiled.metadata
    if (
        getattr(meta, "num_ctas", 1) != 1
        or getattr(meta, "launch_cooperative_grid", False)
        or getattr(meta, "launch_pdl", False)
        or getattr(meta, "global_scratch_size", 0)
        or getattr(meta, "profile_scratch_size", 0)
        or getattr(meta, "tensordesc_meta", None)
        or getattr(getattr(compiled, "_run", None), "gsan_enabled", False)
    ):
        return None
    kinds = list(compiled.src.signature.values())
    n_tensors = len(tensor_slots)
    if len(kinds) != n_tensors + len(rest):
        return None
    tensors, values = [], []
    for i, kind in enumerate(kinds):
        value = rest[i - n_tensors] if i >= n_tensors else None
        if kind == "constexpr":
            continue
        if not isinstance(kind, str):  # a tuple argument
            return None
        if i < n_tensors:
            if not kind.startswith("*"):
                return None
            tensors.append(tensor_slots[i])
            values.append(0)
        elif kind in _INTS and type(value) in (int, bool):
            tensors.append(-1)
            values.append(int(value) & _MASK64)
        elif kind in _FLOATS and type(value) in (int, float):
            tensors.append(-1)
            values.append(int.from_bytes(struct.pack(_FLOATS[kind], float(value)), "little"))
        else:
            return None
    tensors += [-1, -1]  # Triton's global and profile scratch pointers: null
    values += [0, 0]
    return tensors, values
