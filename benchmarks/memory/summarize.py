"""Summarize a GPU run of benchmarks/memory/run_gpu.sh: markdown tables and the model's accuracy.

Usage: python3 benchmarks/memory/summarize.py RESULTS_JSONL SUMMARY_MD

Writes SUMMARY_MD with (1) the 2.7B peak table, measured beside predicted, per phase; (2) the
activation-checkpointing trade-off (peak and step time); (3) the accuracy sweep of the memory model
(step peak error per point, how many within the 10 % target); (4) the largest allocations of the
points that recorded a snapshot. Prints the accuracy table and the verdict last.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lmscope.records.results import Record, read_records
from lmscope.report import console
from lmscope.report.tables import Table, to_markdown

TARGET_PCT = 10.0
"""The issue's target: predicted step peak within 10 % of the measured one."""
PHASES = ("after_init", "forward_peak", "backward_peak", "optimizer_peak", "step_peak")


SPEC = ("size", "context_length", "batch_size", "mode", "precision", "attention", "checkpoint")


def _rows(records: Sequence[Record], keys: Sequence[str]) -> list[list[Any]]:
    """Cells of `keys`; a failed point's metric cells read its status (OOM, ERROR, TIMEOUT)."""
    return [[r.get(k) if r.get("status") == "ok" or k in SPEC else str(r.get("status")).upper() for k in keys]
            for r in records]


def peak_table(records: Sequence[Record]) -> Table:
    """Per point and phase: measured allocated GiB, predicted GiB and the error in percent."""
    keys = ["context_length", "mode", "precision"]
    for phase in PHASES:
        keys += [f"{phase}_gib", f"predicted_{phase}_gib", f"{phase}_error_pct"]
    keys += ["step_reserved_gib"]
    return keys, _rows(records, keys)


def checkpoint_table(records: Sequence[Record]) -> Table:
    """Peak and step time per checkpoint policy, with ratios to the first policy."""
    keys = ["size", "context_length", "precision", "checkpoint", "step_peak_gib", "predicted_step_peak_gib",
            "step_peak_error_pct", "median_ms"]
    rows = _rows(records, keys)
    ok = [r for r in records if r.get("status") == "ok"]
    if len(ok) >= 2:
        base = ok[0]
        keys = [*keys, "peak_vs_first", "time_vs_first"]
        ratios = [[r["step_peak_gib"] / base["step_peak_gib"], r["median_ms"] / base["median_ms"]]
                  if r.get("status") == "ok" else [None, None] for r in records]
        rows = [row + extra for row, extra in zip(rows, ratios, strict=True)]
    return keys, rows


def accuracy_table(records: Sequence[Record]) -> Table:
    """Step peak measured vs predicted per point of the sweep."""
    keys = ["size", "context_length", "precision", "attention", "mode", "checkpoint", "step_peak_gib",
            "predicted_step_peak_gib", "step_peak_error_pct", "forward_peak_error_pct",
            "backward_peak_error_pct"]
    return keys, _rows(records, keys)


def verdict(records: Sequence[Record]) -> str:
    """How many measured points the model predicts within the target, and the worst error."""
    errors = [r["step_peak_error_pct"] for r in records
              if r.get("status") == "ok" and r.get("step_peak_error_pct") is not None]
    if not errors:
        return "no measured points with a prediction"
    inside = sum(abs(e) <= TARGET_PCT for e in errors)
    worst = max(errors, key=abs)
    return (f"memory model: {inside}/{len(errors)} points within {TARGET_PCT:g} % of the measured step peak "
            f"(worst {worst:+.1f} %, mean |error| {sum(abs(e) for e in errors) / len(errors):.1f} %)")


def top_sections(records: Sequence[Record]) -> list[str]:
    """The largest allocations of each point that recorded a snapshot."""
    lines = []
    for r in records:
        if not r.get("top_allocations"):
            continue
        lines.append(f"### {r['size']} ctx {r['context_length']} {r['mode']} {r['precision']} "
                     f"{r['attention']} checkpoint={r['checkpoint']}\n")
        rows = [[t["size_mib"], t["count"], t["phase"], t["site"]] for t in r["top_allocations"]]
        header = ["size_mib", "count", "phase", "first frame in lmscope / user code"]
        lines.append(to_markdown((header, rows)))
    return lines


def summary_text(results: Path) -> str:
    """The summary of the memory rows in `results` (markdown), a function of those rows alone."""
    records = [r for r in read_records(results) if r.get("workload") == "memory"]
    big = [r for r in records if r.get("size") == "2.7B"]
    ckpt = [r for r in records if r.get("size") == "xl" and r.get("mode") == "train-step"]
    sweep = _sweep(records)
    device = next((r.get("device_name") for r in records if r.get("device_name")), "?")
    parts = [f"# lmscope memory on {device}\n",
             "Measured: CUDA caching allocator, peak of each phase (reset at its start, read at its end), "
             "warm-up outside; predicted: `lmscope.accounting.memory.predict_memory`. GiB; error = "
             "(predicted - measured) / measured.\n",
             f"**{verdict(sweep)}**\n",
             "## 2.7B: peak per phase, measured and predicted (batch 4, naive attention)\n",
             to_markdown(peak_table(big)),
             "## Activation checkpointing trade-off (xl, train-step)\n",
             to_markdown(checkpoint_table(ckpt)),
             "## Memory model accuracy (train-step, no checkpointing)\n",
             to_markdown(accuracy_table(sweep)),
             "## Largest allocations (points with a snapshot)\n",
             *top_sections(records)]
    return "\n".join(parts)


def _sweep(records: Sequence[Record]) -> list[Record]:
    """The accuracy sweep's points: train steps without checkpointing, every size."""
    return [r for r in records if r.get("mode") == "train-step" and r.get("checkpoint") == "none"
            and r.get("size") in ("small", "medium", "large", "xl", "2.7B")]


def main(argv: list[str]) -> None:
    results, summary = Path(argv[0]), Path(argv[1])
    summary.write_text(summary_text(results))
    records = [r for r in read_records(results) if r.get("workload") == "memory"]
    sweep = _sweep(records)
    ckpt = [r for r in records if r.get("size") == "xl" and r.get("mode") == "train-step"]
    console.show_table(accuracy_table(sweep), title="memory model accuracy (train-step)")
    console.show_table(checkpoint_table(ckpt), title="checkpointing trade-off")
    console.say(verdict(sweep))
    console.say(f"wrote {summary}")


if __name__ == "__main__":
    main(sys.argv[1:])
