"""`phase(name)`: one named range seen by both Nsight Systems (NVTX) and torch.profiler.

The range costs next to nothing when no tool listens: the profiler's `record_function` is only
entered while a torch.profiler session is active, and NVTX push/pop are only issued on CUDA
machines, where they are a call into a stub unless Nsight Systems is attached.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache

import torch


@cache
def _nvtx_available() -> bool:
    return torch.cuda.is_available()


@contextmanager
def phase(name: str) -> Iterator[None]:
    """Mark the code inside as the named phase (e.g. 'forward', 'attention/softmax')."""
    use_nvtx = _nvtx_available()
    profiling = torch.autograd._profiler_enabled()
    if use_nvtx:
        torch.cuda.nvtx.range_push(name)
    try:
        if profiling:
            with torch.profiler.record_function(name):
                yield
        else:
            yield
    finally:
        if use_nvtx:
            torch.cuda.nvtx.range_pop()
