"""`lmscope plan`: FLOPs, memory, communication and parallelism answers before any GPU run.

Every number comes from `lmscope.accounting` (the same functions `bench`, `profile` and `memory`
put beside their measurements). A plan is a set of named sections, each a list of flat records
whose keys carry their units, shown as terminal tables, markdown or JSON.
"""

from __future__ import annotations

import json
import math
from typing import Any

from lmscope.accounting.devices import lookup, peak_tflops
from lmscope.accounting.flops import (
    MODES,
    forward_flops,
    forward_flops_by_component,
    parameter_counts,
    phase_flops,
)
from lmscope.accounting.fsdp import predict_fsdp
from lmscope.accounting.memory import predict_memory, saved_activations
from lmscope.accounting.parallelism import (
    PHASES,
    Hardware,
    Mesh,
    ModelShape,
    PrecisionPlan,
    check_mesh,
    comm_seconds,
    compute_bound_tokens,
    dp_critical_batch,
    dtype_bytes,
    math_seconds,
    memory_per_device,
    mesh_problem,
    mixed_critical_batch,
    mixed_min_batch_per_device,
    tp_max_degree,
    traffic,
)
from lmscope.accounting.xxl import FFN_MODELS, FFNStack, worked_example
from lmscope.config import ModelConfig, preset
from lmscope.inputs.limits import MAX_SIZE
from lmscope.records.results import Record
from lmscope.report import console
from lmscope.report.tables import Table, render

Sections = dict[str, list[Record]]
PLAN_FORMATS = ("table", "md", "json")
MFU_DTYPES = ("fp32", "tf32", "bf16", "fp16", "fp8")
"""The dtypes of the device peak table (`accounting.devices`)."""
HIDDEN_IN_TABLES = ("value", "unit")
"""Record keys kept in JSON but left out of tables (the `result` column shows them)."""
GIB, GFLOP = 2**30, 1e9


def _positive(value: Any, flag: str) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"{flag} must be a positive integer, got {value!r}: pass {flag} N")
    if value > MAX_SIZE:
        raise ValueError(f"{flag} {value} is too large: at most {MAX_SIZE:,} (nothing larger fits on a "
                         "device)")


def check_format(fmt: str) -> None:
    """Reject an unknown plan --format before anything is computed."""
    if fmt not in PLAN_FORMATS:
        raise ValueError(f"unknown format {fmt!r}: choose one of {', '.join(PLAN_FORMATS)}")


def _check_mode(mode: str) -> None:
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}: choose one of {', '.join(MODES)}")


def _pct(part: float, whole: float) -> float | None:
    return 100.0 * part / whole if whole else None


def spec_record(name: str, config: ModelConfig, batch_size: int, seq_len: int, mode: str) -> Record:
    """The model point a plan describes."""
    return {"model": name, "d_model": config.d_model, "d_ff": config.d_ff, "num_layers": config.num_layers,
            "num_heads": config.num_heads, "vocab_size": config.vocab_size, "batch_size": batch_size,
            "context_length": seq_len, "mode": mode, "tokens": batch_size * seq_len}


def flops_plan(
    name: str,
    config: ModelConfig,
    *,
    batch_size: int,
    seq_len: int,
    mode: str = "train-step",
    contexts: list[int] | None = None,
    step_ms: float | None = None,
    device_name: str | None = None,
    precision: str = "fp32",
) -> Sections:
    """Parameters by component, FLOPs by component and phase, growth with context, and MFU."""
    _positive(batch_size, "--batch-size")
    _positive(seq_len, "--context-length")
    _check_mode(mode)
    if precision not in MFU_DTYPES:
        raise ValueError(f"unknown precision {precision!r} for the MFU peak: "
                         f"choose one of {', '.join(MFU_DTYPES)}")
    for length in contexts or []:
        _positive(length, "--contexts")
    tokens = batch_size * seq_len
    counts = parameter_counts(config)
    in_matmuls = {"attention", "ffn", "lm_head"}
    parameters = [
        {"component": key, "parameters": value, "share_pct": _pct(value, counts["total"]),
         "in_matmuls": key in in_matmuls if key != "total" else None}
        for key, value in counts.items()
    ]
    phases = phase_flops(config, batch_size, seq_len, mode)
    factor = phases["step"] / phases["forward"]
    components = forward_flops_by_component(config, batch_size, seq_len)
    components["total"] = sum(components.values())
    flops = [
        {"component": key, "forward_gflop": fwd / GFLOP, "backward_gflop": (factor - 1) * fwd / GFLOP,
         "step_gflop": factor * fwd / GFLOP, "step_gflop_per_token": factor * fwd / tokens / GFLOP,
         "share_pct": _pct(fwd, components["total"])}
        for key, fwd in components.items()
    ]
    sections: Sections = {
        "model": [{**spec_record(name, config, batch_size, seq_len, mode), "parameters": counts["total"]}],
        "parameters": parameters,
        "flops": flops,
        "context": [_context_row(config, batch_size, length, factor)
                    for length in contexts or [seq_len]],
    }
    if step_ms is not None:
        sections["mfu"] = [mfu_record(phases["step"], step_ms, device_name, precision)]
    return sections


def _context_row(config: ModelConfig, batch_size: int, seq_len: int, factor: float) -> Record:
    _positive(seq_len, "--contexts")
    forward = forward_flops(config, batch_size, seq_len)
    tokens = batch_size * seq_len
    return {"context_length": seq_len, "forward_gflop_per_token": forward["total"] / tokens / GFLOP,
            "step_gflop_per_token": factor * forward["total"] / tokens / GFLOP,
            "step_gflop": factor * forward["total"] / GFLOP,
            "attention_share_pct": _pct(forward["attention"], forward["total"])}


def mfu_record(step_flops: float, step_ms: float, device_name: str | None, precision: str) -> Record:
    """Achieved TFLOP/s of a measured step and its MFU (None for a device not in the catalog)."""
    if not (isinstance(step_ms, int | float) and math.isfinite(step_ms) and step_ms > 0):
        raise ValueError(f"--step-ms must be a positive time in ms, got {step_ms!r}")
    achieved = step_flops / (step_ms / 1e3) / 1e12
    peak = peak_tflops(device_name, precision)
    spec = lookup(device_name)
    return {"step_ms": step_ms, "step_gflop": step_flops / GFLOP, "achieved_tflops": achieved,
            "device": spec.name if spec else (device_name or "unknown"), "precision": precision,
            "peak_tflops": peak, "mfu": achieved / peak if peak else None}


def memory_plan(
    name: str,
    config: ModelConfig,
    *,
    batch_size: int,
    seq_len: int,
    mode: str = "train-step",
    precision: str = "fp32",
    attention: str = "naive",
    checkpoint: str = "none",
    fsdp: int = 1,
    fast: bool = False,
) -> Sections:
    """Predicted peak of each phase, what it is made of, the saved activations and one residual tensor;
    with `fsdp` > 1 also the memory per rank and bytes per step of FullyShardedDP over that many ranks
    (`fast`: FastTransformerLM's units, the LM head in the root)."""
    _positive(batch_size, "--batch-size")
    _positive(seq_len, "--context-length")
    from lmscope.accounting.parallelism import MAX_DEGREE

    if not isinstance(fsdp, int) or isinstance(fsdp, bool) or not 1 <= fsdp <= MAX_DEGREE:
        raise ValueError(f"--fsdp must be an integer from 1 (off) to {MAX_DEGREE:,} ranks, got {fsdp!r}")
    config = config.replace(context_length=max(config.context_length, seq_len))
    prediction = predict_memory(config, batch_size=batch_size, seq_len=seq_len, mode=mode,
                                precision=precision, attention=attention, checkpoint=checkpoint)
    phases = {"after_init": prediction.after_init, "forward_peak": prediction.forward_peak,
              "backward_peak": prediction.backward_peak, "optimizer_peak": prediction.optimizer_peak,
              "step_peak": prediction.step_peak}
    components = prediction.components
    whole = sum(components.values())
    saved = saved_activations(config, batch_size=batch_size, seq_len=seq_len, precision=precision,
                              attention=attention)
    setup = {**spec_record(name, config, batch_size, seq_len, mode), "precision": precision,
             "attention": attention, "checkpoint": checkpoint}
    return {
        "model": [setup],
        "peak per phase": [{"phase": k, "predicted_gib": None if v is None else v / GIB}
                           for k, v in phases.items()],
        "components": [{"component": k, "predicted_gib": v / GIB, "share_pct": _pct(v, whole)}
                       for k, v in components.items()],
        "activations saved for backward (no checkpointing)": [
            {"kind": k, "predicted_mib": v / 2**20, "share_pct": _pct(v, saved["total"])}
            for k, v in saved.items()],
        "one residual-stream tensor": [{
            "shape": f"({batch_size}, {seq_len}, {config.d_model})", "dtype": precision,
            "residual_activation_mib": prediction.residual_activation_bytes / 2**20}],
        **(_fsdp_section(config, fsdp, batch_size, seq_len, precision, attention, checkpoint, fast)
           if fsdp > 1 else {}),
    }


def _fsdp_section(config: ModelConfig, ranks: int, batch_size: int, seq_len: int, precision: str,
                  attention: str, checkpoint: str, fast: bool) -> Sections:
    """FullyShardedDP over `ranks`: memory per rank by part, and bytes per rank and step."""
    predicted = predict_fsdp(config, world_size=ranks, batch_size=batch_size, seq_len=seq_len,
                             precision=precision, attention=attention, checkpoint=checkpoint, fast=fast)
    record = predicted.as_record()
    return {f"FSDP over {ranks} ranks (lmscope.parallel.fsdp), per rank": [
        {"part": key.removeprefix("predicted_fsdp_").removesuffix("_gib"), "predicted_gib": value}
        for key, value in record.items()]}


def ffn_stack(name: str, *, d_model: int | None = None, d_ff: int | None = None,
              num_layers: int | None = None) -> FFNStack:
    """A named FFN-only config with optional overrides."""
    base = FFN_MODELS[name.lower()]
    return FFNStack(name=base.name, d_model=d_model or base.d_model, d_ff=d_ff or base.d_ff,
                    num_blocks=num_layers or base.num_blocks)


def is_ffn_model(name: str) -> bool:
    """Whether `name` is an FFN-only config (xxl) rather than a Transformer preset."""
    return name.lower() in FFN_MODELS


def model_shape(name: str, seq_len: int, *, activations: str = "bf16", attention: str = "naive",
                **overrides: int | None) -> ModelShape:
    """The planner's view of a Transformer preset or an FFN-only config, with overrides."""
    _positive(seq_len, "--context-length")
    if is_ffn_model(name):
        extra = [k for k in ("num_heads", "vocab_size") if overrides.get(k) is not None]
        if extra:
            raise ValueError(f"{name} is FFN-only: it has no {', '.join(extra)} to override")
        return ffn_stack(name, d_model=overrides.get("d_model"), d_ff=overrides.get("d_ff"),
                         num_layers=overrides.get("num_layers")).shape()
    config = transformer_config(name, **overrides)
    config = config.replace(context_length=max(config.context_length, seq_len))
    return transformer_shape(name, config, seq_len, activations=activations, attention=attention)


def transformer_shape(name: str, config: ModelConfig, seq_len: int, *, activations: str = "bf16",
                      attention: str = "naive") -> ModelShape:
    """The reference Transformer for the planner: FLOPs from `flops`, saved activations from `memory`.

    The activations are what the lmscope model keeps for backward per token of a sequence of
    `seq_len` (fp32, or autocast to bf16/fp16: `activations`), counted in elements of that dtype.
    """
    saved = saved_activations(config, batch_size=1, seq_len=seq_len, precision=activations,
                              attention=attention)["total"]
    return ModelShape(
        name=name, parameters=parameter_counts(config)["total"], d_model=config.d_model,
        d_ff=config.d_ff, num_layers=config.num_layers,
        forward_flops_per_token=forward_flops(config, 1, seq_len)["total"] / seq_len,
        activation_elements_per_token=saved / seq_len / dtype_bytes(activations), tp_blocks_per_layer=2,
        num_heads=config.num_heads,
    )


def transformer_config(name: str, **overrides: Any) -> ModelConfig:
    """A Transformer preset with overrides; FFN-only names are refused with a hint."""
    if is_ffn_model(name):
        raise ValueError(f"{name!r} is an FFN-only model: this command takes a Transformer preset "
                         "(tiny, small, medium, large, xl, 2.7B); use `lmscope plan parallel|comm`")
    return preset(name, **overrides)


def mb(value: float) -> float:
    """Bytes to decimal MB (data moved, as nccl-tests counts it)."""
    return value / 1e6


def comm_plan(
    shape: ModelShape,
    *,
    devices: int,
    tokens: int,
    hw: Hardware,
    comm_dtype: str = "fp32",
    ring_factors: bool = True,
) -> Sections:
    """Bytes per device and time per step for DP, FSDP and TP over `devices`, one strategy at a time."""
    _positive(devices, "--devices")
    _positive(tokens, "--batch-size x --context-length")
    precision = PrecisionPlan(communication=comm_dtype)
    rows = []
    for axis in ("dp", "fsdp", "tp"):
        mesh = Mesh(**{axis: devices})
        problem = mesh_problem(shape, mesh)
        if problem:
            rows.append({"strategy": axis, "devices": devices, "collectives": f"cannot hold: {problem}"})
            continue
        moved = traffic(shape, mesh, precision, tokens, hw, ring_factors=ring_factors)
        step_bytes = sum(t.step_bytes for t in moved)
        comm = sum(comm_seconds(shape, mesh, precision, tokens, hw, p, ring_factors=ring_factors)
                   for p in PHASES)
        math_s = sum(math_seconds(shape, mesh, tokens, hw, p) for p in PHASES)
        bound = compute_bound_tokens(shape, mesh, precision, hw, ring_factors=ring_factors)
        rows.append({
            "strategy": axis, "devices": devices,
            "collectives": moved[0].collectives if moved else "none (one device)",
            "forward_mb": mb(sum(t.forward_bytes for t in moved)),
            "backward_mb": mb(sum(t.backward_bytes for t in moved)),
            "step_mb": mb(step_bytes), "bandwidth_gbps": hw.axis_bandwidth / 1e9,
            "comm_ms": comm * 1e3, "math_ms_at_peak": math_s * 1e3,
            "compute_bound_above_tokens": bound,
            "compute_bound_above_tokens_per_device": bound / devices if bound is not None else None,
        })
    head = {"model": shape.name, "parameters": shape.parameters, "tokens": tokens, "devices": devices,
            "comm_dtype": comm_dtype, "device": hw.name, "peak_tflops": hw.peak_flops / 1e12,
            "bandwidth_gbps": hw.axis_bandwidth / 1e9, "ring_factors": ring_factors}
    return {"setup": [head], "communication per step": rows}


def parallel_plan(
    shape: ModelShape, mesh: Mesh, precision: PrecisionPlan, *, tokens: int, hw: Hardware
) -> Sections:
    """Per-device memory, traffic per axis, pass times and compute-bound batch of a sharded step."""
    _positive(tokens, "--batch-size x --context-length")
    check_mesh(shape, mesh)
    memory = memory_per_device(shape, mesh, precision, tokens)
    memory_rows: list[Record] = [
        {"component": key, "gib": value / GIB, "gb": value / 1e9, "share_pct": _pct(value, memory["total"])}
        for key, value in memory.items()
    ]
    if hw.memory_bytes:
        memory_rows.append({"component": f"{hw.name} memory", "gib": hw.memory_bytes / GIB,
                            "gb": hw.memory_bytes / 1e9, "fits": memory["total"] <= hw.memory_bytes})
    moved = traffic(shape, mesh, precision, tokens, hw)
    traffic_rows = [
        {"axis": t.axis, "degree": getattr(mesh, t.axis), "collectives": t.collectives,
         "forward_mb": mb(t.forward_bytes), "backward_mb": mb(t.backward_bytes), "step_mb": mb(t.step_bytes),
         "bandwidth_gbps": t.bandwidth / 1e9, "forward_ms": t.seconds("forward") * 1e3,
         "backward_ms": t.seconds("backward") * 1e3}
        for t in moved
    ]
    time_rows = []
    for phase in PHASES:
        math_s = math_seconds(shape, mesh, tokens, hw, phase)
        comm_s = comm_seconds(shape, mesh, precision, tokens, hw, phase)
        time_rows.append({"phase": phase, "math_ms_at_peak": math_s * 1e3, "comm_ms": comm_s * 1e3,
                          "bound": "compute" if math_s >= comm_s else "communication"})
    setup = {"model": shape.name, "parameters": shape.parameters, **_mesh_fields(mesh), "tokens": tokens,
             "tokens_per_device": tokens / mesh.devices, "master": precision.master,
             "gradients": precision.gradients, "optimizer": precision.optimizer,
             "activations": precision.activations, "communication": precision.communication,
             "device": hw.name, "peak_tflops": hw.peak_flops / 1e12,
             "bandwidth_gbps": hw.axis_bandwidth / 1e9}
    return {"setup": [setup], "memory per device": memory_rows, "communication per step": traffic_rows,
            "time per pass": time_rows, "compute-bound batch": _threshold_rows(shape, mesh, precision, hw)}


def _mesh_fields(mesh: Mesh) -> Record:
    return {"dp": mesh.dp, "fsdp": mesh.fsdp, "tp": mesh.tp, "pp": mesh.pp, "devices": mesh.devices,
            "fsdp_axes": mesh.fsdp_axes, "tp_axes": mesh.tp_axes}


def _threshold_rows(shape: ModelShape, mesh: Mesh, precision: PrecisionPlan, hw: Hardware) -> list[Record]:
    """The batch above which the step is compute bound: this mesh exactly, and the Book's closed forms."""
    c, w, n = hw.peak_flops, hw.axis_bandwidth, mesh.devices
    exact = compute_bound_tokens(shape, mesh, precision, hw)
    rows = [_threshold("this mesh, forward and backward, ring factors (n-1)/n",
                       "smallest B with comm <= math in each pass", exact, n)]
    if (mesh.dp > 1 or mesh.fsdp > 1) and mesh.tp == 1 and mesh.pp == 1:
        axes = mesh.fsdp_axes if mesh.fsdp > 1 else mesh.dp_axes
        per_device = dp_critical_batch(c, w, axes)
        rows.append(_threshold("Book, DP / FSDP alone", "B/X > C / (W M_X)", per_device * n, n))
    if mesh.tp > 1:
        limit = tp_max_degree(shape.d_ff, c, w, mesh.tp_axes)
        rows.append({"rule": "Book, TP alone: compute bound while Y < M_Y F W / C",
                     "formula": "Y < M_Y F W / C", "value": limit,
                     "result": f"Y = {mesh.tp} {'<' if mesh.tp < limit else '>='} {limit:.1f}"})
    if mesh.fsdp > 1 and mesh.tp > 1 and mesh.dp == 1 and mesh.pp == 1:
        mixed = mixed_critical_batch(shape.d_ff, mesh.fsdp, mesh.tp, c, w, mesh.fsdp_axes, mesh.tp_axes)
        rows.append(_threshold("Book, mixed FSDP x TP (no ring factors)",
                               "B > [F/(Y W M_X)] / [F/(N C) - 1/(X W M_Y)]", mixed, n))
        floor = mixed_min_batch_per_device(shape.d_ff, c, w, mesh.fsdp_axes, mesh.tp_axes)
        rows.append(_threshold("Book, best FSDP x TP split of N devices",
                               "B/N > 4 (C/W)^2 / (F M_X M_Y)", floor * n, n))
    return rows


def _threshold(rule: str, formula: str, tokens: float | None, devices: int) -> Record:
    if tokens is None:
        return {"rule": rule, "formula": formula, "value": None, "result": "never compute bound"}
    if tokens == 0:
        return {"rule": rule, "formula": formula, "value": 0.0,
                "result": "compute bound at any batch (the math outgrows what is communicated)"}
    return {"rule": rule, "formula": formula, "value": tokens,
            "result": f"B > {tokens:,.0f} tokens = {tokens / devices:,.1f} per device"}


def worked_example_plan(model: FFNStack) -> Sections:
    """The XXL walk-through, one section per question."""
    sections: Sections = {}
    titles = {"a": "(a) state memory and activations", "b": "(b) FSDP degree that fits a TPU v5p",
              "c": "(c) compute-bound batch for FSDP x TP"}
    for step in worked_example(model):
        sections.setdefault(titles[step.part], []).append(step.as_record())
    return sections


def _table(records: list[Record], full_digits: bool = False) -> Table:
    header = [k for k in dict.fromkeys(k for r in records for k in r) if k not in HIDDEN_IN_TABLES]

    def cell(value: Any) -> Any:
        return f"{value:.10g}" if full_digits and isinstance(value, float) else value

    return header, [[cell(r.get(k)) for k in header] for r in records]


def render_plan(sections: Sections, fmt: str, *, title: str, command: str | None = None,
                full_digits: bool = False) -> str:
    """The plan as markdown (a heading per section) or JSON (section name -> records).

    `full_digits` shows floats with 10 significant digits instead of the tables' rounding.
    """
    if fmt == "json":
        return json.dumps({"title": title, "command": command, "sections": sections}, indent=2,
                          default=str) + "\n"
    lines = [f"# {title}", ""]
    if command:
        lines += [f"Generated by `{command}`.", ""]
    for name, records in sections.items():
        lines += [f"## {name}", "", render(_table(records, full_digits), "md")]
    return "\n".join(lines)


def show(sections: Sections, fmt: str = "table", *, title: str, command: str | None = None,
         full_digits: bool = False) -> None:
    """Print the plan: one terminal table per section, or markdown / JSON text."""
    check_format(fmt)
    if fmt == "table":
        console.say(title)
        for name, records in sections.items():
            console.show_table(_table(records, full_digits), title=name)
        return
    text = render_plan(sections, fmt, title=title, command=command, full_digits=full_digits)
    console.console.print(text, markup=False, highlight=False, soft_wrap=True, emoji=False, end="")
