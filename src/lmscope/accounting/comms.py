"""Communication accounting: nccl-tests bandwidths and the overhead model of bucketed DDP.

Bandwidths follow nccl-tests (doc/PERFORMANCE.md): `algbw = S / t` in decimal GB/s, where S is
the per-rank buffer for all-reduce and broadcast and the total (gathered / scattered) buffer for
all-gather and reduce-scatter; `busbw = algbw * factor(op, n)` so that one number compares with
the link's peak whatever the number of ranks.

The DDP overhead model (derived in docs/distributed.md): gradients of S bytes in `n_b` buckets,
an all-reduce of b bytes takes `o + b / w` (o: fixed cost per call, w: algbw). Transfers overlap
with the backward pass except the last bucket's, which starts only when backward ends; the fixed
cost of every call is paid on the critical path. Exposed communication after backward:

    T(n_b) = n_b * o + S / (n_b * w)            minimized at  n_b* = sqrt(S / (w o)),
                                                bucket* = S / n_b* = sqrt(S w o),  T* = 2 sqrt(S o / w).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence

COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "broadcast")
"""Collective operations lmscope measures, named as in nccl-tests."""


def bus_factor(op: str, world_size: int) -> float:
    """nccl-tests' correction from algbw to busbw: 2(n-1)/n, (n-1)/n, (n-1)/n, 1."""
    if world_size < 1:
        raise ValueError(f"world size must be at least 1, got {world_size}")
    n = world_size
    factors = {
        "all-reduce": 2 * (n - 1) / n,
        "all-gather": (n - 1) / n,
        "reduce-scatter": (n - 1) / n,
        "broadcast": 1.0,
    }
    if op not in factors:
        raise ValueError(f"unknown collective {op!r}: choose one of {', '.join(COLLECTIVES)}")
    return factors[op]


def algbw_gbps(nbytes: float, seconds: float) -> float:
    """Algorithm bandwidth S / t in decimal GB/s."""
    if seconds <= 0:
        raise ValueError(f"time must be positive, got {seconds!r}")
    return nbytes / seconds / 1e9


def busbw_gbps(op: str, world_size: int, nbytes: float, seconds: float) -> float:
    """Bus bandwidth of nccl-tests in decimal GB/s."""
    return algbw_gbps(nbytes, seconds) * bus_factor(op, world_size)


def fit_latency_bandwidth(nbytes: Sequence[float], seconds: Sequence[float]) -> tuple[float, float]:
    """Least-squares fit of t = o + S / w to measured all-reduce times: (o in s, w in GB/s).

    The intercept is clamped at 0 (a negative fixed cost is noise of small sizes).
    """
    if len(nbytes) != len(seconds) or len(set(nbytes)) < 2:
        raise ValueError("need times at two or more different sizes to fit latency and bandwidth")
    mean_s = sum(nbytes) / len(nbytes)
    mean_t = sum(seconds) / len(seconds)
    cov = sum((s - mean_s) * (t - mean_t) for s, t in zip(nbytes, seconds, strict=True))
    var = sum((s - mean_s) ** 2 for s in nbytes)
    slope = cov / var
    if slope <= 0:
        raise ValueError("all-reduce times do not grow with size: cannot fit a bandwidth")
    return max(0.0, mean_t - slope * mean_s), 1.0 / slope / 1e9


def plan_buckets(
    nbytes: Sequence[int], cap_bytes: float, keys: Sequence[Hashable] | None = None
) -> list[list[int]]:
    """Group tensors, in the given order, into buckets of at most `cap_bytes` (indices per bucket).

    A tensor larger than the cap gets a bucket of its own; a change of key (dtype, device)
    closes the bucket, because one bucket is one flat buffer.
    """
    if cap_bytes <= 0:
        raise ValueError(f"bucket size must be positive, got {cap_bytes!r}")
    keys = list(keys) if keys is not None else [None] * len(nbytes)
    buckets: list[list[int]] = []
    filled = 0.0
    for index, (size, key) in enumerate(zip(nbytes, keys, strict=True)):
        fits = buckets and filled + size <= cap_bytes and keys[buckets[-1][0]] == key
        if fits:
            buckets[-1].append(index)
            filled += size
        else:
            buckets.append([index])
            filled = size
    return buckets


def ddp_overhead_s(model_bytes: float, algbw: float, overhead_s: float, buckets: float) -> float:
    """Exposed communication of bucketed DDP with `buckets` equal buckets: n_b o + S / (n_b w).

    `algbw` in GB/s (per-rank bytes / all-reduce time), `overhead_s` the fixed cost of one call.
    """
    if buckets < 1:
        raise ValueError(f"bucket count must be at least 1, got {buckets}")
    return buckets * overhead_s + model_bytes / (buckets * algbw * 1e9)


def optimal_bucket_count(model_bytes: float, algbw: float, overhead_s: float) -> float:
    """n_b* = sqrt(S / (w o)), at least 1 (unbounded without a per-call cost)."""
    if overhead_s <= 0:
        return math.inf
    return max(1.0, math.sqrt(model_bytes / (algbw * 1e9 * overhead_s)))


def optimal_bucket_bytes(model_bytes: float, algbw: float, overhead_s: float) -> float:
    """bucket* = S / n_b* = sqrt(S w o), at most the whole model."""
    return model_bytes / optimal_bucket_count(model_bytes, algbw, overhead_s)


def exposed_comm_s(
    bucket_bytes: Sequence[float],
    *,
    algbw: float,
    overhead_s: float,
    overlap: bool = True,
    backward_s: float | None = None,
) -> float:
    """Predicted time spent waiting on gradient all-reduces after backward, for real buckets.

    `bucket_bytes` in launch order (the last bucket is launched when backward ends). Without
    overlap (all-reduces issued after backward) everything is exposed: sum of o + b / w. With
    overlap: every call's o plus the transfers that backward did not hide. Buckets become ready
    in proportion to their bytes over `backward_s`; without `backward_s` backward is taken to be
    long enough to hide all but the last transfer (the model of the module docstring).
    """
    if not bucket_bytes:
        return 0.0
    per_byte = 1.0 / (algbw * 1e9)
    calls = len(bucket_bytes) * overhead_s
    if not overlap:
        return calls + sum(bucket_bytes) * per_byte
    if backward_s is None:
        return calls + bucket_bytes[-1] * per_byte
    total = float(sum(bucket_bytes))
    ready = finish = 0.0
    for size in bucket_bytes:
        ready += backward_s * size / total
        finish = max(finish, ready) + size * per_byte
    return calls + max(0.0, finish - backward_s)
