"""The summary tables of `lmscope ddp`: each strategy against its baselines (with the overhead
model's line), the fully sharded points' memory and bytes beside the FSDP accounting, and the
profiled steps' breakdown. Rows are those of `report.rounds.pool_rounds`: a point run in several
rounds counts once, and its ratios resample the rounds.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from lmscope.accounting.comms import ddp_overhead_s, optimal_bucket_bytes, optimal_bucket_count
from lmscope.measure.host_bound import is_host_bound
from lmscope.records.results import Record
from lmscope.report.rounds import ratio_between
from lmscope.report.tables import Table, format_value

MODEL_POINT_KEYS = ("size", "vocab_size", "d_model", "d_ff", "num_layers", "num_heads",
                    "model_context_length", "context_length", "batch_size", "precision", "attention",
                    "device", "backend")
"""Fields that make a ddp point's model and per-rank batch: its single baseline shares them."""


def _model_key(record: Record) -> tuple[Any, ...]:
    return tuple(record.get(key) for key in MODEL_POINT_KEYS)


def ddp_summary(records: Sequence[Record]) -> Table:
    """Per ok point: step time, its overhead over the baselines, comm wait measured and predicted.

    Two baselines: the same ranks' unwrapped step timed just before (local, paired) and the
    `single` point of the sweep (one process, one GPU). The overheads are of mean step times;
    `step/local` and `step/single` are ratios of rank 0's median step times with their 95 %
    interval, resampling the rounds of pooled rows ('~' when it holds 1: no overhead can be told
    from these steps).
    """
    ok = [r for r in records if r.get("status") == "ok"]
    single = {_model_key(r): r for r in ok if r.get("strategy") == "single"}
    varying = _varying(ok)
    header = [*varying, "strategy", "shard_optimizer", "optimizer_state", "world_size", "step_ms",
              "local_step_ms", "overhead_vs_local_pct", "step/local", "single_step_ms",
              "overhead_vs_single_pct", "step/single", "comm_wait_ms", "predicted_comm_wait_ms", "buckets",
              "peak_after_optimizer_gib"]
    rows = []
    for record in ok:
        baseline = single.get(_model_key(record)) or {}
        base, local = baseline.get("step_ms"), record.get("local_step_ms")
        overhead = 100 * (record["step_ms"] - base) / base if base else None
        values = {**record, "single_step_ms": base, "overhead_vs_single_pct": overhead,
                  "overhead_vs_local_pct": 100 * (record["step_ms"] / local - 1) if local else None,
                  "step/local": _bounded(record, record, "local_times_ms"),
                  "step/single": _bounded(record, baseline)}
        rows.append([values.get(key) for key in header])
    return header, rows


def _bounded(record: Record, base: Record, base_key: str = "times_ms") -> str | None:
    """median step time of `record` over that of `base`'s `base_key` times, with its interval
    (round-level where the rows pool rounds: `report.rounds.ratio_between`); None without both."""
    bounded = ratio_between(record, base, other_key=base_key)
    return None if bounded is None else bounded.as_text(3)


def _varying(records: Sequence[Record]) -> list[str]:
    """The point fields that differ between these rows: the tables' leading columns."""
    return [k for k in ("size", "context_length", "batch_size", "precision")
            if len({str(r.get(k)) for r in records}) > 1]


FSDP_COLUMNS = (
    "strategy", "optimizer_state", "world_size", "step_ms", "local_step_ms", "exposed_comm_ms",
    "init_allocated_rank_max_gib", "init_allocated_rank0_gib", "predicted_fsdp_params_gib", "init_error_pct",
    "peak_after_optimizer_rank_max_gib", "peak_after_optimizer_rank0_gib", "predicted_fsdp_peak_gib",
    "peak_error_pct", "after_step_allocated_rank_max_gib", "after_step_allocated_rank0_gib",
    "predicted_fsdp_state_gib", "after_step_error_pct", "allgather_gib", "reduce_scatter_gib",
    "predicted_fsdp_comm_gib",
)


def fsdp_summary(records: Sequence[Record]) -> Table:
    """Per ok fsdp / torch-fsdp2 point: step, exposed communication, memory and bytes beside the model."""
    rows = [[r.get(key) for key in FSDP_COLUMNS] for r in records
            if r.get("status") == "ok" and r.get("predicted_fsdp_peak_gib") is not None]
    return list(FSDP_COLUMNS), rows


PROFILE_COLUMNS = (
    "step_ms", "profile_step_ms", "profile_compute_ms", "profile_comm_ms", "profile_exposed_comm_ms",
    "profile_exposed_comm_forward_ms", "profile_exposed_comm_backward_ms", "profile_idle_ms",
    "profile_compute_pct", "profile_gpu_busy_pct", "bound", "profile_wrapper_host_ms",
    "profile_wrapper_calls",
)


def profile_summary(records: Sequence[Record]) -> Table:
    """Per profiled ok point: the step's breakdown (`lmscope.workloads.ddp_profile`), and whether
    the GPU or the host bound the timed step (by the GPU's busy share of it)."""
    ok = [r for r in records if r.get("status") == "ok" and r.get("profile_wall_ms") is not None]
    varying = _varying(ok)
    header = [*varying, "strategy", "world_size", *PROFILE_COLUMNS]
    rows = []
    for record in ok:
        busy = record.get("profile_gpu_busy_pct")
        bound = None if busy is None else "host" if is_host_bound(busy / 100) else "GPU"
        rows.append([{**record, "bound": bound}.get(key) for key in header])
    return header, rows


def overhead_model_line(records: Sequence[Record]) -> str | None:
    """The model's optimal bucket from this run's all-reduce fit, and the best measured bucket."""
    fitted = [r for r in records if r.get("status") == "ok" and r.get("allreduce_algbw_gbps")]
    if not fitted:
        return None
    overhead_s = statistics.median(r["allreduce_overhead_us"] for r in fitted) / 1e6
    algbw = statistics.median(r["allreduce_algbw_gbps"] for r in fitted)
    model_bytes = fitted[0]["grad_mib"] * 2**20
    line = (f"overhead model (docs/distributed.md): S = {format_value(model_bytes / 2**20)} MiB of "
            f"gradients, all-reduce w = {format_value(algbw)} GB/s, o = {format_value(overhead_s * 1e6)} us")
    if overhead_s > 0:
        count = optimal_bucket_count(model_bytes, algbw, overhead_s)
        bucket_mib = optimal_bucket_bytes(model_bytes, algbw, overhead_s) / 2**20
        least_ms = 1e3 * ddp_overhead_s(model_bytes, algbw, overhead_s, count)
        line += (f" -> optimal bucket {format_value(bucket_mib)} MiB ({count:.0f} buckets), "
                 f"exposed {format_value(least_ms)} ms")
    bucketed = [r for r in fitted if str(r.get("strategy", "")).startswith(("bucketed:", "coalesced:"))]
    if bucketed:
        best = min(bucketed, key=lambda r: r["step_ms"])
        line += f"; best measured: {best['strategy']} ({best['step_ms']:.1f} ms/step)"
    return line
