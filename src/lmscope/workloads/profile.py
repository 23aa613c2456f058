"""`lmscope profile`: where a step's time goes, kernel by kernel and phase by phase.

A point builds the model, runs `warmup` untimed steps and `steps` timed unprofiled steps (the
reference step time), then `steps` more under torch.profiler after one unrecorded profiler
warm-up step. From the trace it makes, per phase (forward, backward, optimizer, whole step): the
kernel summary with Nsight's columns, GPU time by category, launches and idle accounting, and for
the naive attention backend the time and FLOPs of scores, mask, softmax and output per layer
(forward only). Artifacts go to `<artifacts_dir>/<point slug>/`: trace.json.gz (Chrome/Perfetto),
report.md, kernels.csv (full names), profile.json (everything the tables are made of).

With LMSCOPE_NSYS_CAPTURE=1 in the environment the point instead runs its measured steps between
torch.cuda.profiler.start()/stop() for `nsys profile --capture-range=cudaProfilerApi`
(`nsys_capture` builds and, where nsys is installed, runs that command).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import statistics
import sys
import timeit
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from lmscope.accounting.flops import step_flops
from lmscope.config import ModelConfig
from lmscope.inputs.limits import check_steps
from lmscope.measure import nsys
from lmscope.measure.host_bound import busy_fields
from lmscope.measure.kernel_categories import CATEGORIES, short_name
from lmscope.measure.kernels import (
    PHASES,
    STEP,
    Span,
    Trace,
    load_trace,
    phase_stats,
    range_calls,
    record_trace,
    step_spans,
)
from lmscope.measure.ranges import phase
from lmscope.measure.timer import synchronize, time_steps
from lmscope.report import profile_report
from lmscope.workloads.counted_flops import count_step_flops, flop_metrics
from lmscope.workloads.model_spec import ModelPointSpec, model_slug
from lmscope.workloads.train_step import TrainStep, device_facts

ATTENTION_PARTS = ("scores", "mask", "softmax", "output")
"""The ranges attention/<part> of the naive backend, in the order they run."""
FLOP_CONVENTION = (
    "scores: 2·B·H·T²·d_head (Q Kᵀ) + B·H·T² (scale); mask: 0 (a select, no arithmetic); "
    "softmax: 5·B·H·T² (max, subtract, exp, sum, divide); output: 2·B·H·T²·d_head (P V); "
    "full T×T square as the naive backend computes it"
)


@dataclass(frozen=True, kw_only=True)
class Spec(ModelPointSpec):
    """A profile point: the model point, warm-up and measured steps, and where artifacts go."""

    warmup: int = 5
    """Untimed steps before measuring (outside the profiler)."""
    steps: int = 3
    """Unprofiled timed steps, and again profiled steps."""
    artifacts_dir: str = "runs/profile"
    """Folder that receives one sub-folder of artifacts per point."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_steps("warmup", self.warmup, 0)
        check_steps("steps", self.steps, 1)
        if not str(self.artifacts_dir).strip():
            raise ValueError("artifacts_dir is empty: give a folder for the traces and reports")


def point_slug(spec: Spec) -> str:
    """Readable, unique folder name of a point: its main fields and a hash of all of them."""
    fields = dataclasses.asdict(spec)
    fields.pop("artifacts_dir")
    digest = hashlib.sha1(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:8]
    compiled = "" if not spec.compile else "-compile" if spec.compile is True else f"-compile-{spec.compile}"
    fast = "-fast" if spec.fast else ""
    return (f"{model_slug(spec.size)}-ctx{spec.context_length}-b{spec.batch_size}-{spec.mode}"
            f"-{spec.precision}-{spec.attention}{fast}{compiled}-{digest}")


def point_folder(spec: Spec) -> Path:
    """Where the artifacts of this point go."""
    return Path(spec.artifacts_dir) / point_slug(spec)


def attention_flops(config: ModelConfig, batch_size: int, seq_len: int) -> dict[str, float]:
    """Forward FLOPs of one layer's naive attention, per part (see FLOP_CONVENTION)."""
    squares = float(batch_size * config.num_heads * seq_len * seq_len)
    matmul = 2.0 * squares * config.head_dim
    return {"scores": matmul + squares, "mask": 0.0, "softmax": 5.0 * squares, "output": matmul}


def attention_breakdown(trace: Trace, steps: list[Span], spec: Spec) -> dict[str, Any] | None:
    """Per part and per layer: kernel time, host time, launches, FLOPs and TFLOP/s (forward only)."""
    forwards = [span for step in steps for span in trace.spans_named("forward", within=step)]
    calls = range_calls(trace, [f"attention/{p}" for p in ATTENTION_PARTS], forwards)
    config = spec.model_config()
    if not calls or config is None:
        return None
    flops = attention_flops(config, spec.batch_size, spec.context_length)
    by_part = {p: [c for c in calls if c.name == f"attention/{p}"] for p in ATTENTION_PARTS}
    layers = max(len(v) for v in by_part.values())
    total_gpu = sum(c.gpu_ns for c in calls) / layers
    parts = []
    for part, part_calls in by_part.items():
        gpu = [c.gpu_ns for c in part_calls] or [0.0]
        mean_gpu = statistics.fmean(gpu)
        parts.append({
            "part": part,
            "gpu_ms_per_layer": mean_gpu / 1e6,
            "gpu_ms_min": min(gpu) / 1e6,
            "gpu_ms_max": max(gpu) / 1e6,
            "cpu_ms_per_layer": statistics.fmean([c.cpu_ns for c in part_calls] or [0.0]) / 1e6,
            "launches_per_call": statistics.fmean([c.launches for c in part_calls] or [0.0]),
            "flops_per_layer": flops[part],
            "tflops": flops[part] / mean_gpu / 1e3 if mean_gpu and flops[part] else None,
            "time_share": mean_gpu / total_gpu if total_gpu else 0.0,
            "flop_share": flops[part] / sum(flops.values()),
        })
    scores = parts[0]
    for row in parts:
        row["time_vs_scores"] = (row["gpu_ms_per_layer"] / scores["gpu_ms_per_layer"]
                                 if scores["gpu_ms_per_layer"] else None)
        row["flops_vs_scores"] = row["flops_per_layer"] / scores["flops_per_layer"]
    per_layer = [
        {"layer": layer, **{f"{p}_ms": next((c.gpu_ns / 1e6 for c in by_part[p] if c.index == layer), 0.0)
                            for p in ATTENTION_PARTS}}
        for layer in range(layers)
    ]
    for row in per_layer:
        row["total_ms"] = sum(row[f"{p}_ms"] for p in ATTENTION_PARTS)
    return {
        "scope": "forward pass only: the attention/* ranges inside each measured step's forward range; "
                 "a kernel counts for a range when its launch happened inside the range (median over steps)",
        "layers": layers,
        "expected_layers": config.num_layers,
        "flop_convention": FLOP_CONVENTION,
        "parts": parts,
        "per_layer": per_layer,
    }


def run_point(point: dict[str, Any]) -> dict[str, Any]:
    """Time unprofiled steps, profile as many more, write the artifacts; return the flat metrics."""
    spec = Spec(**point)
    if os.environ.get(nsys.CAPTURE_ENV) == "1":
        return _capture_steps(spec)
    step = TrainStep(spec)
    device = step.device
    counted = count_step_flops(step)  # one extra eager step, before warm-up and timing
    compile_s = step.compile_warmup()
    times = time_steps(step, warmup=spec.warmup, steps=spec.steps, device=device)
    folder = point_folder(spec)
    trace_path = folder / "trace.json.gz"
    profiled = record_trace(step, steps=spec.steps, device=device, path=trace_path)
    trace = load_trace(trace_path)
    if device.type == "cuda" and not trace.on_gpu:
        raise RuntimeError("the trace of this CUDA run holds no GPU kernels: torch.profiler could not "
                           "use CUPTI (is another profiler such as nsys attached?)")
    steps = step_spans(trace)
    if len(steps) != spec.steps:
        raise RuntimeError(f"the trace holds {len(steps)} step ranges, expected {spec.steps}")
    phases = {name: stats.as_dict() for name in (*PHASES, STEP)
              if (stats := phase_stats(trace, name, steps)) is not None}
    facts = device_facts(device)
    step_ms, profiled_ms = statistics.median(times), statistics.median(profiled)
    profile = {
        "title": f"lmscope profile {point_slug(spec)}",
        "point": dataclasses.asdict(spec),
        **facts,
        "on_gpu": trace.on_gpu,
        "kernels_are": ("CUDA kernels, memcpy and memset" if trace.on_gpu else
                        "aten CPU ops by self time (no CUDA activity on this device)"),
        "steps": spec.steps,
        "timing": {
            "step_ms": step_ms, "profiled_step_ms": profiled_ms,
            "overhead_pct": 100.0 * (profiled_ms - step_ms) / step_ms,
            "times_ms": times, "profiled_times_ms": profiled,
        },
        "phases": phases,
        "attention": attention_breakdown(trace, steps, spec) if spec.attention == "naive" else None,
        "violations": [v for stats in phases.values() for v in stats["violations"]],
        "artifacts": {
            "trace": str(trace_path), "report": str(folder / "report.md"),
            "kernels_csv": str(folder / "kernels.csv"), "profile_json": str(folder / "profile.json"),
        },
    }
    _write_artifacts(profile)
    phase_wall_ms = {name: stats["wall_ms_per_step"] for name, stats in phases.items() if name in PHASES}
    config = spec.model_config()
    analytic = (step_flops(config, spec.batch_size, spec.context_length, spec.mode)
                if config is not None else None)
    flops = flop_metrics(counted, step_ms, phase_wall_ms, device_name=facts.get("device_name"),
                         precision=spec.precision, analytic_flops=analytic)
    return {**facts, **step.model_facts(), **summary_metrics(profile), "compile_s": compile_s, **flops}


def _write_artifacts(profile: dict[str, Any]) -> None:
    paths = {key: Path(value) for key, value in profile["artifacts"].items()}
    paths["profile_json"].write_text(json.dumps(profile, indent=1, default=str))
    paths["report"].write_text(profile_report.markdown_report(profile))
    paths["kernels_csv"].write_text(profile_report.kernels_csv(profile))


def summary_metrics(profile: dict[str, Any]) -> dict[str, Any]:
    """The flat row of a point: timing, categories, launches, idle, top kernels, artifacts."""
    timing, phases = profile["timing"], profile["phases"]
    whole = phases[STEP]
    device = "gpu" if profile["on_gpu"] else "cpu"  # what was busy: CUDA kernels or CPU operators
    metrics: dict[str, Any] = {
        "step_ms": timing["step_ms"],
        "profiled_step_ms": timing["profiled_step_ms"],
        "overhead_pct": timing["overhead_pct"],
        "times_ms": [round(t, 4) for t in timing["times_ms"]],
        "profiled_times_ms": [round(t, 4) for t in timing["profiled_times_ms"]],
        "kernels_are": "cuda" if profile["on_gpu"] else "cpu_ops",
        "launches_per_step": whole["launches_per_step"],
        f"{device}_busy_frac": whole["busy_frac"],
        f"{device}_busy_ms": whole["busy_ms_per_step"],
        "kernel_ms_per_step": whole["kernel_ms_per_step"],
        "idle_ms_per_step": whole["idle_ms_per_step"],
        "max_gap_ms": whole["gaps"][0]["gap_ns"] / 1e6 if whole["gaps"] else 0.0,
        **{f"{category}_frac": whole["categories"][category] for category in CATEGORIES},
    }
    if profile["on_gpu"]:  # busy share and host-bound flag against the unprofiled step time
        metrics.update(busy_fields(whole["busy_ms_per_step"], timing["step_ms"]))
    for name in PHASES:
        if name in phases:
            stats = phases[name]
            metrics[f"{name}_wall_ms"] = stats["wall_ms_per_step"]
            metrics[f"{name}_busy_ms"] = stats["busy_ms_per_step"]
            metrics[f"{name}_launches_per_step"] = stats["launches_per_step"]
            metrics[f"{name}_matmul_frac"] = stats["categories"]["matmul"]
    steps = profile["steps"]
    top = whole["kernels"][:5]
    metrics["top_kernel"] = short_name(top[0]["name"], 40) if top else None
    metrics["top_kernels"] = [
        {"name": short_name(k["name"]), "ms_per_step": k["total_ns"] / 1e6 / steps,
         "pct": round(k["time_pct"], 2), "per_step": k["instances"] / steps}
        for k in top
    ]
    attention = profile.get("attention")
    if attention:
        for part in attention["parts"]:
            metrics[f"attn_{part['part']}_gpu_ms"] = part["gpu_ms_per_layer"]
            metrics[f"attn_{part['part']}_tflops"] = part["tflops"]
        softmax = attention["parts"][ATTENTION_PARTS.index("softmax")]
        metrics["softmax_time_vs_scores"] = softmax["time_vs_scores"]
        metrics["softmax_flops_vs_scores"] = softmax["flops_vs_scores"]
    metrics["invariant_ok"] = not profile["violations"]
    metrics["invariant_violations"] = profile["violations"][:3]
    artifacts = profile["artifacts"]
    metrics.update({"trace_path": artifacts["trace"], "report_path": artifacts["report"],
                    "kernels_csv_path": artifacts["kernels_csv"],
                    "profile_json_path": artifacts["profile_json"]})
    return metrics


def _capture_steps(spec: Spec) -> dict[str, Any]:
    """The nsys capture run: warm-up outside, measured steps between cudaProfilerStart/Stop."""
    step = TrainStep(spec)
    device = step.device
    cuda = device.type == "cuda"
    step.compile_warmup()
    for _ in range(spec.warmup):
        step()
        synchronize(device)
    if cuda:
        torch.cuda.profiler.start()
    times = []
    for _ in range(spec.steps):
        synchronize(device)
        begin = timeit.default_timer()
        with phase(STEP):
            step()
            synchronize(device)
        times.append((timeit.default_timer() - begin) * 1e3)
    if cuda:
        torch.cuda.profiler.stop()
    return {**device_facts(device), "nsys_capture": True, "step_ms": statistics.median(times),
            "times_ms": [round(t, 4) for t in times]}


def nsys_capture(spec: Spec, *, timeout_s: float = 900.0) -> dict[str, Any]:
    """The `nsys profile` command of a point; where nsys is on the PATH, run it and ingest its stats."""
    folder = point_folder(spec) / "nsys"
    folder.mkdir(parents=True, exist_ok=True)
    spec_path, result_path, base = folder / "spec.json", folder / "result.json", folder / "capture"
    spec_path.write_text(json.dumps(dataclasses.asdict(spec)))
    program = [sys.executable, "-m", "lmscope.workloads.profile", str(spec_path), str(result_path)]
    env = {nsys.CAPTURE_ENV: "1"}
    report = Path(f"{base}.nsys-rep")
    capture = {
        "title": f"lmscope profile --nsys {point_slug(spec)}",
        "point": dataclasses.asdict(spec),
        "steps": spec.steps,
        "command": nsys.shell_line(nsys.profile_command(program, base), env),
        "stats_command": nsys.shell_line(nsys.stats_command(report, base)),
        "ran": False,
    }
    if shutil.which("nsys") is None:
        capture["note"] = "nsys is not on the PATH here: run the commands above where Nsight Systems is"
        return capture
    try:
        nsys.run_command(nsys.profile_command(program, base), env, timeout_s)
        nsys.run_command(nsys.stats_command(report, base), None, timeout_s)
        kernels, ranges = nsys.read_stats(base)
    except (RuntimeError, FileNotFoundError, ValueError) as error:
        capture["note"] = f"nsys failed: {error}"
        return capture
    result = json.loads(result_path.read_text()) if result_path.exists() else {}
    capture.update(
        ran=True, step_ms=result.get("step_ms"),
        kernels=[dataclasses.asdict(k) for k in kernels], ranges=[dataclasses.asdict(r) for r in ranges],
        report_path=str(folder / "nsys_report.md"),
    )
    Path(capture["report_path"]).write_text(profile_report.nsys_markdown(capture))
    return capture


def main(argv: list[str]) -> int:
    """`python -m lmscope.workloads.profile SPEC_JSON RESULT_JSON`: one point, as nsys launches it."""
    spec_path, result_path = argv
    metrics = run_point(json.loads(Path(spec_path).read_text()))
    Path(result_path).write_text(json.dumps(metrics, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
