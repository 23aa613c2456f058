"""Tables of records: which columns to show, pivots by a swept field, and output formats.

A failed point keeps its row: its metric cells read OOM, TIMEOUT or ERROR, the way the study
write-ups tabulate sizes that did not fit.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence
from typing import Any

from lmscope.records.results import Record, point_key
from lmscope.report.compare import Table, pivot
from lmscope.report.rounds import pool_rounds

METRIC_COLUMNS: dict[str, list[str]] = {
    "bench": [
        "mean_ms", "std_ms", "median_ms", "forward_ms", "backward_ms", "optimizer_ms",
        "tokens_per_s", "samples_per_s", "tflops", "mfu", "tflops_counted", "mfu_counted",
        "peak_allocated_gib", "avg_watts", "joules_per_token", "compile_s", "gpu_busy_share",
        "host_bound",
    ],
    "attention": [
        "fwd_ms", "bwd_ms", "fwd_bwd_ms", "fwd_tflops", "bwd_tflops", "fwd_bwd_tflops",
        "mem_before_backward_mib", "peak_mib", "saved_bytes_per_seq2", "max_error", "max_grad_error",
    ],
    "profile": [
        "step_ms", "profiled_step_ms", "overhead_pct", "launches_per_step", "gpu_busy_frac", "cpu_busy_frac",
        "matmul_frac", "attention_frac", "elementwise_frac", "reduction_frac", "optimizer_frac",
        "forward_matmul_frac", "softmax_time_vs_scores", "top_kernel", "invariant_ok", "gpu_busy_share",
        "host_bound",
    ],
    "comm": ["bytes", "count", "time_ms", "time_rank_max_ms", "algbw_gbps", "busbw_gbps", "wrong"],
    "ddp": [
        "step_ms", "step_std_ms", "forward_ms", "backward_ms", "comm_wait_ms", "optimizer_ms",
        "comm_overhead_pct", "predicted_comm_wait_ms", "comm_wait_error_pct", "tokens_per_s",
        "samples_per_s",        "init_allocated_gib", "peak_before_optimizer_gib", "peak_after_optimizer_gib",
    ],
    "memory": [
        "after_init_gib", "forward_peak_gib", "predicted_forward_peak_gib", "backward_peak_gib",
        "predicted_backward_peak_gib", "optimizer_peak_gib", "step_peak_gib", "predicted_step_peak_gib",
        "step_peak_error_pct", "step_reserved_gib", "median_ms", "top_alloc_mib", "checkpoint_policy",
        "saved_activations_gib", "saved_block_error_pct", "gpu_busy_share", "host_bound",
    ],
    "probe": [
        "median_ms", "mean_ms", "std_ms", "forward_ms", "backward_ms", "optimizer_ms", "tokens_per_s",
        "peak_allocated_gib",
    ],
    "lmscope.study.accounting_point": [
        "devices", "total_gib", "device_memory_gib", "fits", "master_weights_gib", "gradients_gib",
        "optimizer_state_gib", "activations_gib", "dp_step_mb", "fsdp_step_mb", "tp_step_mb",
        "forward_math_ms_at_peak", "forward_comm_ms", "forward_bound", "backward_math_ms_at_peak",
        "backward_comm_ms", "backward_bound",
    ],
}
"""Per workload, the metric columns a table shows (those present in the records)."""

PRIMARY_METRIC: dict[str, str] = {"bench": "median_ms", "attention": "fwd_bwd_ms", "profile": "matmul_frac",
                                  "comm": "busbw_gbps", "ddp": "step_ms", "memory": "step_peak_gib",
                                  "probe": "median_ms"}
"""Per workload, the metric that `--compare` pivots (lower is better for *_ms; timings are
medians, the statistic whose ratio `lmscope.records.stats.ratio_interval` bounds)."""

IDENTITY_SKIP = {"workload"}
OVERRIDES = ("vocab_size", "d_model", "d_ff", "num_layers", "num_heads", "model_context_length")
"""Spec fields that change a preset's model: shown beside `size` whenever a point sets them."""
FORMATS = ("table", "md", "csv", "latex", "json")


def latest_per_point(records: Sequence[Record], spec_keys: Sequence[str]) -> list[Record]:
    """One record per point (the last written wins), in first-seen order."""
    latest: dict[str, Record] = {}
    for record in records:
        key = point_key(record.get("workload", ""), {k: record.get(k) for k in spec_keys})
        latest.pop(key, None)
        latest[key] = record
    return list(latest.values())


def varying_fields(records: Sequence[Record], spec_keys: Sequence[str]) -> list[str]:
    """Spec fields whose value differs between records (the swept axes), in spec order."""
    return [
        key for key in spec_keys
        if key not in IDENTITY_SKIP and len({json.dumps(r.get(key)) for r in records}) > 1
    ]


def shown_fields(
    records: Sequence[Record], spec_keys: Sequence[str], always: Sequence[str] = ()
) -> list[str]:
    """The spec columns of a table: the swept fields, the fields in `always` (a study section's
    variables, shown even where its one row has a single value), and the preset with every
    dimension a point overrides (a `--d-model 512` point is not labelled as the preset alone), in
    spec order."""
    varying = set(varying_fields(records, spec_keys)) | set(always)
    overridden = {k for k in OVERRIDES if any(r.get(k) is not None for r in records)}
    shown = varying | overridden
    if (overridden or not varying) and "size" in spec_keys:
        shown.add("size")
    return [k for k in spec_keys if k in shown]


def _cell(record: Record, column: str) -> Any:
    status = record.get("status", "ok")
    if status != "ok" and column not in record:
        return status.upper()
    if status != "ok" and record.get(column) is None:
        return status.upper()
    return record.get(column)


def build_table(
    records: Sequence[Record],
    spec_keys: Sequence[str],
    *,
    compare: str | None = None,
    compare_base: str | None = None,
    always: Sequence[str] = (),
) -> Table:
    """Header and rows: the swept fields (and those in `always`), then the workload's metrics (or
    a pivot by `compare` against `compare_base`, see `lmscope.report.compare`). The rounds of a
    point are pooled."""
    if not records:
        return [], []
    workload = records[0].get("workload", "")
    records = latest_per_point(pool_rounds(records, spec_keys), spec_keys)
    axes = shown_fields(records, spec_keys, always)
    metrics = [
        m for m in METRIC_COLUMNS.get(workload, [])
        if any(r.get(m) is not None for r in records)
    ]
    if compare is None:
        header = axes + metrics + ["status"]
        rows = [[r.get(a) for a in axes] + [_cell(r, m) for m in metrics] + [r.get("status")]
                for r in records]
        return header, rows
    primary = PRIMARY_METRIC.get(workload) or (metrics[0] if metrics else "status")
    return pivot(records, axes, compare, primary, cell=_cell, base=compare_base)


def format_value(value: Any) -> str:
    """Numbers with sensible precision; None as a dash."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        if value == 0:
            return "0"
        magnitude = abs(value)
        if magnitude >= 1e5:
            return f"{value:,.0f}"
        if magnitude >= 100:
            return f"{value:.1f}"
        if magnitude >= 1:
            return f"{value:.3g}" if magnitude < 10 else f"{value:.2f}"
        return f"{value:.3g}"
    return str(value)


def to_markdown(table: Table) -> str:
    """GitHub-flavoured markdown table."""
    header, rows = table
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(format_value(v) for v in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def to_csv(table: Table) -> str:
    """CSV with raw (unrounded) values."""
    header, rows = table
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(header)
    writer.writerows(["" if v is None else v for v in row] for row in rows)
    return buffer.getvalue()


def to_latex(table: Table) -> str:
    """A booktabs tabular."""
    header, rows = table

    def escape(text: str) -> str:
        return text.replace("_", r"\_").replace("%", r"\%").replace("&", r"\&")

    lines = [r"\begin{tabular}{" + "l" * len(header) + "}", r"\toprule",
             " & ".join(escape(h) for h in header) + r" \\", r"\midrule"]
    lines += [" & ".join(escape(format_value(v)) for v in row) + r" \\" for row in rows]
    lines += [r"\bottomrule", r"\end{tabular}"]
    return "\n".join(lines) + "\n"


def to_json(table: Table) -> str:
    """A list of row objects."""
    header, rows = table
    return json.dumps([dict(zip(header, row, strict=True)) for row in rows], indent=2) + "\n"


def render(table: Table, fmt: str) -> str:
    """The table as text in `fmt` (md, csv, latex, json)."""
    renderers = {"md": to_markdown, "csv": to_csv, "latex": to_latex, "json": to_json}
    if fmt not in renderers:
        raise ValueError(f"unknown format {fmt!r}: choose one of {', '.join(renderers)}")
    return renderers[fmt](table)
