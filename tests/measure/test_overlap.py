"""The step breakdown of a distributed rank's trace: compute, exposed communication, idle, hook host time."""

from __future__ import annotations

import random

import pytest

from lmscope.measure.kernels import STEP, Activity, Span, Trace
from lmscope.measure.overlap import range_name, step_breakdown

GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64"
GATHER = "ncclDevKernel_AllGather_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"
REDUCE = "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"


def _act(name: str, start: int, end: int, launch: int, lane: str = "stream 7") -> Activity:
    return Activity(name, start, end - start, launch, lane)


def _step(offset: int) -> tuple[list[Activity], list[Span]]:
    """One step of 100 ns at `offset`: forward [0, 40) and backward [40, 100) on the host.

    Compute runs [0, 25) and [70, 80); a gather launched in the forward runs [20, 35), a
    reduce-scatter launched in the backward [60, 90). Exposed: [25, 35) in the forward, [60, 70)
    and [80, 90) in the backward; idle: [35, 60) and [90, 100).
    """
    o = offset
    acts = [_act(GEMM, o, o + 25, o + 1), _act(GATHER, o + 20, o + 35, o + 5, "stream 20"),
            _act(REDUCE, o + 60, o + 90, o + 45, "stream 20"), _act(GEMM, o + 70, o + 80, o + 50)]
    spans = [Span(STEP, o, o + 100), Span("forward", o, o + 40), Span("backward", o + 40, o + 100),
             Span("fsdp/pre_forward", o + 1, o + 5), Span("fsdp/all_gather", o + 2, o + 4),
             Span("FSDP::pre_backward (layers.3)", o + 41, o + 44)]
    return acts, spans


def test_a_step_is_compute_plus_exposed_communication_plus_idle():
    offset = random.randrange(10**6, 10**9)
    acts, spans = _step(offset)
    noise = [_act(GEMM, offset - 50, offset - 10, offset - 60)]  # launched before the step: not its own
    late = _act(GEMM, offset + 95, offset + 130, offset + 90)  # runs past the step's end: clipped
    trace = Trace(acts + noise + [late], spans, on_gpu=True)
    result = step_breakdown(trace, trace.spans_named(STEP), ("forward", "backward"))
    ns = 1e-6  # ms per ns
    assert result.steps == 1 and result.wall_ms == pytest.approx(100 * ns)
    assert result.compute_ms == pytest.approx(40 * ns)  # 25 + 10 + 5 of the late one
    assert result.comm_ms == pytest.approx(45 * ns)
    assert result.exposed_comm_ms == pytest.approx(30 * ns)
    assert result.idle_ms == pytest.approx(30 * ns)  # [35, 60) and [90, 95)
    assert result.compute_ms + result.exposed_comm_ms + result.idle_ms == pytest.approx(result.wall_ms)
    assert result.exposed_comm_by_phase_ms == pytest.approx({"forward": 10 * ns, "backward": 20 * ns})
    assert result.host_ms == pytest.approx({"fsdp/pre_forward": 4 * ns, "fsdp/all_gather": 2 * ns,
                                            "FSDP::pre_backward": 3 * ns})
    assert result.wrapper_host_ms == pytest.approx(7 * ns) and result.wrapper_calls == 2
    row = result.as_record()
    assert row["profile_exposed_comm_backward_ms"] == pytest.approx(20 * ns)
    assert row["profile_host_fsdp_pre_backward_ms"] == pytest.approx(3 * ns)
    assert row["profile_host_fsdp_all_gather_ms"] == pytest.approx(2 * ns)


def test_several_steps_give_the_median_step_whose_parts_add_up():
    """Steps of compute, exposed communication and idle (8, 1, 1), (1, 8, 1), (1, 1, 8): the
    medians part by part (1, 1, 1) would not add up to the wall time."""
    acts, spans, shares = [], [], [(8, 1, 1), (1, 8, 1), (1, 1, 8)]
    for index, (compute, exposed, idle) in enumerate(shares):
        o, unit = random.randrange(10**6) + index * 10**7, 10
        acts += [_act(GEMM, o, o + compute * unit, o),
                 _act(GATHER, o + compute * unit, o + (compute + exposed) * unit, o + 1, "stream 20")]
        spans.append(Span(STEP, o, o + (compute + exposed + idle) * unit))
    trace = Trace(acts, spans, on_gpu=True)
    result = step_breakdown(trace, trace.spans_named(STEP), ("forward",))
    parts = (result.compute_ms, result.exposed_comm_ms, result.idle_ms)
    assert result.steps == 3 and result.wall_ms == pytest.approx(100e-6)
    assert sum(parts) == pytest.approx(result.wall_ms)
    assert tuple(round(ms / 10e-6) for ms in parts) in shares


def test_the_median_step_is_the_one_of_median_wall_time():
    first, second = random.randrange(10**6), random.randrange(10**7, 10**8)
    acts, spans = _step(first)  # 100 ns, exposed 30, two wrapper calls
    third = second + 1000  # a longer step without communication: exposed 0
    spans += [Span(STEP, second, second + 90), Span(STEP, third, third + 120)]
    quiet = [_act(GEMM, third, third + 50, third + 1)]
    trace = Trace(acts + quiet, spans, on_gpu=True)
    result = step_breakdown(trace, trace.spans_named(STEP), ("forward",))
    assert result.steps == 3 and result.wall_ms == pytest.approx(100e-6)
    assert result.exposed_comm_ms == pytest.approx(30e-6) and result.wrapper_calls == 2


def test_no_steps_is_an_error():
    with pytest.raises(ValueError, match="at least one step"):
        step_breakdown(Trace([], [], on_gpu=True), [], ("forward",))


def test_range_names_drop_the_module():
    assert range_name("FSDP::pre_forward (layers.0)") == "FSDP::pre_forward"
    assert range_name("FSDP::backward_prefetch for layers.1") == "FSDP::backward_prefetch"
    assert range_name("fsdp/post_backward") == "fsdp/post_backward"


def test_a_cpu_op_s_self_time_leaves_its_nested_collective_exposed():
    """On a CPU the op around a collective ran before and after it, not during: its self time
    comes in pieces (`Activity.segments`), and the collective between them is exposed."""
    o = random.randrange(10**6, 10**9)
    outer = Activity("aten::matmul", o, 40, o, "thread 1", segments=((o, o + 20), (o + 50, o + 70)))
    collective = _act("c10d::_reduce_scatter_base_", o + 20, o + 50, o + 20, "thread 1")
    trace = Trace([outer, collective], [Span(STEP, o, o + 100), Span("backward", o, o + 100)], on_gpu=False)
    result = step_breakdown(trace, trace.spans_named(STEP), ("backward",))
    ns = 1e-6
    assert result.compute_ms == pytest.approx(40 * ns)
    assert result.exposed_comm_ms == pytest.approx(30 * ns)
    assert result.exposed_comm_by_phase_ms == pytest.approx({"backward": 30 * ns})
    assert result.idle_ms == pytest.approx(30 * ns)
