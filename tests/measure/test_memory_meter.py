"""MemoryMeter reports a point's own bytes, whatever the process allocated before it (no GPU needed)."""

from __future__ import annotations

import pytest
import torch
from fake_cuda_allocator import FakeAllocator

from lmscope.measure.memory import MemoryMeter, PhasePeaks

GIB = 2**30
MIB = 2**20
CUDA = torch.device("cuda")


def _point(fake: FakeAllocator, meter: MemoryMeter) -> dict[str, int | None]:
    """A point under the meter: a 1 GiB model, then a phase that peaks 512 MiB above it."""
    fake.alloc(GIB)
    after_init = meter.current()
    meter.reset_peak()
    fake.alloc(512 * MIB)
    fake.free(512 * MIB)
    return {"after_init": after_init, "current": meter.current(), "peak": meter.peak(),
            "reserved": meter.reserved(), "peak_reserved": meter.peak_reserved()}


@pytest.mark.parametrize("held", [0, 3 * GIB + 12345])
def test_a_cuda_point_reads_the_same_in_a_fresh_process_and_one_that_holds_memory(monkeypatch, held):
    fake = FakeAllocator(held=held, cached=700 * MIB).install(monkeypatch)
    with MemoryMeter(CUDA) as meter:
        assert (meter.baseline_allocated, meter.baseline_reserved) == (held, held)  # cache emptied
        readings = _point(fake, meter)
    assert fake.emptied == 1
    assert readings == {"after_init": GIB, "current": GIB, "peak": GIB + 512 * MIB,
                        "reserved": GIB + 512 * MIB, "peak_reserved": GIB + 512 * MIB}


def test_phase_peaks_start_from_the_points_own_bytes(monkeypatch):
    fake = FakeAllocator(held=5 * GIB).install(monkeypatch)
    with MemoryMeter(CUDA) as meter:
        fake.alloc(2 * GIB)
        clock = PhasePeaks(meter)
        clock.start()
        fake.alloc(GIB)
        fake.free(GIB)
        clock.mark("forward")
    assert clock.start_bytes == 2 * GIB
    assert clock.peaks["forward"] == (3 * GIB, 3 * GIB)


def test_phase_peaks_keep_the_steps_highest_requested_bytes(monkeypatch):
    """The requested-bytes peak (what a snapshot's trace counts) is the highest over all phases,
    not the last phase's, and process-wide; rounding makes the allocated peak higher."""
    fake = FakeAllocator(held=GIB).install(monkeypatch)
    with MemoryMeter(CUDA) as meter:
        clock = PhasePeaks(meter)
        clock.start()
        fake.alloc(3 * MIB, requested=2 * MIB + 1)
        clock.mark("forward")
        fake.free(3 * MIB, requested=2 * MIB + 1)
        fake.alloc(MIB, requested=MIB)
        clock.mark("backward")
    assert clock.requested_peak == GIB + 2 * MIB + 1
    assert clock.peaks["forward"][0] == 3 * MIB


def test_an_allocator_without_requested_bytes_gives_its_allocated_peak(monkeypatch):
    fake = FakeAllocator(held=GIB).install(monkeypatch)
    monkeypatch.setattr(torch.cuda, "memory_stats", lambda device=None: {})  # cudaMallocAsync
    fake.alloc(3 * MIB, requested=2 * MIB)
    assert MemoryMeter(CUDA).requested_peak() == GIB + 3 * MIB


def test_a_cuda_meter_never_entered_reads_the_process_totals(monkeypatch):
    FakeAllocator(held=GIB).install(monkeypatch)
    meter = MemoryMeter(CUDA)
    assert (meter.current(), meter.baseline_allocated) == (GIB, 0)


def test_a_cpu_meter_counts_no_tensor_made_before_it():
    before = torch.ones(1 << 20)  # 4 MiB held by the "process"
    with MemoryMeter(torch.device("cpu")) as meter:
        inside = torch.ones(1 << 18)  # 1 MiB: the point's own
        assert meter.current() == 1 * MIB
        del before  # freeing older memory inside the point does not go below zero
        assert meter.current() == 1 * MIB
        del inside
        assert (meter.current(), meter.peak()) == (0, 1 * MIB)
    assert meter.baseline_allocated == 0
