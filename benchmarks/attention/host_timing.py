"""Host time per call of a function issued many times without synchronizing, for the attention
host-cost scripts (host_overhead.py, host_breakdown.py, engine_thread.py import it from beside
them).

The wall time of many unsynchronized calls over their number is what one call costs the host
only while the GPU never makes the host wait. At the models' shapes a call's GPU work can take
as long as its host work, so the GPU is held busy by a sleep kernel while the calls are issued:
their launches queue behind it (few enough calls per round that the queue stays short of its
limit), and the loop times the host alone. A round in which the sleep ended before the last
call was issued is repeated with a longer sleep.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

CALLS = 64
"""Calls per round: a forward+backward queues up to about ten kernels, and CUDA's queue of pending
launches holds about a thousand before a launch blocks."""
ROUNDS = 5  # single rounds moved by up to 1.6x between runs on the H100 machine
SLEEP_CYCLES = 200_000_000
"""GPU clock cycles of the first round's sleep kernel (doubled while too short)."""


def host_us(fn: Callable[[], Any], calls: int = CALLS, rounds: int = ROUNDS) -> float:
    """Median over `rounds` of the host microseconds per call of `calls` unsynchronized calls,
    issued while a sleep kernel keeps the GPU from holding the host back."""
    for _ in range(10):
        fn()
    per_call, cycles = [], SLEEP_CYCLES
    while len(per_call) < rounds:
        torch.cuda.synchronize()
        torch.cuda._sleep(cycles)
        slept = torch.cuda.Event()
        slept.record()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        elapsed = time.perf_counter() - start
        if slept.query():  # the GPU was free before the last call: it may have held the host back
            cycles *= 2
        else:
            per_call.append(elapsed / calls * 1e6)
        torch.cuda.synchronize()
    return statistics.median(per_call)
