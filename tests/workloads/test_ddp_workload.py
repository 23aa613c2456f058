"""The ddp workload on CPU (2 gloo ranks and the single baseline), its grid, summary and checks."""

from __future__ import annotations

import random
from dataclasses import asdict
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from lmscope.accounting.flops import parameter_counts
from lmscope.cli import main
from lmscope.cli.distributed_sweeps import results_path
from lmscope.cli.sweep import exit_status
from lmscope.inputs.grid import ddp_points
from lmscope.measure.host_bound import HOST_BOUND_BELOW, busy_fields
from lmscope.parallel.launch import launch
from lmscope.records.stats import ratio_interval, ratio_interval_rounds
from lmscope.report.ddp_tables import ddp_summary, fsdp_summary, overhead_model_line, profile_summary
from lmscope.report.rounds import pool_rounds
from lmscope.report.tables import format_value
from lmscope.running.runner import spec_fields
from lmscope.workloads import ddp
from lmscope.workloads.ddp import Spec
from lmscope.workloads.ddp_profile import STEP_PHASES

TINY = dict(size="tiny", d_model=16, num_heads=2, d_ff=24, num_layers=2, vocab_size=37, context_length=8,
            batch_size=2, precision="fp32", device="cpu", warmup=1, steps=2)


@pytest.mark.parametrize(("changes", "message"), [
    ({"strategy": "bucketed:0"}, "positive bucket size"),
    ({"strategy": "ring"}, "unknown strategy"),
    ({"strategy": "single", "world_size": 2}, "--nproc 1"),
    ({"mode": "forward"}, "train steps"),
    ({"compile": True}, "torch.compile"),
    ({"fast": True, "attention": "flash"}, "sharded strategies"),
    ({"strategy": "fsdp", "precision": "fp16"}, "--precision bf16"),
    ({"strategy": "fsdp", "shard_optimizer": True}, "shard the optimizer state already"),
    ({"strategy": "torch-fsdp2", "optimizer_state": "host"}, "runs with lmscope's FSDP only"),
    ({"strategy": "fsdp", "optimizer_state": "cloud"}, "choose one of device, host"),
    ({"checkpoint": "every:0"}, "unknown checkpoint policy"),
    ({"device": "cuda:1"}, "ranks pick their own GPU"),
    ({"backend": "nccl"}, "not --device cpu"),
    ({"steps": 0}, "--steps"),
    ({"profile_steps": -1}, "--profile-steps"),
])
def test_spec_rejects_bad_points(changes, message):
    with pytest.raises(ValueError, match=message):
        Spec(**{**TINY, **changes})


def test_grid_adds_one_single_baseline_first():
    fixed = {"size": "tiny"}
    swept = {"strategy": ["naive", "bucketed:1", "single"], "shard_optimizer": [False, True],
             "world_size": [2]}
    points = ddp_points(fixed, swept)
    strategies = [(p["strategy"], p["shard_optimizer"], p["world_size"]) for p in points]
    assert strategies[0] == ("single", False, 1)
    assert strategies.count(("single", False, 1)) == 1
    assert sorted(strategies[1:]) == sorted([("naive", False, 2), ("naive", True, 2),
                                             ("bucketed:1", False, 2), ("bucketed:1", True, 2)])


def test_the_baseline_keeps_its_moments_on_the_device():
    swept = {"strategy": ["fsdp"], "optimizer_state": ["device", "host"], "world_size": [2]}
    points = ddp_points({"size": "tiny"}, swept)
    assert [(p["strategy"], p["optimizer_state"]) for p in points] == [
        ("single", "device"), ("fsdp", "device"), ("fsdp", "host")]
    Spec(**{**TINY, "strategy": "fsdp:separate-reduce", "optimizer_state": "host"})  # either variant


def test_summary_against_single_and_the_model_line():
    base = {"status": "ok", "size": "xl", "context_length": 512, "batch_size": 4, "precision": "bf16"}
    single_ms = random.uniform(100, 200)
    records = [
        {**base, "strategy": "single", "world_size": 1, "step_ms": single_ms},
        {**base, "strategy": "bucketed:100", "world_size": 2, "step_ms": single_ms * 1.1,
         "local_step_ms": single_ms * 1.05, "overhead_vs_local_pct": 100 * (1.1 / 1.05 - 1),
         "allreduce_overhead_us": 20.0, "allreduce_algbw_gbps": 200.0, "grad_mib": 7622.0},
        {**base, "strategy": "bucketed:10", "world_size": 2, "step_ms": single_ms * 1.2,
         "allreduce_overhead_us": 30.0, "allreduce_algbw_gbps": 100.0, "grad_mib": 7622.0},
        {**base, "strategy": "naive", "status": "error"},
    ]
    header, rows = ddp_summary(records)
    assert len(rows) == 3
    overhead = dict(zip([r[header.index("strategy")] for r in rows],
                        [r[header.index("overhead_vs_single_pct")] for r in rows], strict=True))
    assert overhead["single"] == 0 and overhead["bucketed:100"] == pytest.approx(10.0)
    paired = rows[[r[header.index("strategy")] for r in rows].index("bucketed:100")]
    assert paired[header.index("overhead_vs_local_pct")] == pytest.approx(100 * (1.1 / 1.05 - 1))
    line = overhead_model_line(records)
    # medians: o = 25 us, w = 150 GB/s; bucket* = sqrt(S w o)
    expected_mib = (7622 * 2**20 * 150e9 * 25e-6) ** 0.5 / 2**20
    assert f"optimal bucket {format_value(expected_mib)} MiB" in line
    assert "best measured: bucketed:100" in line
    assert exit_status(records) == 1 and exit_status(records[:3]) == 0


def test_torchrun_ranks_write_their_own_results(monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert results_path(Path("runs/x/results.jsonl")) == Path("runs/x/results.rank1.jsonl")
    monkeypatch.setenv("RANK", "0")
    assert results_path(Path("runs/x/results.jsonl")) == Path("runs/x/results.jsonl")


def _check_common(row: dict, world: int) -> None:
    assert row["backend_used"] == "gloo" and row["device_type"] == "cpu"
    assert row["parameters"] == parameter_counts(Spec(**TINY).model_config())["total"]
    assert row["tokens_per_s"] == pytest.approx(world * 2 * 8 / (row["step_ms"] / 1e3))
    phases = sum(row[k] or 0.0 for k in ("forward_ms", "backward_ms", "comm_wait_ms", "optimizer_ms"))
    assert 0 < phases <= row["step_ms"] * 1.05
    assert row["step_rank_min_ms"] <= row["step_ms"] <= row["step_rank_max_ms"]
    assert len(row["times_ms"]) == TINY["steps"] and all(t > 0 for t in row["times_ms"])
    if world > 1:  # the paired baseline: the same ranks' unwrapped step, timed first
        assert len(row["local_times_ms"]) == TINY["steps"]
        assert row["local_step_ms"] > 0 and row["local_step_rank_min_ms"] <= row["local_step_rank_max_ms"]
        paired = 100 * (row["step_ms"] / row["local_step_ms"] - 1)
        assert row["overhead_vs_local_pct"] == pytest.approx(paired)
        assert row["local_step_skipped"] is None  # no prediction on the CPU: it runs
    else:
        assert row["local_step_ms"] is None and "overhead_vs_local_pct" not in row


@pytest.mark.parametrize("strategy", ["bucketed:0.002", "coalesced:0.002"])
def test_bucketed_sharded_point_on_two_ranks(strategy):
    row = ddp.run_point({**TINY, "strategy": strategy, "shard_optimizer": True, "world_size": 2})
    _check_common(row, 2)
    assert row["comm_wait_ms"] >= 0 and row["comm_overhead_pct"] >= 0
    assert row["buckets"] > 3  # 2 KiB buckets of this model's gradients
    expected = f"average=divide, all-reduce sum, bucket_cap_mb=0.002, buckets={row['buckets']}"
    assert row["ddp_settings"] == expected  # gloo: no AVG
    assert row["predicted_comm_wait_ms"] > 0 and row["allreduce_algbw_gbps"] > 0
    assert row["grad_mib"] == pytest.approx(row["parameters"] * 4 / 2**20)


@pytest.mark.parametrize(("strategy", "caps"), [
    ("torch-ddp", "bucket_cap_mb=25, first_bucket_mb=1"),
    ("torch-ddp:0.002", "bucket_cap_mb=0.002, first_bucket_mb=0.002"),
])
def test_torch_ddp_point_on_two_ranks(strategy, caps):
    row = ddp.run_point({**TINY, "strategy": strategy, "world_size": 2})
    _check_common(row, 2)
    assert row["comm_wait_ms"] is None  # DDP waits inside backward
    assert row["predicted_comm_wait_ms"] > 0
    assert row["ddp_settings"].startswith(f"{caps}, gradient_as_bucket_view=True, ")
    # predicted buckets: this model's gradients fit PyTorch's default first bucket of 1 MiB
    assert row["buckets"] > 3 if strategy == "torch-ddp:0.002" else row["buckets"] == 1


@pytest.mark.parametrize("strategy", ["fsdp", "fsdp:separate-reduce", "torch-fsdp2"])
def test_sharded_point_on_two_ranks(strategy):
    """Both FSDPs run bf16 with checkpointed blocks; ours moves exactly the bytes predicted."""
    row = ddp.run_point({**TINY, "strategy": strategy, "world_size": 2, "precision": "bf16",
                        "checkpoint": "block"})
    _check_common(row, 2)
    assert row["comm_wait_ms"] is None and row["exposed_comm_ms"] is not None
    assert row["predicted_fsdp_state_gib"] == pytest.approx(
        row["predicted_fsdp_params_gib"] + row["predicted_fsdp_grads_gib"]
        + row["predicted_fsdp_optimizer_state_gib"])
    # 16 bytes per shard element; the model's 2 blocks, embedding, head, final norm over 2 ranks
    assert row["predicted_fsdp_state_gib"] * 2**30 == pytest.approx(16 * row["parameters"] / 2, abs=16 * 5)
    if strategy.startswith("fsdp"):
        assert "units=4, root=True, param_dtype=bfloat16, reduce_dtype=bfloat16" in row["ddp_settings"]
        group = "separate" if strategy == "fsdp:separate-reduce" else "shared"
        assert f"reduce_group={group}" in row["ddp_settings"]
        assert row["allgather_error_pct"] == 0 and row["reduce_scatter_error_pct"] == 0
    else:
        assert row["ddp_settings"].startswith("units=4, param_dtype=bfloat16, reduce_dtype=bfloat16")
        assert row["allgather_error_pct"] is None


def test_fsdp_summary_keeps_sharded_points_only():
    records = [{"status": "ok", "strategy": "fsdp", "world_size": 2, "step_ms": 5.0,
                "predicted_fsdp_peak_gib": 1.5, "peak_error_pct": 3.0},
               {"status": "ok", "strategy": "overlap", "world_size": 2, "step_ms": 4.0},
               {"status": "oom", "strategy": "torch-fsdp2", "predicted_fsdp_peak_gib": 1.5}]
    header, rows = fsdp_summary(records)
    assert len(rows) == 1
    row = dict(zip(header, rows[0], strict=True))
    assert row["strategy"] == "fsdp" and row["predicted_fsdp_peak_gib"] == 1.5
    assert row["peak_error_pct"] == 3.0


def _train_with_shrinking_calibration(ctx, point):
    """`ddp.train` in a rank where the larger calibration all-reduce timed faster (a busy host)."""
    fit = ddp.fit_latency_bandwidth
    ddp.fit_latency_bandwidth = lambda sizes, seconds: fit(sizes, sorted(seconds, reverse=True))
    return ddp.train(ctx, point)


def test_a_calibration_without_a_fit_keeps_the_measured_step():
    point = asdict(Spec(**TINY, strategy="bucketed:0.002", world_size=2))
    row = launch(_train_with_shrinking_calibration, point, nproc=2, backend="gloo", timeout_s=240)
    _check_common(row, 2)
    assert row["calibration_error"] == (
        "no overhead-model prediction: all-reduce times do not grow with size: cannot fit a bandwidth")
    assert "predicted_comm_wait_ms" not in row and row["comm_wait_ms"] >= 0
    assert row["buckets"] > 3 and row["grad_mib"] == pytest.approx(row["parameters"] * 4 / 2**20)


def test_single_baseline_runs_here():
    row = ddp.run_point({**TINY, "strategy": "single", "world_size": 1})
    _check_common(row, 1)
    assert row["comm_wait_ms"] is None and "predicted_comm_wait_ms" not in row
    assert row["ddp_settings"] is None
    assert row["local_times_ms"] is None


def test_ddp_command_rejects_bad_strategy(capsys):
    with pytest.raises(SystemExit) as done:
        main(["ddp", "--strategy", "bucketed:-1", "--device", "cpu"])
    assert done.value.code == 2
    assert "positive bucket size" in capsys.readouterr().err


def test_a_paired_baseline_that_runs_out_of_memory_is_none_not_a_failure():
    class OutOfMemoryStep:
        def step(self, clock):
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")

    ctx = SimpleNamespace(device=torch.device("cpu"))
    assert ddp._time_unwrapped(OutOfMemoryStep(), Spec(**TINY, strategy="naive"), ctx) is None


def test_summary_ratios_carry_intervals_from_rank_0s_times():
    base = {"status": "ok", "size": "tiny", "context_length": 16, "batch_size": 2, "precision": "fp32"}
    rng = random.Random()
    single_times = [rng.uniform(9.0, 11.0) for _ in range(12)]
    local_times = [8.0] * 12
    step_times = [10.0] * 12
    records = [
        {**base, "strategy": "single", "world_size": 1, "step_ms": 10.0, "times_ms": single_times},
        {**base, "strategy": "flat", "world_size": 2, "step_ms": 12.5, "times_ms": step_times,
         "local_times_ms": local_times},
        {**base, "strategy": "naive", "world_size": 2, "step_ms": 12.0},  # an older row: no times
    ]
    header, rows = ddp_summary(records)
    flat, naive = rows[1], rows[2]
    assert flat[header.index("step/local")] == "1.250x [1.250, 1.250]"
    assert flat[header.index("step/single")] == ratio_interval(step_times, single_times).as_text(3)
    assert naive[header.index("step/local")] is None and naive[header.index("step/single")] is None


def test_a_profiled_fsdp_point_breaks_each_rank_s_step_down(tmp_path):
    """On gloo the innermost aten ops stand in for kernels, c10d's collectives among them."""
    row = ddp.run_point({**TINY, "strategy": "fsdp", "world_size": 2, "profile_steps": 2,
                         "artifacts_dir": str(tmp_path)})
    _check_common(row, 2)
    parts = row["profile_compute_ms"] + row["profile_exposed_comm_ms"] + row["profile_idle_ms"]
    assert parts == pytest.approx(row["profile_wall_ms"])
    assert 0 < row["profile_exposed_comm_ms"] <= row["profile_comm_ms"]
    phases = sum(row[f"profile_exposed_comm_{p}_ms"] for p in STEP_PHASES)
    assert 0 < phases <= row["profile_exposed_comm_ms"] * (1 + 1e-9)
    assert row["profile_exposed_comm_forward_ms"] > 0 and row["profile_exposed_comm_backward_ms"] > 0
    for hook in ("pre_forward", "post_forward", "pre_backward", "post_backward", "all_gather", "finish"):
        assert row[f"profile_host_fsdp_{hook}_ms"] > 0, hook
    # per step: every unit's pre- and post-forward and pre- and post-backward, the start and the end
    units = 4
    assert row["profile_wrapper_calls"] >= 4 * units
    assert 0 < row["profile_wrapper_host_ms"] < row["profile_wall_ms"]
    assert row["profile_gpu_busy_pct"] is None  # no GPU: host or GPU bound does not apply
    assert Path(row["profile_trace_path"]).is_file()
    assert sorted(p.name for p in Path(row["profile_trace_path"]).parent.iterdir()) == [
        "rank0.trace.json", "rank1.trace.json"]
    ok = {**row, "status": "ok", "strategy": "fsdp", "world_size": 2}
    header, rows = profile_summary([ok, {**ok, "strategy": "overlap", "profile_wall_ms": None}])
    assert len(rows) == 1 and rows[0][header.index("bound")] is None


def test_profile_summary_says_what_bounds_the_step_by_bench_s_rule():
    edge = 100 * HOST_BOUND_BELOW  # a busy share just below it is host-bound, at it not, as in bench
    busy = edge - 1e-6, edge
    records = [{"status": "ok", "strategy": s, "world_size": 2, "batch_size": b, "profile_wall_ms": 9.0,
                "profile_gpu_busy_pct": pct} for s, b, pct in (("fsdp", 4, busy[0]), ("fsdp", 16, busy[1]))]
    header, rows = profile_summary(records)
    assert header[0] == "batch_size"
    assert [r[header.index("bound")] for r in rows] == ["host", "GPU"]
    assert [busy_fields(pct, 100.0)["host_bound"] for pct in busy] == [True, False]


@pytest.mark.parametrize("rounds", [2, 3])
def test_the_summaries_pool_a_point_s_rounds(rounds: int):
    """Each point's rounds: one row per point, step statistics over all of them, and ratios whose
    interval resamples the rounds (none below three rounds a side, as everywhere in lmscope)."""
    base = {"workload": "ddp", "status": "ok", "size": "tiny", "context_length": 16, "batch_size": 2,
            "precision": "fp32", "rounds": rounds}
    rng = random.Random()
    records, by_round = [], {"single": ([], []), "fsdp": ([], [])}
    for index in range(rounds):
        for strategy, world in (("single", 1), ("fsdp", 2)):
            times = [rng.uniform(5, 15) for _ in range(5)]
            local = [rng.uniform(5, 15) for _ in range(5)] if world > 1 else None
            by_round[strategy][0].append(times)
            by_round[strategy][1].append(local or [])
            records.append({**base, "round": index, "strategy": strategy, "world_size": world,
                            "step_ms": 99.0, "step_median_ms": 99.0, "local_step_ms": 99.0 if local else None,
                            "times_ms": times, "local_times_ms": local})
    pooled = pool_rounds(records, spec_fields("ddp"))
    assert len(pooled) == 2
    header, rows = ddp_summary(pooled)
    fsdp = dict(zip(header, rows[1], strict=True))
    fsdp_rounds, local_rounds = by_round["fsdp"]
    times, local = sum(fsdp_rounds, []), sum(local_rounds, [])
    assert fsdp["step_ms"] == pytest.approx(sum(times) / len(times))
    assert fsdp["local_step_ms"] == pytest.approx(sum(local) / len(local))
    assert fsdp["overhead_vs_local_pct"] == pytest.approx(100 * (sum(times) / sum(local) - 1))
    assert fsdp["step/single"] == ratio_interval_rounds(fsdp_rounds, by_round["single"][0]).as_text(3)
    assert fsdp["step/local"] == ratio_interval_rounds(fsdp_rounds, local_rounds).as_text(3)
    assert ("[" in fsdp["step/single"]) == (rounds >= 3)
