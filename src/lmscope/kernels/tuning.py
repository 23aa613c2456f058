"""Shorter autotune benchmarking for lmscope's Triton kernels.

Triton's default (25 ms warm-up, 100 ms of repeats per config) makes a first call at a new shape
tune for tens of seconds over a config list; medians of about 20 launches separate these configs
well, so a first call tunes in seconds.
"""

from __future__ import annotations

import inspect

import triton

__all__ = ["short_bench_kwargs"]


def short_bench_kwargs() -> dict:
    """``triton.autotune`` keyword arguments for the short benchmark, where this Triton takes a
    ``do_bench`` (empty otherwise: Triton's own)."""
    if "do_bench" not in inspect.signature(triton.autotune).parameters:
        return {}

    def bench(fn, quantiles=None):
        return triton.testing.do_bench(fn, warmup=5, rep=25, quantiles=quantiles)

    return {"do_bench": bench}
