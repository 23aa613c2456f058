"""The probe's GPU memory fields with a stand-in allocator (no GPU): process totals, and the start."""

from __future__ import annotations

import timeit

import torch
from fake_cuda_allocator import FakeAllocator

from lmscope.probe import Probe

GIB = 2**30


class _Event:
    """A CUDA event stand-in timed by the host clock."""

    def __init__(self, enable_timing: bool = False) -> None:
        self.at = 0.0

    def record(self, stream=None) -> None:
        self.at = timeit.default_timer()

    def elapsed_time(self, end: _Event) -> float:
        return (end.at - self.at) * 1e3


def test_probe_peaks_are_the_process_totals_and_the_row_says_what_was_there_before(monkeypatch):
    monkeypatch.setattr(torch.cuda, "Event", _Event)
    fake = FakeAllocator(held=2 * GIB, cached=GIB).install(monkeypatch)
    with Probe(device="cuda", warmup=0) as probe:  # the user's model (2 GiB) was built before
        for _ in range(2):
            with probe.phase("forward"):
                fake.alloc(GIB)
                fake.free(GIB)
            probe.step()
    assert probe.record["allocated_at_start_gib"] == 2
    assert probe.record["peak_allocated_gib"] == probe.record["forward_peak_allocated_gib"] == 3
    assert fake.emptied == 0  # the probe leaves the user's allocator cache alone


def test_a_cpu_probe_has_no_allocator_fields():
    with Probe(warmup=0) as probe:
        probe.step()
    assert "allocated_at_start_gib" not in probe.record and "peak_allocated_gib" not in probe.record
