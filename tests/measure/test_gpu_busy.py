"""GPU busy time from profiler events: union of the steps' kernels, share of the step, host-bound flag."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch

from lmscope.measure import gpu_busy
from lmscope.measure.gpu_busy import busy_ms, measure_gpu_busy
from lmscope.measure.host_bound import HOST_BOUND_BELOW, busy_fields
from lmscope.measure.kernels import parse_events


def _runtime(correlation: int, ts: float) -> dict:
    return {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": ts,
            "dur": 2.0, "args": {"correlation": correlation}}


def _kernel(correlation: int | None, ts: float, dur: float, stream: int, cat: str = "kernel") -> dict:
    args = {"device": 0, "stream": stream}
    if correlation is not None:
        args["correlation"] = correlation
    return {"ph": "X", "cat": cat, "name": f"k{correlation}", "pid": 0, "tid": stream, "ts": ts,
            "dur": dur, "args": args}


def two_steps() -> list[dict]:
    """A CUDA-activity trace of two steps (μs). Step 1: on stream 7 kernels at 100-300 and 250-400
    (overlapping), a gap, 600-650; on stream 9 one at 350-500 (overlapping the second) and a memset
    at 900-920: busy 100-500, 600-650, 900-920 = 470. Step 2: a kernel at 2100-2300 without its
    launch (a graph replay's kernel) and a copy at 2400-2410: 210. Runtime calls take no device time."""
    return [
        _runtime(1, 10.0), _runtime(2, 20.0), _runtime(3, 30.0), _runtime(4, 40.0), _runtime(5, 50.0),
        _runtime(7, 2010.0),
        _kernel(1, 100.0, 200.0, 7), _kernel(2, 250.0, 150.0, 7), _kernel(3, 600.0, 50.0, 7),
        _kernel(4, 350.0, 150.0, 9), _kernel(5, 900.0, 20.0, 9, cat="gpu_memset"),
        _kernel(None, 2100.0, 200.0, 7), _kernel(7, 2400.0, 10.0, 9, cat="gpu_memcpy"),
    ]


def test_busy_is_the_union_of_the_kernels_across_streams_per_step() -> None:
    events = two_steps()
    random.Random(0).shuffle(events)  # the order of the trace's events does not matter
    assert busy_ms(parse_events(events), steps=2) == pytest.approx((0.470 + 0.210) / 2)


def test_a_trace_without_device_work_is_idle() -> None:
    cpu_only = [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 10.0, "dur": 50.0}]
    assert busy_ms(parse_events(cpu_only), steps=1) == 0


def test_share_and_flag_against_the_timed_step() -> None:
    fields = busy_fields(4.0, step_ms=5.0)
    assert fields["gpu_busy_ms"] == 4.0 and fields["gpu_busy_share"] == pytest.approx(0.8)
    assert fields["host_bound"] is False  # exactly at the threshold: not host-bound
    low = busy_fields(3.9, step_ms=5.0)
    assert low["gpu_busy_share"] < HOST_BOUND_BELOW and low["host_bound"] is True
    assert low["gpu_busy_reason"] is None


def test_on_a_cpu_no_fields_and_no_profiling(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gpu_busy, "record_kernels", lambda *a, **k: pytest.fail("profiled on a CPU"))
    assert measure_gpu_busy(lambda: None, device=torch.device("cpu"), step_ms=1.0) == {}


def _fake_profiler(events: list[dict]):
    def record(step, *, steps: int, device: torch.device, path: Path) -> None:
        for _ in range(steps):
            step()
        path.write_text(json.dumps({"traceEvents": events}))

    return record


def test_measure_reads_the_profiled_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    monkeypatch.setattr(gpu_busy, "record_kernels", _fake_profiler(two_steps()))
    fields = measure_gpu_busy(lambda: calls.append(1), device=torch.device("cuda"), step_ms=0.5, steps=2)
    assert len(calls) == 2  # its own steps, after the timed ones
    assert fields["gpu_busy_ms"] == pytest.approx(0.340)
    assert fields["gpu_busy_share"] == pytest.approx(0.68) and fields["host_bound"] is True


def test_a_trace_without_kernels_leaves_the_fields_empty_with_why(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gpu_busy, "record_kernels", _fake_profiler([_runtime(1, 10.0)]))
    fields = measure_gpu_busy(lambda: None, device=torch.device("cuda"), step_ms=1.0)
    assert fields["gpu_busy_ms"] is None and fields["host_bound"] is None
    assert "no GPU kernels" in fields["gpu_busy_reason"]


def test_a_cpu_bench_row_has_no_busy_fields_and_no_flag() -> None:
    from lmscope.workloads.step import run_point

    row = run_point({"size": "tiny", "device": "cpu", "warmup": 0, "steps": 1, "context_length": 16,
                     "target_ci": 0.0})
    assert row["median_ms"] > 0
    assert not {"gpu_busy_ms", "gpu_busy_share", "host_bound"} & set(row)
