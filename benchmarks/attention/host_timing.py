"""Host time per call of a function issued many times without synchronizing, for the attention
host-cost scripts (host_overhead.py, host_breakdown.py import it from beside them).

At small shapes the GPU keeps up with the host, so the wall time of many unsynchronized calls
over their number is what one call costs the host.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

CALLS = 300
ROUNDS = 5  # single rounds of 300 calls moved by up to 1.6x between runs on the H100 machine


def host_us(fn: Callable[[], Any], calls: int = CALLS, rounds: int = ROUNDS) -> float:
    """Median over `rounds` of the host microseconds per call of `calls` unsynchronized calls."""
    for _ in range(10):
        fn()
    per_call = []
    for _ in range(rounds):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        per_call.append((time.perf_counter() - start) / calls * 1e6)
        torch.cuda.synchronize()
    return statistics.median(per_call)
