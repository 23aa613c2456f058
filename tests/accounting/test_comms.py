"""nccl-tests bandwidth formulas, the all-reduce fit, bucket planning and the DDP overhead model."""

from __future__ import annotations

import math
import random

import pytest

from lmscope.accounting.comms import (
    algbw_gbps,
    bus_factor,
    busbw_gbps,
    ddp_overhead_s,
    exposed_comm_s,
    fit_latency_bandwidth,
    optimal_bucket_bytes,
    optimal_bucket_count,
    plan_buckets,
)


@pytest.mark.parametrize("n", [1, 2, 3, 4, 8])
def test_bus_factors_are_those_of_nccl_tests(n):
    assert bus_factor("all-reduce", n) == pytest.approx(2 * (n - 1) / n)
    assert bus_factor("all-gather", n) == pytest.approx((n - 1) / n)
    assert bus_factor("reduce-scatter", n) == pytest.approx((n - 1) / n)
    assert bus_factor("broadcast", n) == 1.0


def test_bandwidths_in_decimal_gb_per_s():
    assert algbw_gbps(1e9, 0.5) == pytest.approx(2.0)
    # the study's 2-rank 1 GiB all-reduce: 6.745 ms
    assert busbw_gbps("all-reduce", 2, 2**30, 6.745e-3) == pytest.approx(159.19, rel=1e-3)
    assert busbw_gbps("all-reduce", 4, 2**30, 9.878e-3) == pytest.approx(2**30 / 9.878e-3 / 1e9 * 1.5)


def test_bad_inputs_raise():
    with pytest.raises(ValueError, match="unknown collective"):
        bus_factor("all-to-all", 2)
    with pytest.raises(ValueError, match="positive"):
        algbw_gbps(1.0, 0.0)
    with pytest.raises(ValueError, match="two or more"):
        fit_latency_bandwidth([1.0, 1.0], [1.0, 2.0])
    with pytest.raises(ValueError, match="positive"):
        plan_buckets([1, 2], 0)


def test_fit_recovers_latency_and_bandwidth():
    rng = random.Random()
    overhead, algbw = rng.uniform(5e-6, 80e-6), rng.uniform(20.0, 400.0)
    sizes = [rng.uniform(1e5, 1e9) for _ in range(5)]
    times = [overhead + s / (algbw * 1e9) for s in sizes]
    fitted_o, fitted_w = fit_latency_bandwidth(sizes, times)
    assert fitted_o == pytest.approx(overhead, rel=1e-6)
    assert fitted_w == pytest.approx(algbw, rel=1e-9)


def test_plan_buckets_caps_orders_and_splits_on_key_change():
    rng = random.Random()
    sizes = [rng.randint(1, 100) for _ in range(41)]
    cap = rng.randint(100, 300)
    buckets = plan_buckets(sizes, cap)
    assert [i for bucket in buckets for i in bucket] == list(range(len(sizes)))
    assert all(sum(sizes[i] for i in bucket) <= cap for bucket in buckets)
    for first, second in zip(buckets, buckets[1:], strict=False):  # greedy: the next one did not fit
        assert sum(sizes[i] for i in first) + sizes[second[0]] > cap
    assert plan_buckets([5, 500, 5], 100) == [[0], [1], [2]]  # too big: alone
    assert plan_buckets([1, 1, 1, 1], 100, keys=["a", "a", "b", "a"]) == [[0, 1], [2], [3]]


def test_overhead_model_and_its_optimum():
    rng = random.Random()
    model_bytes, algbw, overhead = rng.uniform(1e8, 1e10), rng.uniform(50, 400), rng.uniform(5e-6, 1e-4)
    best = optimal_bucket_count(model_bytes, algbw, overhead)
    assert best == pytest.approx(math.sqrt(model_bytes / (algbw * 1e9 * overhead)))
    assert optimal_bucket_bytes(model_bytes, algbw, overhead) == pytest.approx(
        math.sqrt(model_bytes * algbw * 1e9 * overhead))
    least = ddp_overhead_s(model_bytes, algbw, overhead, best)
    assert least == pytest.approx(2 * math.sqrt(model_bytes * overhead / (algbw * 1e9)))
    for other in (best * 0.5, best * 0.9, best * 1.1, best * 2):
        assert ddp_overhead_s(model_bytes, algbw, overhead, other) > least
    assert optimal_bucket_count(10.0, 100.0, 1.0) == 1.0  # never fewer than one bucket
    assert optimal_bucket_count(1e9, 100.0, 0.0) == math.inf


def test_exposed_comm_without_and_with_overlap():
    rng = random.Random()
    buckets = [rng.uniform(1e6, 1e8) for _ in range(7)]
    algbw, overhead = rng.uniform(50, 300), rng.uniform(1e-5, 5e-5)
    per_byte = 1 / (algbw * 1e9)
    serial = exposed_comm_s(buckets, algbw=algbw, overhead_s=overhead, overlap=False)
    assert serial == pytest.approx(7 * overhead + sum(buckets) * per_byte)
    hidden = exposed_comm_s(buckets, algbw=algbw, overhead_s=overhead)
    assert hidden == pytest.approx(7 * overhead + buckets[-1] * per_byte)
    # 1 s is far longer than all transfers (at most 0.014 s) and keeps float rounding small.
    long_backward = exposed_comm_s(buckets, algbw=algbw, overhead_s=overhead, backward_s=1.0)
    assert long_backward == pytest.approx(hidden)
    tiny = 1e-9
    short_backward = exposed_comm_s(buckets, algbw=algbw, overhead_s=overhead, backward_s=tiny)
    # Nothing left to hide behind: at most the tiny backward itself is hidden.
    assert serial - tiny <= short_backward <= serial * (1 + 1e-12)
    middle = exposed_comm_s(buckets, algbw=algbw, overhead_s=overhead, backward_s=sum(buckets) * per_byte / 2)
    # Equal to `hidden` (to rounding) when the earlier buckets all fit in the half backward.
    assert hidden * (1 - 1e-12) <= middle < serial
    assert exposed_comm_s([], algbw=algbw, overhead_s=overhead) == 0.0
