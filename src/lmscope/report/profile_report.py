"""Tables of a profile (from its profile.json dict): markdown report, kernel CSV, terminal view.

Kernel tables carry Nsight's CUDA GPU Kernel Summary columns (Time %, Total, Instances, Avg, Med,
Min, Max, StdDev, Name) plus instances per step and the category; names are shortened in the
tables and kept in full in kernels.csv and in the report's list of full names.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.markup import escape

from lmscope.measure.kernel_categories import CATEGORIES, CATEGORY_LABELS, short_name
from lmscope.report import console
from lmscope.report.tables import Table, to_markdown

PHASE_ORDER = ("forward", "backward", "optimizer", "step")
KERNEL_HEADER = ["Time %", "Total", "Instances", "Per step", "Avg", "Med", "Min", "Max", "StdDev",
                 "Category", "Name"]


def fmt_ns(ns: float | None) -> str:
    """A duration the way Nsight shows it: ns, μs or ms with three decimals."""
    if ns is None:
        return "-"
    if abs(ns) >= 1e6:
        return f"{ns / 1e6:.3f} ms"
    if abs(ns) >= 1e3:
        return f"{ns / 1e3:.3f} μs"
    return f"{ns:.0f} ns"


def _pct(fraction: float | None) -> str:
    return "-" if fraction is None else f"{100 * fraction:.1f}%"


def _num(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}g}" if abs(value) < 1000 else f"{value:,.0f}"


def kernel_table(kernels: Sequence[dict[str, Any]], steps: int, top: int | None = None) -> Table:
    """Kernel summary rows (largest total first), with short names."""
    rows = [
        [f"{k['time_pct']:.1f}", fmt_ns(k["total_ns"]), k["instances"], f"{k['instances'] / steps:g}",
         fmt_ns(k["avg_ns"]), fmt_ns(k["med_ns"]), fmt_ns(k["min_ns"]), fmt_ns(k["max_ns"]),
         fmt_ns(k["stddev_ns"]), CATEGORY_LABELS.get(k["category"], k["category"]), short_name(k["name"])]
        for k in kernels[:top]
    ]
    return KERNEL_HEADER, rows


def _phases(profile: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    return [(name, profile["phases"][name]) for name in PHASE_ORDER if name in profile["phases"]]


def category_table(profile: dict[str, Any]) -> Table:
    """Share of GPU time per category, one column pair per phase (forward beside the whole step)."""
    phases = _phases(profile)
    header = ["category"] + [h for name, _ in phases for h in (f"{name} %", f"{name} ms/step")]
    rows = [
        [CATEGORY_LABELS.get(c, c)]
        + [v for _, s in phases for v in (_pct(s["categories"][c]), _num(s["category_ms_per_step"][c]))]
        for c in CATEGORIES
    ]
    return header, rows


def launch_table(profile: dict[str, Any]) -> Table:
    """Launches, busy and wall time, idle time and the largest gap per phase, per step."""
    header = ["phase", "launches/step", "wall ms/step", "busy ms/step", "kernel ms/step", "busy %",
              "idle ms/step", "largest gap"]
    rows = [
        [name, f"{s['launches_per_step']:g}", _num(s["wall_ms_per_step"]), _num(s["busy_ms_per_step"]),
         _num(s["kernel_ms_per_step"]), _pct(s["busy_frac"]), _num(s["idle_ms_per_step"]),
         fmt_ns(s["gaps"][0]["gap_ns"]) if s["gaps"] else "-"]
        for name, s in _phases(profile)
    ]
    return header, rows


def gap_table(stats: dict[str, Any]) -> Table:
    """The largest idle gaps of a phase, with the kernels around them."""
    header = ["gap", "step", "at (from step start)", "after kernel", "before kernel"]
    rows = [
        [fmt_ns(g["gap_ns"]), g["step"], fmt_ns(g["offset_ns"]),
         short_name(g["before"]) if g["before"] else "(phase start)",
         short_name(g["after"]) if g["after"] else "(phase end)"]
        for g in stats["gaps"]
    ]
    return header, rows


def device_word(profile: dict[str, Any]) -> str:
    """'GPU' for a profile of CUDA kernels, 'CPU' for one of CPU operators."""
    return "GPU" if profile.get("on_gpu") else "CPU"


def attention_table(attention: dict[str, Any]) -> Table:
    """Per part of naive attention: time, FLOPs, TFLOP/s, and both as ratios to the scores matmul."""
    header = ["part", "device time/layer", "min..max over layers", "host time/layer", "launches/call",
              "GFLOP/layer", "TFLOP/s", "time share", "FLOP share", "time / scores", "FLOPs / scores"]
    rows = [
        [p["part"], fmt_ns(p["gpu_ms_per_layer"] * 1e6),
         f"{fmt_ns(p['gpu_ms_min'] * 1e6)} .. {fmt_ns(p['gpu_ms_max'] * 1e6)}",
         fmt_ns(p["cpu_ms_per_layer"] * 1e6), f"{p['launches_per_call']:g}",
         _num(p["flops_per_layer"] / 1e9), _num(p["tflops"]), _pct(p["time_share"]), _pct(p["flop_share"]),
         _num(p["time_vs_scores"]), _num(p["flops_vs_scores"])]
        for p in attention["parts"]
    ]
    return header, rows


def attention_layer_table(attention: dict[str, Any]) -> Table:
    """GPU time of each attention part in each layer."""
    header = ["layer", "scores", "mask", "softmax", "output", "total"]
    rows = [[r["layer"]] + [fmt_ns(r[f"{p.lower()}_ms"] * 1e6) for p in header[1:]]
            for r in attention["per_layer"]]
    return header, rows


def _md(table: Table) -> str:
    header, rows = table
    safe = [[_md_cell(v) for v in row] for row in rows]
    return to_markdown(([_md_cell(h) for h in header], safe))


def _md_cell(value: Any) -> Any:
    if not isinstance(value, str):
        return value
    return value.replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")


def timing_lines(profile: dict[str, Any]) -> list[str]:
    """Step time unprofiled and profiled, the overhead, and what counts as a kernel."""
    t = profile["timing"]
    return [
        f"- device: {profile.get('device_name') or profile.get('device_type')}; kernels are "
        f"{profile['kernels_are']}",
        f"- step time unprofiled (median of {len(t['times_ms'])}): {t['step_ms']:.3f} ms; profiled "
        f"(median of {len(t['profiled_times_ms'])}): {t['profiled_step_ms']:.3f} ms; "
        f"profiler overhead {t['overhead_pct']:+.1f}%",
    ]


def _invariant_lines(profile: dict[str, Any]) -> list[str]:
    if not profile["violations"]:
        return ["- invariants hold: in every step and phase, kernel time <= wall time"]
    return ["- **INVARIANT VIOLATED** (kernel time above wall time; timestamps or attribution are off):"] + [
        f"  - {v}" for v in profile["violations"]]


def markdown_report(profile: dict[str, Any], top: int = 25) -> str:
    """The whole profile of a point as a markdown document."""
    steps = profile["steps"]
    point = profile["point"]
    out = [f"# {profile['title']}", "",
           f"`{json.dumps({k: v for k, v in point.items() if v is not None and k != 'artifacts_dir'})}`", "",
           *timing_lines(profile), *_invariant_lines(profile), "",
           f"Trace (open in ui.perfetto.dev or chrome://tracing): `{profile['artifacts']['trace']}`; "
           f"full kernel names: `{profile['artifacts']['kernels_csv']}`.", "",
           "## Launches and idle time per step", "",
           "Wall time of a phase runs from when the device could start it (its range began and "
           "earlier work drained) to the end of its range or of its last kernel; busy time is the "
           "union of its kernels; idle = wall - busy (CPU dispatch overhead made visible).", "",
           _md(launch_table(profile)),
           f"## {device_word(profile)} time by category", "", _md(category_table(profile))]
    for name, stats in _phases(profile):
        out += [f"## Kernels: {name} ({steps} steps, top {top} of {len(stats['kernels'])})", "",
                _md(kernel_table(stats["kernels"], steps, top)),
                f"### Largest idle gaps: {name}", "", _md(gap_table(stats))]
    out += ["## Attention breakdown (naive backend)", ""]
    attention = profile.get("attention")
    if attention:
        out += [f"Scope: {attention['scope']}.", "", f"FLOPs: {attention['flop_convention']}.", "",
                _md(attention_table(attention)), f"### Per layer ({device_word(profile)} time)", "",
                _md(attention_layer_table(attention))]
    else:
        out += ["Not available: it needs `--attention naive`, whose ranges attention/scores, "
                "attention/mask, attention/softmax and attention/output it reads.", ""]
    whole = profile["phases"].get("step", {}).get("kernels", [])[:top]
    out += ["## Full names of the top kernels of a step", ""]
    out += [f"{i}. `{k['name']}`" for i, k in enumerate(whole, 1)]
    return "\n".join(out) + "\n"


def kernels_csv(profile: dict[str, Any]) -> str:
    """Every kernel of every phase, with full names and times in μs."""
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(["phase", "rank", "time_pct", "total_ms", "instances", "instances_per_step", "avg_us",
                     "med_us", "min_us", "max_us", "stddev_us", "category", "short_name", "name"])
    steps = profile["steps"]
    for name, stats in _phases(profile):
        for rank, k in enumerate(stats["kernels"], 1):
            writer.writerow([name, rank, round(k["time_pct"], 4), k["total_ns"] / 1e6, k["instances"],
                             k["instances"] / steps, k["avg_ns"] / 1e3, k["med_ns"] / 1e3, k["min_ns"] / 1e3,
                             k["max_ns"] / 1e3, k["stddev_ns"] / 1e3, k["category"], short_name(k["name"]),
                             k["name"]])
    return buffer.getvalue()


def _show(table: Table, title: str) -> None:
    console.show_table(table, title=title)  # it escapes markup in every cell


def show_profile(profile: dict[str, Any], top: int = 12) -> None:
    """The profile of one point on the terminal."""
    for line in [*timing_lines(profile), *_invariant_lines(profile)]:
        console.say(escape(line))
    _show(launch_table(profile), "launches and idle time per step")
    _show(category_table(profile), f"{device_word(profile)} time by category")
    for name, stats in _phases(profile):
        _show(kernel_table(stats["kernels"], profile["steps"], top), f"kernels: {name} (top {top})")
    step = profile["phases"].get("step")
    if step:
        _show(gap_table(step), "largest idle gaps in a step")
    if profile.get("attention"):
        _show(attention_table(profile["attention"]), "attention breakdown (naive, forward only)")


def show_point_reports(records: Sequence[dict[str, Any]]) -> None:
    """After a sweep: the full tables of a single point, and where each point's report lies."""
    done = [r for r in records if r.get("status") == "ok" and r.get("profile_json_path")]
    if len(done) == 1 and Path(done[0]["profile_json_path"]).exists():
        show_profile(json.loads(Path(done[0]["profile_json_path"]).read_text()))
    for record in done:
        console.say(f"report: {record['report_path']}  trace: {record['trace_path']}")


def nsys_markdown(capture: dict[str, Any], top: int = 25) -> str:
    """The kernel and NVTX summaries that `nsys stats` gave for a capture, as markdown."""
    steps = capture["steps"]
    kernels = capture["kernels"]
    totals = dict.fromkeys(CATEGORIES, 0.0)
    for k in kernels:
        totals[k["category"]] += k["total_ns"]
    grand = sum(totals.values())
    categories = (["category", "%", "ms/step"],
                  [[CATEGORY_LABELS.get(c, c), _pct(v / grand if grand else 0.0), _num(v / 1e6 / steps)]
                   for c, v in totals.items()])
    ranges = (["range", "instances", "per step", "total", "avg", "med", "min", "max", "stddev"],
              [[r["range"], r["instances"], f"{r['instances'] / steps:g}", fmt_ns(r["total_ns"]),
                fmt_ns(r["avg_ns"]), fmt_ns(r["med_ns"]), fmt_ns(r["min_ns"]), fmt_ns(r["max_ns"]),
                fmt_ns(r["stddev_ns"])] for r in capture["ranges"]])
    step_ms = capture.get("step_ms")
    return "\n".join([
        f"# {capture['title']}", "", f"- capture: `{capture['command']}`",
        f"- stats: `{capture['stats_command']}`",
        f"- {steps} measured steps inside the capture range (warm-up outside)"
        + (f"; step time under nsys {step_ms:.3f} ms" if step_ms else ""), "",
        "## CUDA GPU kernel summary (whole capture)", "", _md(kernel_table(kernels, steps, top)),
        "## GPU time by category", "", _md(categories),
        "## NVTX ranges", "", _md(ranges),
    ]) + "\n"


def show_nsys(capture: dict[str, Any], top: int = 12) -> None:
    """The nsys command of a point, and its tables when it ran."""
    console.say(escape(f"nsys capture of {capture['title']}:"))
    console.say(escape(f"  {capture['command']}"))
    console.say(escape(f"  {capture['stats_command']}"))
    if not capture["ran"]:
        console.say(escape(f"  ({capture['note']})"))
        return
    _show(kernel_table(capture["kernels"], capture["steps"], top), "nsys: CUDA GPU kernel summary")
    console.say(escape(f"nsys report: {capture['report_path']}"))
