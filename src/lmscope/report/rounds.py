"""Pooling the rounds of a point (`lmscope bench --rounds R`, `lmscope ddp --rounds R`) into one row
for reports, and the interval of a ratio between two such rows.

A point run in R interleaved rounds has R rows (`round` 0..R-1, `rounds` R). A report shows it
as one row: the last row of each round, with every per-step times list (`times_ms`,
`fwd_times_ms`, ...) joined over the rounds that finished `ok`, the timing statistics taken again
from the joined times, throughput scaled to the pooled median, and `rounds` the number of rounds
pooled. Other metrics are the last round's, except `compile_s`: the longest round's (the cold
compile). A ddp row's `times_ms` are rank 0's steps, so its
pooled `step_ms` (the mean) and `step_median_ms` are rank 0's. Each list also stays apart per round
(`times_ms_by_round`, ...), so that a ratio's interval resamples the rounds, the unit that varies
independently (`ratio_between`), and `median_ci_rel` is the round-level precision of the pooled
median.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

import numpy as np

from lmscope.records.provenance import code_identity
from lmscope.records.results import Record, point_key
from lmscope.records.stats import RatioInterval, median_interval_rounds, ratio_interval, ratio_interval_rounds

THROUGHPUT_KEYS = ("tokens_per_s", "tflops", "mfu")
"""Metrics of a step that are proportional to 1 / median step time."""
BY_ROUND = "_by_round"
"""Suffix of a pooled row's per-round lists: `times_ms_by_round` holds each round's `times_ms`."""


def ratio_between(base: Record, other: Record, times_key: str = "times_ms",
                  confidence: float = 0.95, *, other_key: str | None = None) -> RatioInterval | None:
    """base / other of the medians of `times_key` (`other_key` on the other side, if given: a
    row's step against its own paired baseline, say) with its interval; None when either has no
    times.

    Pooled rows (either side) give the round-level interval (`ratio_interval_rounds`, a row
    without rounds counting as one round); plain rows the step-level one (`ratio_interval`).
    """
    other_key = other_key or times_key
    if not base.get(times_key) or not other.get(other_key):
        return None
    if base.get(times_key + BY_ROUND) or other.get(other_key + BY_ROUND):
        return ratio_interval_rounds(rounds_of(base, times_key), rounds_of(other, other_key), confidence)
    return ratio_interval(base[times_key], other[other_key], confidence)


def rounds_of(record: Record, times_key: str = "times_ms") -> list[list[float]]:
    """The record's `times_key` per round (one round for a row that was not pooled)."""
    return record.get(times_key + BY_ROUND) or [record[times_key]]


def pool_rounds(records: Sequence[Record], spec_keys: Sequence[str]) -> list[Record]:
    """One record per point, the rounds of the point's last run pooled, in first-seen order.

    A later row of a round replaces the earlier one; rows written by other code than the point's
    latest row are left out (a rerun after a change starts the point's rounds afresh, while a run
    resumed or extended by the same code, `--first-round`, adds to them)."""
    by_point: dict[str, dict[int, Record]] = {}
    for record in records:
        key = point_key(record.get("workload", ""), {k: record.get(k) for k in spec_keys})
        rounds = by_point.pop(key, {})
        if rounds and code_identity(next(iter(rounds.values()))) != code_identity(record):
            rounds = {}
        rounds.pop(record.get("round") or 0, None)
        rounds[record.get("round") or 0] = record
        by_point[key] = rounds
    return [_pooled(rounds) for rounds in by_point.values()]


def _pooled(rounds: dict[int, Record]) -> Record:
    last = list(rounds.values())[-1]
    count = last.get("rounds") or 1
    ok = [rounds[r] for r in sorted(rounds) if r < count and rounds[r].get("status") == "ok"]
    if count == 1 or not ok:
        return last
    base = dict(ok[-1])
    pooled: Record = {"rounds": len(ok)}
    for key, value in base.items():
        if key.endswith("times_ms") and isinstance(value, list):
            per_round = [list(record[key]) for record in ok if record.get(key)]
            joined = [t for times in per_round for t in times]
            pooled[key] = joined
            pooled[key + BY_ROUND] = per_round
            if joined:
                pooled.update(_statistics(base, key, joined))
    compiles = [record["compile_s"] for record in ok if record.get("compile_s") is not None]
    if compiles:  # the cold one: later processes on a machine may hit torch.compile's disk caches
        pooled["compile_s"] = max(compiles)
    if "median_ci_rel" in base and pooled.get("times_ms"):
        pooled["median_ci_rel"] = median_interval_rounds(pooled[f"times_ms{BY_ROUND}"]).relative_half_width
    return {**base, **pooled}


def _statistics(record: Record, key: str, times: list[float]) -> dict[str, Any]:
    """The summary of `times` under the keys the workload wrote for the list named `key`."""
    prefix = key[: -len("times_ms")]
    median, mean = statistics.median(times), statistics.fmean(times)
    p20, p80 = (float(v) for v in np.percentile(times, [20, 80]))
    if key == "local_times_ms":  # lmscope ddp's paired unwrapped step, by its mean
        return {"local_step_ms": mean} if "local_step_ms" in record else {}
    if not prefix:  # a step's timer statistics (bench, memory, profile; ddp's step_* names)
        std = statistics.stdev(times) if len(times) > 1 else 0.0
        out: dict[str, Any] = {
            "mean_ms": mean, "std_ms": std,
            "median_ms": median, "min_ms": min(times), "max_ms": max(times),
            "p20_ms": p20, "p80_ms": p80, "n": len(times),
            "step_ms": mean, "step_median_ms": median, "step_std_ms": std,
        }
        old, new = ((record.get("median_ms"), median) if "median_ms" in record
                    else (record.get("step_ms"), mean))  # ddp's tokens_per_s follows its mean step
        if isinstance(old, float | int) and old > 0:
            out.update({k: record[k] * old / new for k in THROUGHPUT_KEYS
                        if isinstance(record.get(k), float | int)})
        return {k: v for k, v in out.items() if k in record}
    name = prefix.rstrip("_")  # attention's passes: fwd_times_ms -> fwd_ms, fwd_p20_ms, ...
    old = record.get(f"{name}_ms")
    out = {f"{name}_ms": median, f"{name}_p20_ms": p20, f"{name}_p80_ms": p80}
    if isinstance(old, float | int) and old > 0 and isinstance(record.get(f"{name}_tflops"), float | int):
        out[f"{name}_tflops"] = record[f"{name}_tflops"] * old / median
    return {k: v for k, v in out.items() if k in record}

