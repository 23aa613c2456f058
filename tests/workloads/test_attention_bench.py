"""`lmscope attention` workload on CPU: FLOPs, specs, presets, measured rows, unavailable impls."""

from __future__ import annotations

import random
import statistics
import warnings

import pytest
import torch

from lmscope.inputs.grid import expand_grid
from lmscope.running.runner import run_in_process
from lmscope.workloads import attention_impls
from lmscope.workloads.attention import (
    KEPT_TIMES,
    Spec,
    attention_flops,
    kept_times,
    reference_errors,
    run_point,
)
from lmscope.workloads.attention_grid import IMPL_NAMES, LEADERBOARD_PEERS, attention_grid
from lmscope.workloads.attention_impls import IMPLS, Unavailable

ALL_IMPLS = [
    "flash-triton", "flash-torch", "sdpa-flash", "sdpa-cudnn", "sdpa-efficient", "sdpa-math",
    "naive", "naive-compiled",
]


def _specs(preset, **overrides):
    return [Spec(**point) for point in expand_grid(*attention_grid(preset, overrides))]


# --- FLOPs -------------------------------------------------------------------------------------

def test_forward_flops_are_two_matmuls_halved_when_causal():
    assert attention_flops(2, 3, 5, 7, 16, causal=False) == 4 * 2 * 3 * 5 * 7 * 16
    assert attention_flops(2, 3, 5, 7, 16, causal=True) == 2 * 2 * 3 * 5 * 7 * 16
    # the reference workload: batch 1, 16 heads, 16384^2, d 64, causal
    assert attention_flops(1, 16, 16384, 16384, 64, causal=True) == 2 * 16 * 16384**2 * 64


def test_backward_is_two_and_a_half_forwards():
    fwd = attention_flops(1, 4, 100, 100, 32, causal=False)
    assert attention_flops(1, 4, 100, 100, 32, causal=False, which="bwd") == 2.5 * fwd
    assert attention_flops(1, 4, 100, 100, 32, causal=False, which="fwd_bwd") == 3.5 * fwd
    with pytest.raises(ValueError, match="unknown pass"):
        attention_flops(1, 1, 1, 1, 1, causal=False, which="step")


# --- specs -------------------------------------------------------------------------------------

def test_registry_holds_every_implementation_ours_first():
    assert list(IMPL_NAMES) == ALL_IMPLS and list(IMPLS) == ALL_IMPLS


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"impl": "flash3"}, "unknown attention impl"),
        ({"dtype": "fp64"}, "unknown dtype"),
        ({"seq_len": 0}, "seq_len must be a positive integer"),
        ({"head_dim": 1.5}, "head_dim must be a positive integer"),
        ({"passes": "fwd,step"}, "passes must be a comma list"),
        ({"passes": ""}, "passes must be a comma list"),
        ({"rep_ms": 0}, "rep_ms > 0"),
        ({"check_max_seq": -1}, "check_max_seq"),
        ({"causal": "yes"}, "causal must be"),
        ({"device": "tpu"}, "unknown device"),
    ],
)
def test_bad_spec_fields_say_what_is_wrong(fields, message):
    with pytest.raises(ValueError, match=message):
        Spec(**fields)


def test_passes_are_normalized_and_shape_has_no_head_dim_for_one_head():
    spec = Spec(passes="fwd_bwd, fwd", batch=3, heads=1, seq_len=11, head_dim=16)
    assert spec.passes == "fwd,fwd_bwd" and spec.pass_list == ["fwd", "fwd_bwd"]
    assert spec.shape() == (3, 11, 16)
    assert Spec(batch=3, heads=5, seq_len=11, head_dim=16).shape() == (3, 5, 11, 16)


# --- presets -----------------------------------------------------------------------------------

def test_leaderboard_is_exactly_the_reference_workload_with_its_peers():
    specs = _specs("leaderboard")
    assert [s.impl for s in specs] == LEADERBOARD_PEERS
    assert LEADERBOARD_PEERS == ["flash-triton", "sdpa-flash", "sdpa-cudnn", "sdpa-efficient", "naive"]
    for spec in specs:
        assert (spec.batch, spec.heads, spec.seq_len, spec.head_dim) == (1, 16, 16384, 64)
        assert (spec.dtype, spec.causal) == ("bf16", True)
        assert "fwd_bwd" in spec.pass_list
        assert spec.check_max_seq >= 16384  # the key point is checked against float64 too


def test_classic_preset_is_the_study_grid_with_all_implementations():
    specs = _specs("classic")
    assert len(specs) == 8 * 4 * 5 * 2
    assert {s.impl for s in specs} == set(ALL_IMPLS)
    assert {s.head_dim for s in specs} == {16, 32, 64, 128}
    assert {s.seq_len for s in specs} == {256, 1024, 4096, 8192, 16384}
    assert {s.dtype for s in specs} == {"fp32", "bf16"}
    assert {(s.batch, s.heads, s.causal) for s in specs} == {(8, 1, True)}
    # one shape runs all its implementations back to back, ours first
    assert [s.impl for s in specs[:8]] == ALL_IMPLS
    assert len({(s.dtype, s.head_dim, s.seq_len) for s in specs[:8]}) == 1


def test_tflops_preset_times_forward_and_backward_of_the_fast_kernels():
    specs = _specs("tflops")
    assert {s.impl for s in specs} == {"flash-triton", "sdpa-flash", "sdpa-cudnn"}
    assert {s.head_dim for s in specs} == {64, 128}
    assert sorted({s.seq_len for s in specs}) == [1024, 2048, 4096, 8192, 16384, 32768, 65536]
    fixed = {(s.batch, s.heads, s.dtype, s.causal, s.passes) for s in specs}
    assert fixed == {(1, 16, "bf16", True, "fwd,bwd")}
    assert len(specs) == 3 * 2 * 7


def test_flags_override_a_preset_and_all_expands():
    specs = _specs("classic", impl=["naive", "all"], seq_len=[256], dtype=["bf16"], rep_ms=20.0)
    assert [s.impl for s in specs[:8]] == ["naive"] + [n for n in ALL_IMPLS if n != "naive"]
    assert {s.seq_len for s in specs} == {256} and {s.dtype for s in specs} == {"bf16"}
    assert {s.rep_ms for s in specs} == {20.0} and len(specs) == 8 * 4
    default = _specs(None, batch=None)
    assert len(default) == 8 and {(s.batch, s.seq_len) for s in default} == {(8, 1024)}
    with pytest.raises(ValueError, match="unknown preset"):
        attention_grid("fastest", {})


# --- measured rows on CPU ----------------------------------------------------------------------

def _point(impl, **fields):
    point = dict(impl=impl, batch=random.randint(1, 2), heads=random.choice([1, 3]), head_dim=16,
                 seq_len=random.choice([17, 23, 31]), dtype="fp32", causal=True, cpu_steps=1,
                 seed=random.randint(0, 10_000), device="cpu")
    return {**point, **fields}


@pytest.mark.parametrize("impl", ["naive", "sdpa-math", "flash-torch", "sdpa-flash"])
@pytest.mark.parametrize("causal", [True, False])
def test_cpu_rows_match_float64_and_carry_timings(impl, causal):
    point = _point(impl, causal=causal)
    metrics = run_point(point)
    assert metrics["error_check"] == "float64 reference"
    assert metrics["max_error"] < 1e-5 and metrics["max_grad_error"] < 1e-4
    spec = Spec(**point)
    for which in ("fwd", "bwd", "fwd_bwd"):
        ms = metrics[f"{which}_ms"]
        assert 0 < metrics[f"{which}_p20_ms"] <= ms <= metrics[f"{which}_p80_ms"]
        times = metrics[f"{which}_times_ms"]
        assert len(times) == spec.cpu_steps  # kept to 5 decimals: the median within half a step
        assert ms == pytest.approx(statistics.median(times), abs=5e-6)
        flops = attention_flops(spec.batch, spec.heads, spec.seq_len, spec.seq_len, 16, causal, which)
        assert metrics[f"{which}_tflops"] == pytest.approx(flops / ms / 1e9)
    assert metrics["peak_mib"] is None  # no allocator statistics on CPU
    assert metrics["device_type"] == "cpu"


@pytest.mark.slow
def test_naive_compiled_row_times_backward_on_a_retained_graph():
    # AOTAutograd's donated buffers would refuse backward(retain_graph=True), the bwd-only timing
    metrics = run_point(_point("naive-compiled", heads=1))
    assert metrics["max_error"] < 1e-5 and metrics["max_grad_error"] < 1e-4
    assert metrics["bwd_ms"] > 0 and metrics["fwd_bwd_ms"] > 0


def test_bf16_row_has_bf16_sized_error_and_only_the_passes_asked_for():
    metrics = run_point(_point("naive", dtype="bf16", passes="fwd"))
    assert 1e-4 < metrics["max_error"] < 5e-2
    assert "fwd_ms" in metrics and "bwd_ms" not in metrics and "fwd_bwd_ms" not in metrics


def test_rows_name_the_autograd_node_the_timed_calls_made():
    assert run_point(_point("flash-torch"))["autograd_node"] == "FlashAttentionTorchBackward"
    assert "Backward" in run_point(_point("naive"))["autograd_node"]


def test_error_check_is_skipped_above_its_size_and_says_so():
    metrics = run_point(_point("naive", seq_len=40, check_max_seq=32, passes="fwd"))
    assert metrics["max_error"] is None and metrics["max_grad_error"] is None
    assert metrics["error_check"] == "skipped: seq > 32"


def test_reference_errors_catch_a_wrong_output_and_wrong_gradients():
    q, k, v, d_out = (torch.randn(3, 19, 16) for _ in range(4))
    good = [t.requires_grad_() for t in (q.clone(), k.clone(), v.clone())]
    with attention_impls.prepare("naive", torch.device("cpu"), torch.float32, 16, True) as attend:
        o = attend(*good)
    o.backward(d_out)
    grads = [t.grad for t in good]
    small = reference_errors(o, grads, q, k, v, d_out, causal=True)
    assert max(small) < 1e-5
    wrong = o.detach().clone()
    wrong[2, 7, 3] += 0.5
    assert reference_errors(wrong, grads, q, k, v, d_out, causal=True)[0] == pytest.approx(0.5, rel=1e-3)
    # gradients of the non-causal problem are wrong for the causal one
    assert reference_errors(o, grads, q, k, v, d_out, causal=False)[1] > 1e-2


# --- unavailable implementations ---------------------------------------------------------------

@pytest.mark.parametrize(("impl", "reason"), [("sdpa-cudnn", "sdpa-cudnn needs CUDA"),
                                              ("sdpa-efficient", "sdpa-efficient needs CUDA")])
def test_cuda_only_sdpa_backends_are_rows_that_say_so(impl, reason):
    record = run_in_process("attention", _point(impl))
    assert record["status"] == "error"
    assert record["error"] == f"Unavailable: {reason}"


def test_flash_triton_without_cuda_or_interpreter_is_unavailable(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(Unavailable, match="flash-triton runs Triton kernels, which need a CUDA GPU"):
        run_point(_point("flash-triton"))
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    with pytest.raises(Unavailable, match="head dims up to 128"):
        run_point(_point("flash-triton", head_dim=192))


def test_torch_refusing_a_backend_becomes_unavailable_with_its_reason():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warnings.warn("Flash attention kernel not used because:", UserWarning, stacklevel=1)
        warnings.warn("Expected query, key and value to all be of dtype: {Half, BFloat16}. "
                      "(Triggered internally at /pytorch/sdp_utils.cpp:123.)", UserWarning, stacklevel=1)
    text = attention_impls._why_not("sdpa-flash", caught)
    assert text == ("sdpa-flash: torch has no kernel for this point: "
                    "Expected query, key and value to all be of dtype: {Half, BFloat16}.")
    assert attention_impls._why_not("sdpa-flash", []) == "sdpa-flash: torch has no kernel for this point"


def test_unknown_impl_is_a_value_error():
    with pytest.raises(ValueError, match="unknown attention impl"):
        attention_impls.prepare("flash4", torch.device("cpu"), torch.float32, 16, True)


# --- GPU ---------------------------------------------------------------------------------------

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _gpu_point(impl, **fields):
    point = dict(impl=impl, batch=2, heads=8, head_dim=64, seq_len=1031, dtype="bf16", causal=True,
                 warmup_ms=2, rep_ms=10, device="cuda")
    return run_point({**point, **fields})


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
@pytest.mark.parametrize("impl", ["flash-triton", "sdpa-efficient", "sdpa-flash", "naive-compiled"])
def test_gpu_rows_at_real_sizes_are_as_accurate_as_naive(impl, dtype):
    if impl == "sdpa-flash" and dtype == "fp32":
        pytest.skip("sdpa-flash has no fp32 kernel")
    seed = random.randint(0, 10_000)
    naive = _gpu_point("naive", dtype=dtype, seed=seed)
    metrics = _gpu_point(impl, dtype=dtype, seed=seed)
    slack = {"bf16": 1e-3, "fp32": 1e-5}[dtype]
    assert metrics["max_error"] <= 2 * naive["max_error"] + slack
    assert metrics["max_grad_error"] <= 2 * naive["max_grad_error"] + slack
    assert 0 < metrics["fwd_p20_ms"] <= metrics["fwd_ms"] <= metrics["fwd_p80_ms"]
    assert 2 <= len(metrics["fwd_times_ms"]) <= KEPT_TIMES
    assert all(isinstance(t, float) and t > 0 for t in metrics["fwd_times_ms"])
    assert metrics["fwd_bwd_ms"] > metrics["fwd_ms"]
    assert metrics["peak_mib"] >= metrics["mem_before_backward_mib"] > 0


@pytest.mark.gpu
@gpu
def test_gpu_points_in_one_process_do_not_share_peaks():
    naive = _gpu_point("naive", batch=4, heads=1, seq_len=4096, passes="fwd")
    flash = _gpu_point("flash-triton", batch=4, heads=1, seq_len=4096, passes="fwd")
    assert naive["peak_mib"] > 256 and flash["peak_mib"] < 128
    assert naive["saved_bytes_per_seq2"] >= 4 * 2  # at least the bf16 probabilities of 4 sequences
    assert flash["saved_bytes_per_seq2"] < 0.5  # O and L only: O(seq), not O(seq^2)


@pytest.mark.gpu
@gpu
def test_gpu_flash_backends_refuse_fp32_with_a_reason():
    record = run_in_process("attention", dict(impl="sdpa-flash", batch=1, heads=2, head_dim=64,
                                              seq_len=256, dtype="fp32", device="cuda"))
    assert record["status"] == "error" and "fp16/bf16 only" in record["error"]


def test_kept_times_are_all_of_a_short_run_and_evenly_spread_over_a_long_one():
    assert kept_times([1.0, 2.0, 3.0], limit=4) == [1.0, 2.0, 3.0]
    long = [float(i) for i in range(1000)]
    kept = kept_times(long, limit=100)
    assert kept == [float(10 * i) for i in range(100)]
