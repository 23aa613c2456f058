"""Host (CPU) cost per call of the attention implementations at a small shape, and where it goes.

At small shapes the GPU finishes an attention call in microseconds, so what a call costs is the
host's work to launch it. This script measures that work: the wall time of many calls issued
without synchronizing (the GPU keeps up, so the host is the bottleneck), per implementation, and
a cProfile of flash-triton's forward+backward to name the Python functions that spend it.

Usage (GPU machine, repo root): PYTHONPATH=src python3 benchmarks/attention/host_overhead.py
"""

from __future__ import annotations

import cProfile
import io
import pstats
import time

import torch
import torch.nn.functional as F

from lmscope.kernels.flash_attention import flash_attention

CALLS = 300


def _host_us(fn, calls: int = CALLS) -> float:
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    issued = time.perf_counter() - start
    torch.cuda.synchronize()
    return issued / calls * 1e6


def main() -> None:
    torch.manual_seed(0)
    shape = (8, 1, 256, 64)  # batch, heads, sequence, head dim: the classic grid's smallest point
    q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    d_out = torch.randn_like(q)
    impls = {
        "flash-triton": lambda: flash_attention(q, k, v, causal=True),
        "sdpa": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True),
    }
    print("| impl | fwd host us/call | fwd+bwd host us/call |")
    print("|---|---|---|")
    for name, fwd in impls.items():
        fwd_us = _host_us(lambda fwd=fwd: fwd().detach())
        both_us = _host_us(lambda fwd=fwd: fwd().backward(d_out))
        print(f"| {name} | {fwd_us:.1f} | {both_us:.1f} |")

    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(100):
        flash_attention(q, k, v, causal=True).backward(d_out)
    torch.cuda.synchronize()
    profiler.disable()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(30)
    print("\ncProfile of 100 flash-triton fwd+bwd calls, by own time:\n")
    print(text.getvalue())


if __name__ == "__main__":
    main()
