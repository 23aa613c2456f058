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

import argparse
import json
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
MAX_DOUBLINGS = 4
"""A function still outlasting the sleep after this many doublings waits for the GPU itself."""


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
            if cycles > SLEEP_CYCLES * 2**MAX_DOUBLINGS:
                raise RuntimeError(f"{fn!r} outlasts every sleep: it synchronizes with the GPU, or "
                                   f"{calls} calls launch more kernels than CUDA's launch queue "
                                   "holds (pass fewer calls); its host time cannot be told from the GPU's")
        else:
            per_call.append(elapsed / calls * 1e6)
        torch.cuda.synchronize()
    return statistics.median(per_call)


def attention_inputs(shape: tuple[int, ...]) -> tuple[torch.Tensor, ...]:
    """q, k, v (requiring grad) and dO: random bf16 CUDA tensors of ``shape``, seed 0."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(4))
    for t in (q, k, v):
        t.requires_grad_(True)
    return q, k, v, do


def print_parts(shape: tuple[int, ...], measured: dict[str, float]) -> None:
    """The parts' host microseconds per call as a markdown table."""
    print(f"shape (B, H, S, d) = {shape}, bf16, causal; host us per call")
    print("| part | host us/call |\n|---|---|")
    for name, us in measured.items():
        print(f"| {name} | {us:.1f} |")


def append_parts(out: str, workload: str, shape: tuple[int, ...], measured: dict[str, float]) -> None:
    """One row per part (provenance, workload, shape, part, host_us) appended to `out`."""
    from lmscope.records.results import provenance

    stamp = provenance()
    with open(out, "a", encoding="utf-8") as handle:
        for name, us in measured.items():
            row = {**stamp, "workload": workload, "shape": list(shape), "part": name, "host_us": us}
            handle.write(json.dumps(row, default=str) + "\n")


def shape_and_out(description: str) -> tuple[tuple[int, ...], str | None]:
    """The scripts' command line: --shape B,H,S,D (xl's attention layer by default) and --out."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--shape", default="4,25,512,64", help="batch,heads,seq,head_dim")
    parser.add_argument("--out", default=None, help="append one row per part to this JSONL")
    args = parser.parse_args()
    return tuple(int(x) for x in args.shape.split(",")), args.out
