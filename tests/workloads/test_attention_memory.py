"""The attention point's memory is its own: what the process held before it does not count (no GPU)."""

from __future__ import annotations

from contextlib import contextmanager

import pytest
import torch
from fake_cuda_allocator import FakeAllocator

from lmscope.measure.memory import MemoryMeter
from lmscope.workloads import attention
from lmscope.workloads.attention import Spec

MIB = 2**20
INPUTS = 8 * MIB
KEPT = 3 * MIB
"""What the fake forward keeps for the backward."""
TEMP = 5 * MIB
"""What the fake backward allocates and frees."""


class _Out:
    """A forward's output whose backward allocates like an attention backward."""

    grad_fn = None

    def __init__(self, fake: FakeAllocator) -> None:
        self.fake = fake

    def backward(self, d_out) -> None:
        self.fake.alloc(TEMP)
        self.fake.free(TEMP + KEPT)


def _fake_point(monkeypatch, held: int) -> FakeAllocator:
    """Fake CUDA allocator holding `held` bytes; inputs and attention that allocate through it."""
    fake = FakeAllocator(held=held, cached=64 * MIB).install(monkeypatch)

    def inputs(spec, device):
        fake.alloc(INPUTS)
        return tuple(torch.zeros(1, 4, 2, requires_grad=i < 3) for i in range(4))

    def attend(q, k, v):
        fake.alloc(KEPT)
        return _Out(fake)

    @contextmanager
    def prepare(*args):
        yield attend

    monkeypatch.setattr(attention, "_inputs", inputs)
    monkeypatch.setattr(attention, "prepare", prepare)
    monkeypatch.setattr(attention, "_timings", lambda *args: {})
    return fake


@pytest.mark.parametrize("held", [0, 357 * MIB + 4096])
def test_peak_and_memory_before_backward_leave_out_what_the_process_held(monkeypatch, held):
    _fake_point(monkeypatch, held)
    spec = Spec(impl="naive", batch=1, seq_len=4, head_dim=2, check_max_seq=0, device="cpu")
    device = torch.device("cuda")
    metrics = attention._measure(spec, device, MemoryMeter(device).take_baseline())
    assert metrics["baseline_allocated_mib"] == held / MIB
    assert metrics["mem_before_backward_mib"] == (INPUTS + KEPT) / MIB  # inputs included
    assert metrics["peak_mib"] == (INPUTS + KEPT + TEMP) / MIB
    assert metrics["saved_bytes_per_seq2"] == KEPT / 4**2


def test_cpu_points_report_no_allocator_memory():
    record = attention.run_point({"impl": "naive", "batch": 1, "seq_len": 8, "head_dim": 4,
                                  "passes": "fwd", "cpu_steps": 1, "device": "cpu"})
    assert (record["baseline_allocated_mib"], record["peak_mib"], record["mem_before_backward_mib"]) == (
        None, None, None)
