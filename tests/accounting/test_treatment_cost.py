"""The time block treatments add: hand-computed recompute, rebuild and exposed-offload times."""

from __future__ import annotations

import pytest

from lmscope.accounting.treatment_cost import (
    BlockBytes,
    Rates,
    block_forward_flops,
    step_time_s,
    treatment_time_s,
)
from lmscope.config import ModelConfig

RATES = Rates(device="test", flops=1e12, hbm=1e11, host=1e9)
BLOCK_FLOPS = 2e10  # 20 ms of forward per block at 1e12 FLOP/s
COSTS = BlockBytes(moved={"none": 30_000_000, "selective": 20_000_000, "full": 5_000_000},
                   rebuild_traffic=1_000_000_000)


def test_offloaded_copies_count_only_beyond_the_compute_they_overlap():
    times = treatment_time_s([("none", True), ("none", True), ("none", False)], block_flops=BLOCK_FLOPS,
                             costs=COSTS, rates=RATES)
    # each 30 ms copy: 10 ms beyond the next forward's 20 ms; block 0 comes back during block 1's
    # backward (prefetched, 40 ms: hidden), block 1 is waited for (30 ms)
    assert times["offload"] == pytest.approx(0.010 + 0.0 + 0.010 + 0.030)
    assert times["recompute"] == times["rebuild"] == 0
    assert times["extra"] == pytest.approx(0.050)


def test_recompute_and_rebuild_times():
    times = treatment_time_s([("full", True), ("selective", False), ("none", False)],
                             block_flops=BLOCK_FLOPS, costs=COSTS, rates=RATES)
    assert times["recompute"] == pytest.approx(0.020)  # one more forward
    assert times["rebuild"] == pytest.approx(0.010)  # 1 GB of traffic at 100 GB/s
    assert times["offload"] == pytest.approx(0.005)  # 5 ms copy hidden going, waited for coming back
    assert times["extra"] == pytest.approx(0.035)


def test_no_host_link_no_offload_price():
    with pytest.raises(ValueError, match="host-link bandwidth for test"):
        treatment_time_s([("none", True)], block_flops=BLOCK_FLOPS, costs=COSTS,
                         rates=Rates(device="test", flops=1e12, hbm=1e11, host=None))


def test_rates_come_from_the_catalog_or_a_measured_link():
    h200 = Rates.of("NVIDIA H200", "bf16")
    assert (h200.device, h200.flops, h200.hbm, h200.host) == ("H200", 989.4e12, 4800e9, 64e9)
    assert Rates.of("H200", "bf16", host_link_gbps=25.0).host == 25e9
    with pytest.raises(ValueError, match="no catalog entry"):
        Rates.of("RTX 9090", "bf16")
    with pytest.raises(ValueError, match="positive"):
        Rates.of("H200", "bf16", host_link_gbps=0)


def test_a_causal_kernel_does_the_causal_pairs_of_the_attention_square():
    """Causal: the T(T+1)/2 pairs a query attends (the one model-FLOPs convention), not T^2/4."""
    config = ModelConfig(d_model=64, d_ff=176, num_layers=2, num_heads=4, vocab_size=50, context_length=128)
    dense = 2 * 128 * (4 * 64 * 64 + 3 * 64 * 176)
    causal = 4 * (128 * 129 // 2) * 64  # Q K^T and P V over the pairs a causal query attends
    assert block_forward_flops(config, 1, 128, causal=True) == dense + causal
    assert block_forward_flops(config, 1, 128, causal=False) == dense + 4 * 128 * 128 * 64
    head = 2 * 128 * 64 * 50
    assert step_time_s(config, 1, 128, True, RATES) == pytest.approx(3 * (2 * (dense + causal) + head) / 1e12)
