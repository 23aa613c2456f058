"""Sections of a report from a run's records: one question per workload (or per study section).

Every workload of lmscope has a builder: its table (the same columns as `lmscope table`, the
prediction beside the measurement where the workload carries one) and the picture a person would
draw. Records of other workloads still get their table.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Callable, Sequence
from typing import Any

from lmscope.accounting.flops import parameter_counts
from lmscope.config import PRESETS, preset
from lmscope.measure.kernel_categories import CATEGORIES, short_name
from lmscope.records.results import Record
from lmscope.report import attention_plots, comm_plots
from lmscope.report.host_bound import host_bound_note
from lmscope.report.page import plots, twins
from lmscope.report.page.load import Run, artifact
from lmscope.report.page.model import Block, Cell, ImageBlock, PageSection, TableBlock, TextBlock
from lmscope.report.page.peers import peer_table, varying_peer_fields
from lmscope.report.profile_report import PHASE_ORDER, attention_table, fmt_ns
from lmscope.report.tables import build_table
from lmscope.running.runner import spec_fields

QUESTIONS = {
    "bench": "How long does a training step take, and how close to the device's peak is it?",
    "profile": "Where does a step's time go, kernel by kernel (op by op on a CPU) and phase by phase?",
    "memory": "How much memory does each phase of a step peak at, against the model's prediction?",
    "attention": "How do attention implementations compare in latency, throughput and memory?",
    "comm": "How fast are the collectives: time per call, algbw and busbw against buffer size?",
    "ddp": "What does each data-parallel strategy cost over the single-GPU step?",
}
PROVENANCE = ("device_name", "cpu_model", "driver", "torch", "triton", "cuda", "python", "git_sha", "host")
TOP_KERNELS = 15


def provenance_lines(records: Sequence[Record]) -> list[str]:
    """Device, versions, sha and host of the records (each distinct value), their time span (the
    commands that wrote them are said once, at the top of the page)."""
    lines = []
    for key in PROVENANCE:
        values = sorted({str(r.get(key)) for r in records if r.get(key) is not None})
        if values:
            lines.append(f"{key}: {', '.join(values)}")
    times = sorted(str(r["time"]) for r in records if r.get("time"))
    if times:
        lines.append(f"time: {times[0]} .. {times[-1]}")
    return lines


def command_lines(commands: Sequence[str]) -> list[str]:
    """The commands that wrote a run, each once in first-seen order, with how often it ran."""
    counts: dict[str, int] = {}
    for command in commands:
        counts[command] = counts.get(command, 0) + 1
    return [f"command: {c}" + (f" (run {n} times)" if n > 1 else "") for c, n in counts.items()]


def _spec_keys(records: Sequence[Record], workload: str) -> list[str]:
    try:
        return spec_fields(workload)
    except (ValueError, AttributeError, ModuleNotFoundError):
        return [k for k in records[0] if k not in PROVENANCE and k not in ("time", "status", "error")]


def _records_table(title: str, records: Sequence[Record], workload: str,
                   variables: Sequence[str] = ()) -> TableBlock:
    keys = _spec_keys(records, workload)
    header, rows = build_table(records, keys, always=[v for v in variables if v in keys])
    return TableBlock(title, header, rows)


def bench_blocks(run: Run, records: Sequence[Record], variables: Sequence[str] = ()) -> list[Block]:
    """The step-time table and step time vs size."""
    blocks: list[Block] = [
        _records_table("step times (ms), throughput and MFU", records, "bench", variables),
        TextBlock(
            "Prediction beside measurement: tflops and mfu divide the analytic FLOPs of the step "
            "(lmscope.accounting.flops) by the measured median step time (mfu: by the device's "
            "datasheet peak too; empty for a device lmscope does not know)."
        ),
    ]
    image = plots.step_time_vs_size(records)
    if image:
        blocks.append(ImageBlock("step time vs size", "step_time_vs_size", image))
    return blocks + peer_blocks(records, varying_peer_fields(records))


def peer_blocks(records: Sequence[Record], fields: Sequence[str]) -> list[Block]:
    """A ratio table with intervals per peer field (fp32 vs bf16, compile off vs on, ...)."""
    tables = [peer_table(records, field) for field in fields]
    return [t for t in tables if t is not None]


def _profile_json(run: Run, record: Record) -> dict[str, Any] | None:
    path = artifact(run, record.get("profile_json_path"))
    if path is None:
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _point_label(record: Record) -> str:
    return " ".join(
        str(record.get(k))
        for k in ("size", "context_length", "mode", "precision")
        if record.get(k) is not None
    )


def _top_kernels(record: Record) -> list[dict[str, Any]]:
    value = record.get("top_kernels") or []
    if isinstance(value, str):
        try:
            value = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            return []
    return [k for k in value if isinstance(k, dict) and "name" in k]


def kernel_rows(kernels: Sequence[dict[str, Any]], steps: int) -> list[list[Any]]:
    """Kernel summary rows, names shortened with the full name on hover."""
    return [
        [
            round(k["time_pct"], 1),
            fmt_ns(k["total_ns"]),
            k["instances"],
            round(k["instances"] / steps, 2),
            fmt_ns(k["avg_ns"]),
            fmt_ns(k["med_ns"]),
            k.get("category"),
            Cell(short_name(k["name"]), k["name"]),
        ]
        for k in kernels[:TOP_KERNELS]
    ]


def profile_blocks(run: Run, records: Sequence[Record], variables: Sequence[str] = ()) -> list[Block]:
    """Per point: kernel categories per phase (stacked), top kernels per phase, the attention
    breakdown. On a CPU the "kernels" are the profiler's CPU ops, and the plot says CPU time."""
    blocks: list[Block] = [_records_table("profiled points", records, "profile", variables)]
    on_cpu = all(r.get("device_type") == "cpu" for r in records if r.get("status") == "ok")
    columns: list[tuple[str, dict[str, float]]] = []
    for record in (r for r in records if r.get("status") == "ok"):
        label = _point_label(record)
        profile = _profile_json(run, record)
        if profile is None:
            if record.get("kernel_ms_per_step"):
                columns.append(
                    (
                        f"{label} step",
                        {
                            c: (record.get(f"{c}_frac") or 0.0) * record["kernel_ms_per_step"]
                            for c in CATEGORIES
                        },
                    )
                )
            kernels = _top_kernels(record)
            if kernels:
                blocks.append(
                    TableBlock(
                        f"top kernels of a step: {label}",
                        ["ms/step", "%", "per step", "name"],
                        [
                            [
                                k.get("ms_per_step"),
                                k.get("pct"),
                                k.get("per_step"),
                                Cell(short_name(k["name"]), k["name"]),
                            ]
                            for k in kernels
                        ],
                    )
                )
            continue
        steps = profile.get("steps", 1) or 1
        for phase in PHASE_ORDER:
            stats = profile["phases"].get(phase)
            if not stats:
                continue
            if phase != "step":
                columns.append((f"{label} {phase}", stats.get("category_ms_per_step", {})))
            blocks.append(
                TableBlock(
                    f"kernels: {label}, {phase} (top {TOP_KERNELS})",
                    ["Time %", "Total", "Instances", "Per step", "Avg", "Med", "Category", "Name"],
                    kernel_rows(stats.get("kernels", []), steps),
                )
            )
        if profile.get("attention"):
            header, rows = attention_table(profile["attention"])
            blocks.append(TableBlock(f"attention deep-dive (naive, forward): {label}", header, rows))
    image = plots.stacked_categories(columns, device="CPU" if on_cpu else "GPU")
    if image:
        title = "CPU op categories per phase" if on_cpu else "kernel categories per phase"
        blocks.insert(1, ImageBlock(title, "kernel_categories", image))
    return blocks


def memory_blocks(run: Run, records: Sequence[Record], variables: Sequence[str] = ()) -> list[Block]:
    """Measured vs predicted peaks, peaks per context, and each point's timeline."""
    blocks: list[Block] = [_records_table("peaks per phase: measured and predicted (GiB)", records, "memory",
                                          variables)]
    image = plots.memory_peaks(records)
    if image:
        blocks.append(ImageBlock("memory peak per context", "memory_peaks", image))
    for record in records:
        path = artifact(run, record.get("timeline_png"))
        if path is not None:
            blocks.append(
                ImageBlock(
                    f"memory timeline: {_point_label(record)} ckpt={record.get('checkpoint')}",
                    f"timeline_{len(blocks)}",
                    path.read_bytes(),
                )
            )
    return blocks


def attention_blocks(run: Run, records: Sequence[Record], variables: Sequence[str] = ()) -> list[Block]:
    """Latency, TFLOP/s and memory per implementation; latency vs sequence length."""
    blocks: list[Block] = [_records_table("attention implementations", records, "attention", variables)]
    passes = next((r.get("passes") for r in records if r.get("passes")), "fwd,bwd,fwd_bwd")
    image = plots.via_file(
        lambda p: attention_plots.plot_attention(records, p, attention_plots.latency_metrics(passes))
    )
    if image:
        blocks.append(ImageBlock("attention latency vs sequence length", "attention_latency", image))
    return blocks


def comm_blocks(run: Run, records: Sequence[Record], variables: Sequence[str] = ()) -> list[Block]:
    """The nccl-tests columns and busbw vs size."""
    blocks: list[Block] = [_records_table("collectives", records, "comm", variables)]
    image = plots.via_file(lambda p: comm_plots.plot_busbw(records, p))
    if image:
        blocks.append(ImageBlock("busbw vs size", "busbw", image))
    return blocks


def ddp_blocks(run: Run, records: Sequence[Record], variables: Sequence[str] = ()) -> list[Block]:
    """Strategies beside the single-GPU baseline, with the overhead model's prediction."""
    return [
        _records_table(
            "data-parallel strategies (predicted_comm_wait_ms beside comm_wait_ms)", records, "ddp",
            variables,
        )
    ]


ACCOUNTING = "lmscope.study.accounting_point"


def accounting_blocks(run: Run, records: Sequence[Record], variables: Sequence[str] = ()) -> list[Block]:
    """The parallelism accounting: its answer (memory per device and whether it fits, bytes per
    axis, pass times and bound), said to be a prediction for the catalogued device."""
    devices = ", ".join(sorted({str(r.get("device_name")) for r in records if r.get("device_name")}))
    ran_on = ", ".join(sorted({str(r.get("cpu_model")) for r in records if r.get("cpu_model")}))
    return [
        TextBlock(
            f"Predictions for {devices or 'the catalogued device'}, not measurements: lmscope's "
            "parallelism accounting (lmscope plan parallel) of each model on each DP x FSDP x TP mesh of "
            "that device, bf16: memory per device (total_gib against device_memory_gib: fits), the "
            "bytes each axis moves per step (*_step_mb) and each pass's math and communication "
            "time at the device's peak (*_bound: which one is longer)"
            + (f". Computed on {ran_on}; no device ran anything." if ran_on else ".")
        ),
        *_split(_records_table("", records, ACCOUNTING, variables), {
            f"memory per device on {devices or 'the device'} (predicted, GiB)": MEMORY_COLUMNS,
            "bytes each axis moves per step (predicted, MB)": BYTES_COLUMNS,
            "time per pass at the device's peak, and which bound (predicted, ms)": TIME_COLUMNS,
        }),
    ]


MEMORY_COLUMNS = ("devices", "total_gib", "device_memory_gib", "fits", "master_weights_gib",
                  "gradients_gib", "optimizer_state_gib", "activations_gib", "status")
BYTES_COLUMNS = ("dp_step_mb", "fsdp_step_mb", "tp_step_mb")
TIME_COLUMNS = ("forward_math_ms_at_peak", "forward_comm_ms", "forward_bound", "backward_math_ms_at_peak",
                "backward_comm_ms", "backward_bound")
"""The accounting's tables (the sections of `lmscope plan parallel`), each with the mesh."""


def _split(table: TableBlock, parts: dict[str, Sequence[str]]) -> list[TableBlock]:
    """One table per title of `parts`: the key columns (those no part names), then that part's."""
    named = {c for columns in parts.values() for c in columns}
    keys = [i for i, c in enumerate(table.header) if c not in named]
    blocks = []
    for title, columns in parts.items():
        chosen = keys + [i for i, c in enumerate(table.header) if c in columns]
        blocks.append(TableBlock(title, [table.header[i] for i in chosen],
                                 [[row[i] for i in chosen] for row in table.rows]))
    return blocks


def rows_blocks(run: Run, records: Sequence[Record], variables: Sequence[str] = ()) -> list[Block]:
    """Records that keep their rows in a `rows` list (precision checks): one table per record."""
    blocks: list[Block] = []
    for record in records:
        rows = record.get("rows") or []
        if not rows:
            blocks.append(
                TextBlock(f"{record.get('check')}: {record.get('status')} {record.get('error') or ''}")
            )
            continue
        header = list(dict.fromkeys(k for row in rows for k in row))
        title = " ".join(
            f"{k}={record.get(k)}" for k in ("check", "count", "model", "dtype") if record.get(k)
        )
        blocks.append(TableBlock(title, header, [[row.get(k) for k in header] for row in rows]))
    return blocks


def generic_blocks(run: Run, records: Sequence[Record], variables: Sequence[str] = ()) -> list[Block]:
    """Any other workload: its records as a table."""
    workload = str(records[0].get("workload"))
    if any("rows" in r for r in records):
        return rows_blocks(run, records)
    return [_records_table(workload, records, workload, variables)]


BUILDERS: dict[str, Callable[..., list[Block]]] = {
    "bench": bench_blocks,
    "profile": profile_blocks,
    "memory": memory_blocks,
    "attention": attention_blocks,
    "comm": comm_blocks,
    "ddp": ddp_blocks,
    ACCOUNTING: accounting_blocks,
}
"""Workload -> its blocks, from (run, records, variables=the study section's variables)."""


def _failures(records: Sequence[Record]) -> Block | None:
    failed = [r for r in records if r.get("status") not in ("ok", None)]
    if not failed:
        return None
    return TextBlock(
        f"{len(failed)} of {len(records)} point(s) did not finish ok: "
        + "; ".join(sorted({f"{r.get('status')}: {r.get('error')}" for r in failed})[:5])
    )


def _host_bound(records: Sequence[Record]) -> Block | None:
    """The note naming the section's host-bound points (lmscope.report.host_bound), if any."""
    note = host_bound_note(records, _spec_keys(records, str(records[0].get("workload"))))
    return TextBlock(note) if note else None


STUDY_PEERS = {"precision": "precision"}
"""Study sections whose peer sits in another section's file (bf16 here, fp32 in timing)."""


def _study_peers(run: Run, name: str, records: Sequence[Record]) -> list[Block]:
    field = STUDY_PEERS.get(name)
    if not run.manifest or field is None or field in varying_peer_fields(records):
        return []
    workload = records[0].get("workload")
    return peer_blocks([r for r in run.records if r.get("workload") == workload], [field])


SWEEP_FIELDS = ("dtype", "precision", "size", "batch", "seq_len", "context_length", "mode",
                "checkpoint", "compile", "warmup", "impl")
"""A study section's swept spec fields, slowest-varying first: its tables read precision by
precision, size by size, context by context (mode and impl names sort in their natural order as
text; sizes by `_size_rank`)."""


def _size_rank(size: Any) -> float:
    """A preset's parameter count (the study's sizes are presets); other sources after them."""
    return parameter_counts(preset(size))["total"] if size in PRESETS else float("inf")


def sweep_order(records: Sequence[Record]) -> list[Record]:
    """`records` sorted by their spec (a resumed study writes them in the order they ran).

    Only spec fields decide, so the rows of one point keep the order they were written in (the
    report shows the last, e.g. an ok row that a resume wrote after an error row)."""

    def key(record: Record) -> tuple[tuple[bool, float, str], ...]:
        values = [_size_rank(record[f]) if f == "size" and f in record else record.get(f)
                  for f in SWEEP_FIELDS]
        return tuple((v is None, v if isinstance(v, int | float) else 0.0, str(v)) for v in values)

    return sorted(records, key=key)


def section_variables(run: Run, name: str) -> list[str]:
    """A study section's variables (the spec fields its points differ in): as its manifest
    recorded them, else those of the section the study defines today for the manifest's target
    (a manifest written before sections recorded them); none without a target."""
    state = run.manifest.get("sections", {}).get(name, {})
    if "variables" in state:
        return list(state["variables"] or [])
    target = run.manifest.get("target")
    if not isinstance(target, dict):
        return []
    from lmscope.study.sections import build_sections
    from lmscope.study.target import Target

    try:
        sections = build_sections(Target(**target), run.base)
    except (TypeError, ValueError):
        return []
    return next((s.variables for s in sections if s.name == name), [])


def run_sections(run: Run) -> list[PageSection]:
    """The report's sections of one run: per study section (with a manifest) or per workload."""
    groups: list[tuple[str, str, list[Record]]] = []
    if run.manifest.get("sections"):
        for name, state in run.manifest["sections"].items():
            records = sweep_order([r for r in run.records if r.get("_file") == state.get("file")])
            if state.get("skip_reason"):
                groups.append((name, state["question"], []))
            else:
                groups.append((name, state["question"], records))
    else:
        for workload, records in run.by_workload().items():
            groups.append((workload, QUESTIONS.get(workload, f"What did {workload} measure?"), records))
    sections = []
    for name, question, records in groups:
        section = PageSection(title=name, question=question, provenance=provenance_lines(records))
        if not records:
            state = run.manifest.get("sections", {}).get(name, {})
            reason = state.get("skip_reason") or state.get("error") or "no results yet (run it with --resume)"
            section.blocks.append(TextBlock(f"Not measured: {reason}."))
        else:
            workload = str(records[0].get("workload"))
            try:
                variables = section_variables(run, name) if run.manifest.get("sections") else []
                section.blocks += BUILDERS.get(workload, generic_blocks)(run, records, variables=variables)
                section.blocks += _study_peers(run, name, records)
                section.blocks += _twins(run, name, records)
            except Exception as error:  # noqa: BLE001 - one bad section must not lose the report
                section.blocks.append(
                    TextBlock(f"This section could not be drawn: {type(error).__name__}: {error}")
                )
            failure = _failures(records)
            if failure:
                section.blocks.append(failure)
            host_bound = _host_bound(records)
            if host_bound:
                section.blocks.append(host_bound)
        sections.append(section)
    return sections


def _twins(run: Run, name: str, records: Sequence[Record]) -> list[Block]:
    """In a study: which rows are reused from another section, and the points measured twice."""
    state = run.manifest.get("sections", {}).get(name)
    if not state:
        return []
    blocks = [twins.reuse_note(records), twins.twin_table(run, str(state.get("file")), records)]
    return [b for b in blocks if b is not None]
