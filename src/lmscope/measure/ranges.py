"""`phase(name)`: one named range seen by both Nsight Systems (NVTX) and torch.profiler;
`traced(name)`: a decorator that makes each call of a function a torch.profiler range.

The range costs next to nothing when no tool listens: the profiler's `record_function` is only
entered while a torch.profiler session is active, and NVTX push/pop are only issued on CUDA
machines, where they are a call into a stub unless Nsight Systems is attached. `traced` is for
code called many times per step (hooks): it skips NVTX and, without a profiler, costs one flag
check per call.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import torch

Function = TypeVar("Function", bound=Callable[..., Any])


@functools.cache
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


def traced(name: str) -> Callable[[Function], Function]:
    """Decorate a function so that each call is a torch.profiler range called `name` while a
    profiler records (so a trace shows the host time spent in it), and a plain call otherwise."""
    def decorate(function: Function) -> Function:
        @functools.wraps(function)
        def call(*args: Any, **kwargs: Any) -> Any:
            if not torch.autograd._profiler_enabled():
                return function(*args, **kwargs)
            with torch.profiler.record_function(name):
                return function(*args, **kwargs)

        return call  # type: ignore[return-value]

    return decorate
