"""Kernel tables from Chrome traces: launch attribution, windows, gaps, statistics, invariants."""

from __future__ import annotations

import gzip
import json
import random
import statistics
from pathlib import Path

import numpy as np
import pytest

from lmscope.measure.kernels import (
    STEP,
    KernelRow,
    load_trace,
    parse_events,
    phase_stats,
    range_calls,
    step_spans,
    summarize_kernels,
)

MAIN, AUTOGRAD = 100, 200


def _range(name: str, ts: float, dur: float, tid: int = MAIN) -> dict:
    return {"ph": "X", "cat": "user_annotation", "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur}


def _launch(correlation: int, ts: float, tid: int = MAIN) -> dict:
    return {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": tid, "ts": ts,
            "dur": 3.0, "args": {"correlation": correlation, "External id": correlation + 1000}}


def _kernel(name: str, correlation: int | None, ts: float, dur: float, stream: int = 7,
            cat: str = "kernel") -> dict:
    args = {"device": 0, "stream": stream}
    if correlation is not None:
        args["correlation"] = correlation
    return {"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": stream, "ts": ts, "dur": dur, "args": args}


def gpu_events() -> list[dict]:
    """One 1000 μs step: forward launches two kernels (one inside attention/softmax that runs after
    the range has closed), backward launches one from the autograd thread, optimizer one."""
    return [
        {"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": "python"}},
        _range(STEP, 0.0, 1000.0),
        _range("forward", 10.0, 290.0),
        _range("attention/softmax", 50.0, 10.0),
        _range("backward", 300.0, 300.0),
        _range("optimizer", 600.0, 100.0),
        _launch(1, 20.0), _launch(2, 55.0), _launch(3, 310.0, tid=AUTOGRAD), _launch(4, 620.0),
        _kernel("ampere_sgemm_128x64_tn", 1, 25.0, 100.0),
        _kernel("cunn_SoftMaxForward", 2, 130.0, 50.0),
        _kernel("ampere_sgemm_32x128_tn", 3, 320.0, 200.0),
        _kernel("multi_tensor_apply_kernel<FusedAdamMathFunctor>", 4, 630.0, 30.0),
        {"ph": "s", "id": 1, "pid": 1, "tid": MAIN, "ts": 20.0, "cat": "ac2g", "name": "ac2g"},
    ]


def test_kernels_count_for_the_range_that_launched_them() -> None:
    trace = parse_events(gpu_events())
    steps = step_spans(trace)
    assert trace.on_gpu and len(steps) == 1
    forward = phase_stats(trace, "forward", steps)
    backward = phase_stats(trace, "backward", steps)
    optimizer = phase_stats(trace, "optimizer", steps)
    assert [k.name for k in forward.kernels] == ["ampere_sgemm_128x64_tn", "cunn_SoftMaxForward"]
    assert [k.name for k in backward.kernels] == ["ampere_sgemm_32x128_tn"]  # launched on another thread
    assert [k.category for k in optimizer.kernels] == ["optimizer"]
    calls = range_calls(trace, ["attention/softmax"], trace.spans_named("forward"))
    assert len(calls) == 1 and calls[0].gpu_ns == 50_000 and calls[0].cpu_ns == 10_000
    assert calls[0].launches == 1


def test_phase_windows_busy_time_and_gaps() -> None:
    trace = parse_events(gpu_events())
    steps = step_spans(trace)
    step = phase_stats(trace, STEP, steps)
    assert step.wall_ns == 1_000_000 and step.busy_ns == 380_000 and step.launches == 4
    assert [g.gap_ns for g in step.gaps] == [340_000, 140_000, 110_000, 25_000, 5_000]
    last = step.gaps[0]
    assert last.before == "multi_tensor_apply_kernel<FusedAdamMathFunctor>" and last.after is None
    assert step.gaps[1].offset_ns == 180_000 and step.gaps[1].after == "ampere_sgemm_32x128_tn"
    forward = phase_stats(trace, "forward", steps)
    assert forward.wall_ns == 290_000  # from its range start to its range end (kernels end earlier)
    backward = phase_stats(trace, "backward", steps)
    assert backward.wall_ns == 300_000 and backward.busy_ns == 200_000
    assert not step.violations and not forward.violations and not backward.violations


def test_phase_waits_for_earlier_work_on_the_device() -> None:
    """Backward's window starts when forward's kernels drain, not when backward's range starts."""
    events = [_range(STEP, 0.0, 1000.0), _range("forward", 0.0, 50.0), _range("backward", 50.0, 100.0),
              _launch(1, 10.0), _launch(2, 60.0),
              _kernel("ampere_sgemm_128x64_tn", 1, 15.0, 400.0),
              _kernel("ampere_sgemm_32x128_tn", 2, 415.0, 100.0)]
    trace = parse_events(events)
    backward = phase_stats(trace, "backward", step_spans(trace))
    assert backward.wall_ns == 100_000 and backward.busy_ns == 100_000 and not backward.gaps


def test_kernel_time_above_wall_time_is_flagged() -> None:
    events = [_range(STEP, 0.0, 100.0), _range("forward", 0.0, 100.0), _launch(1, 10.0), _launch(2, 11.0),
              _kernel("ampere_sgemm_128x64_tn", 1, 20.0, 300.0),
              _kernel("ampere_sgemm_128x64_tn", 2, 30.0, 300.0)]
    trace = parse_events(events)
    step = phase_stats(trace, STEP, step_spans(trace))
    assert any("exceeds wall time" in v for v in step.violations)
    assert any("sum to" in v for v in step.violations)
    assert any("outside the range" in v for v in step.violations)


def test_unlinked_kernel_is_placed_by_its_own_start() -> None:
    events = [_range(STEP, 0.0, 100.0), _kernel("Memset (Device)", None, 40.0, 5.0, cat="gpu_memset")]
    trace = parse_events(events)
    step = phase_stats(trace, STEP, step_spans(trace))
    assert step.launches == 1 and step.kernels[0].category == "memcpy"


def test_phase_missing_from_every_step_gives_none() -> None:
    trace = parse_events(gpu_events())
    assert phase_stats(trace, "no-such-phase", step_spans(trace)) is None


def _op(name: str, ts: float, dur: float, tid: int = MAIN) -> dict:
    return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur}


def test_cpu_ops_are_credited_with_their_self_time() -> None:
    """An op keeps its time less its nested ops'; view/allocation ops fold into the op around them."""
    events = [
        _range(STEP, 0.0, 200.0),
        _op("aten::linear", 0.0, 100.0), _op("aten::matmul", 1.0, 98.0), _op("aten::mm", 2.0, 96.0),
        _op("aten::resolve_conj", 3.0, 1.0), _op("aten::view", 100.0, 1.0), _op("aten::add", 110.0, 10.0),
        _op("aten::to", 130.0, 20.0), _op("aten::_to_copy", 131.0, 18.0),
        _op("aten::empty_strided", 132.0, 1.0),
        _op("aten::copy_", 134.0, 14.0), _op("aten::mul", 140.0, 5.0, tid=AUTOGRAD),
    ]
    trace = parse_events(events)
    assert not trace.on_gpu
    credited = {a.name: a.dur_ns for a in trace.activities}
    assert credited == {"aten::linear": 2_000, "aten::matmul": 2_000, "aten::mm": 96_000,
                        "aten::view": 1_000, "aten::add": 10_000, "aten::to": 2_000, "aten::_to_copy": 4_000,
                        "aten::copy_": 14_000, "aten::mul": 5_000}
    mm = next(a for a in trace.activities if a.name == "aten::mm")
    assert mm.launch_ns == mm.start_ns == 2_000 and mm.intervals() == ((2_000, 98_000),)
    linear = next(a for a in trace.activities if a.name == "aten::linear")
    assert linear.intervals() == ((0, 1_000), (99_000, 100_000)) and linear.end_ns == 100_000


def test_cpu_op_with_working_children_keeps_its_own_time() -> None:
    """aten::addmm calls expand and copy_ (the bias), aten::mkldnn_convolution allocates inside:
    both keep their compute, and the step's kernel time is its busy time, with no idle inside ops."""
    events = [
        _range(STEP, 0.0, 400.0), _range("forward", 0.0, 400.0),
        _op("aten::conv2d", 0.0, 150.0), _op("aten::mkldnn_convolution", 1.0, 148.0),
        _op("aten::empty", 2.0, 1.0), _op("aten::as_strided_", 4.0, 1.0), _op("aten::resize_", 6.0, 2.0),
        _op("aten::linear", 200.0, 120.0), _op("aten::t", 201.0, 2.0), _op("aten::transpose", 201.5, 1.0),
        _op("aten::addmm", 204.0, 115.0), _op("aten::expand", 205.0, 1.0),
        _op("aten::as_strided", 205.2, 0.5),
        _op("aten::copy_", 207.0, 10.0),
    ]
    trace = parse_events(events)
    step = phase_stats(trace, STEP, step_spans(trace))
    time = {row.name: row.total_ns for row in step.kernels}
    assert time["aten::mkldnn_convolution"] == 148_000  # its allocations folded in
    assert time["aten::addmm"] == 115_000 - 10_000  # expand folded in, copy_ its own
    assert time["aten::copy_"] == 10_000 and time["aten::conv2d"] == 2_000
    assert time["aten::linear"] == 2_000 + 3_000  # with its aten::t
    assert step.kernel_ns == step.busy_ns == 270_000 == sum(time.values())
    assert sum(row.time_pct for row in step.kernels) == pytest.approx(100.0)
    assert [g.gap_ns for g in step.gaps] == [80_000, 50_000] and not step.violations
    categories = phase_stats(trace, "forward", step_spans(trace)).as_dict()["categories"]
    assert categories["matmul"] == pytest.approx((2 + 148 + 5 + 105) / 270)  # convolutions count as matmul
    assert categories["elementwise"] == pytest.approx(10 / 270)


def test_gpu_kernel_launched_under_an_op_with_other_children_is_kept() -> None:
    """On a GPU the op tree plays no part: every kernel is tied to its launch by correlation, the
    bias copy inside addmm and the GEMM after it alike, and one without a launch record stays too."""
    events = [
        _range(STEP, 0.0, 500.0), _range("forward", 0.0, 500.0),
        _op("aten::linear", 10.0, 100.0), _op("aten::addmm", 12.0, 95.0), _op("aten::expand", 13.0, 1.0),
        _op("aten::copy_", 15.0, 20.0), _launch(1, 18.0), _launch(2, 60.0),
        _kernel("void at::native::elementwise_kernel<copy>", 1, 25.0, 10.0),
        _kernel("ampere_sgemm_128x64_tn", 2, 70.0, 200.0),
        _kernel("ampere_sgemm_32x128_tn", 99, 280.0, 50.0),
    ]
    trace = parse_events(events)
    forward = phase_stats(trace, "forward", step_spans(trace))
    assert trace.on_gpu and forward.launches == 3 and forward.kernel_ns == 260_000
    assert {row.name for row in forward.kernels} == {"void at::native::elementwise_kernel<copy>",
                                                    "ampere_sgemm_128x64_tn", "ampere_sgemm_32x128_tn"}


def test_summary_statistics_match_a_float64_reference() -> None:
    rng = random.Random(11)
    durations = {f"kernel_{i}": [rng.uniform(1e3, 1e6) for _ in range(rng.randint(1, 37))] for i in range(9)}
    rows = summarize_kernels(durations)
    assert [r.total_ns for r in rows] == sorted((r.total_ns for r in rows), reverse=True)
    assert sum(r.time_pct for r in rows) == pytest.approx(100.0)
    for row in rows:
        values = np.array(durations[row.name], dtype=np.float64)
        assert row.instances == len(values)
        assert row.total_ns == pytest.approx(values.sum(), rel=1e-12)
        assert row.avg_ns == pytest.approx(values.mean(), rel=1e-12)
        assert row.med_ns == pytest.approx(np.median(values), rel=1e-12)
        assert row.min_ns == values.min() and row.max_ns == values.max()
        expected_std = values.std(ddof=1) if len(values) > 1 else 0.0
        assert row.stddev_ns == pytest.approx(expected_std, rel=1e-9, abs=1e-9)


def test_instances_per_step_and_category_fractions() -> None:
    trace = parse_events(gpu_events())
    stats = phase_stats(trace, STEP, step_spans(trace)).as_dict()
    assert sum(stats["categories"].values()) == pytest.approx(1.0)
    assert stats["categories"]["matmul"] == pytest.approx(300 / 380)
    row = KernelRow(**stats["kernels"][0])
    assert row.per_step(3) == pytest.approx(row.instances / 3)
    assert stats["launches_per_step"] == 4 and stats["busy_frac"] == pytest.approx(0.38)


def test_load_trace_reads_plain_and_gzipped_json(tmp_path: Path) -> None:
    data = {"schemaVersion": 1, "traceEvents": gpu_events()}
    plain, packed = tmp_path / "t.json", tmp_path / "t.json.gz"
    plain.write_text(json.dumps(data))
    with gzip.open(packed, "wt") as handle:
        json.dump(data, handle)
    for path in (plain, packed):
        trace = load_trace(path)
        assert len(trace.activities) == 4 and statistics.fmean(a.dur_ns for a in trace.activities) == 95_000
