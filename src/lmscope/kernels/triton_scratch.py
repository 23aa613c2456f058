"""Triton's global scratch memory for kernels that build tensor descriptors on the device.

A kernel that calls ``tl.make_tensor_descriptor`` needs a small global buffer per launch, which
Triton's launcher asks of the allocator set by ``triton.set_allocator``. That allocator lives in
a ``ContextVar``: one set by the user (or by nobody) in the main thread is not the one the
autograd engine's device thread sees when it runs a backward. So lmscope does not set it for
the process; ``triton_scratch_allocator()`` sets a PyTorch-backed one around one launch, in
whatever thread launches, and restores the caller's afterwards.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar

import torch

__all__ = ["triton_scratch_allocator"]


def _torch_scratch(size: int, alignment: int, stream: int | None) -> torch.Tensor:
    """A buffer from PyTorch's caching allocator on the current device (blocks are 512-byte
    aligned, more than the alignment Triton asks for); freed when the launch returns, in stream
    order."""
    del alignment, stream
    return torch.empty(size, dtype=torch.int8, device="cuda")


def _allocator_var() -> ContextVar | None:
    try:
        from triton.runtime import _allocation
    except ImportError:  # a Triton without device-side descriptors
        return None
    var = getattr(_allocation, "_allocator", None)
    return var if isinstance(var, ContextVar) else None


@contextlib.contextmanager
def triton_scratch_allocator() -> Iterator[None]:
    """Within the block, Triton allocates kernels' global scratch from PyTorch."""
    var = _allocator_var()
    if var is None:
        raise RuntimeError("this Triton keeps its allocator outside a ContextVar; lmscope cannot scope it")
    token = var.set(_torch_scratch)
    try:
        yield
    finally:
        var.reset(token)
