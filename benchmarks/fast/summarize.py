"""Markdown summary of benchmarks/fast/run_gpu.sh: step times per variant, ratios, the targets.

Reads OUT/bench.jsonl and OUT/long.jsonl written by `lmscope bench`, and OUT/copy_bandwidth.jsonl
(the GPU's copy bandwidth, for the optimizer's memory floor): run on a GPU without that file, the
script measures the bandwidth first and writes its row there, so the summary is a function of the
rows in OUT alone (`benchmarks/claims.py --check` regenerates it from them).
Usage: PYTHONPATH=src python3 benchmarks/fast/summarize.py OUT > OUT/summary.md
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from lmscope.accounting.flops import mfu, step_flops
from lmscope.config import preset
from lmscope.measure.host_bound import HOST_BOUND_BELOW
from lmscope.records.provenance import stamp
from lmscope.records.results import append_record, read_records
from lmscope.records.stats import RatioInterval
from lmscope.report.rounds import pool_rounds, ratio_between, rounds_of
from lmscope.running.runner import spec_fields

VARIANTS = ("naive", "sdpa", "compile", "hf", "fast-eager", "fast", "fast-inbwd")
COMPILE_MODES = ("", "-max-autotune-no-cudagraphs", "-reduce-overhead")
"""torch.compile's default mode, then the two others (`--compile <mode>`), as variant suffixes."""
STRONGEST = ("sdpa", *(f"compile{mode}{scope}" for scope in ("", "-blocks") for mode in COMPILE_MODES),
             "hf", *(f"hf-compile{mode}-blocks" for mode in COMPILE_MODES), "fast", "fast-inbwd")
"""The rows of the peers-at-their-strongest table: eager, torch.compile in each mode and scope, HF
eager and compiled (each decoder layer, every mode), the fast step."""
PEERS = ("naive", "sdpa", "compile", "hf")
"""Other models: compared with the faster fast row."""
SIZES = ("small", "medium", "large", "xl", "2.7B")
ADAMW_BYTES_PER_PARAM = 28  # fused AdamW reads param, grad, m, v (16 B) and writes param, m, v (12 B)
H100_BF16_PEAK = 989.0


def variant(record: dict[str, Any]) -> str:
    """Which row of the comparison a bench record is."""
    if record.get("peer") == "hf":
        return "hf" + (f"-{compiled(record)}" if record.get("compile") else "")
    if record.get("fast"):
        if record.get("compile"):  # refused since; rows of the first run hold one (an error)
            return "fast+compile"
        graphed = record.get("cuda_graph_used")
        if graphed is None:  # a failed point: what it asked for (no field: before --cuda-graph)
            graphed = record.get("cuda_graph", "off") != "off"
        attention = "" if record.get("attention") == "flash" else f"-{record.get('attention')}"
        in_backward = "-inbwd" if record.get("optimizer_in_backward") else ""
        return ("fast" if graphed else "fast-eager") + attention + in_backward
    if record.get("compile"):
        return compiled(record)
    return str(record.get("attention"))


def compiled(record: dict[str, Any]) -> str:
    """'compile[-<mode>][-blocks]': a compiled record's mode (none for the default) and scope."""
    mode = record["compile"]
    scope = "-blocks" if record.get("compile_scope") == "blocks" else ""
    return ("compile" if mode is True else f"compile-{mode}") + scope


def row_key(record: dict[str, Any]) -> tuple:
    """(size, context, batch, variant): where a record goes in the tables."""
    return record["size"], record["context_length"], record["batch_size"], variant(record)


def latest(path: Path) -> dict[tuple, dict[str, Any]]:
    """row_key -> the last record written for it (the rounds of `bench --rounds` pooled)."""
    if not path.exists():
        return {}
    return {row_key(r): r for r in pool_rounds(read_records(path), spec_fields("bench"))}


def cell(record: dict[str, Any] | None, key: str = "median_ms", fmt: str = "{:.1f}") -> str:
    if record is None:
        return "-"
    if record.get("status") != "ok":
        return str(record.get("status", "?")).upper()
    value = record.get(key)
    return "-" if value is None else fmt.format(value)


def ratio(slow: dict[str, Any] | None, fast: dict[str, Any] | None) -> float | None:
    if not slow or not fast or slow.get("status") != "ok" or fast.get("status") != "ok":
        return None
    return slow["median_ms"] / fast["median_ms"]


def interval(slow: dict[str, Any] | None, fast: dict[str, Any] | None) -> RatioInterval | None:
    """slow / fast of the median step times with its 95 % bootstrap interval, resampled by round
    where the rows pool rounds (None without times)."""
    if ratio(slow, fast) is None:
        return None
    return ratio_between(slow, fast)


def ratio_text(slow: dict[str, Any] | None, fast: dict[str, Any] | None) -> str:
    """'<ratio>x [<low>, <high>]' ('~' when the interval holds 1), '-' when either row is missing."""
    bounded = interval(slow, fast)
    if bounded is not None:
        return bounded.as_text()
    value = ratio(slow, fast)
    return "-" if value is None else f"{value:.2f}x (no interval)"


def best_fast(got: dict[str, dict[str, Any] | None],
              variants: tuple[str, ...] = ("fast", "fast-inbwd")) -> dict[str, Any] | None:
    """The fastest ok row of `variants` (by default fast, with the optimizer as its own phase, and
    fast-inbwd, with it inside the backward)."""
    ok = [got.get(v) for v in variants if (got.get(v) or {}).get("status") == "ok"]
    return min(ok, key=lambda r: r["median_ms"]) if ok else got.get(variants[0])


def _model_flops(record: dict[str, Any], mode: str) -> float:
    """Model FLOPs of the record's point in `mode` (lmscope.accounting.flops: causal attention as
    half the square, the one MFU convention)."""
    config = preset(record["size"], context_length=record["context_length"])
    return step_flops(config, record["batch_size"], record["context_length"], mode)


def step_mfu(record: dict[str, Any] | None) -> float | None:
    """Whole-step MFU, the headline: the train step's model FLOPs over its median time, vs the
    bf16 peak (recomputed from the row, so rows of every lmscope version share the convention)."""
    if not record or record.get("status") != "ok" or not record.get("median_ms"):
        return None
    return mfu(_model_flops(record, "train-step"), record["median_ms"],
               record.get("peak_tflops") or H100_BF16_PEAK)


def fwd_bwd_mfu(record: dict[str, Any] | None) -> float | None:
    """fwd+bwd MFU: model FLOPs of forward+backward over the forward and backward phases' time
    only (the optimizer left out), vs the bf16 peak. Always labelled as such."""
    if not record or record.get("status") != "ok" or record.get("forward_ms") is None:
        return None
    return mfu(_model_flops(record, "forward-backward"), record["forward_ms"] + record["backward_ms"],
               record.get("peak_tflops") or H100_BF16_PEAK)


def percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


BANDWIDTH_ROWS = "copy_bandwidth.jsonl"


def copy_bandwidth_gbps() -> float | None:
    """Device-to-device copy bandwidth (read + write bytes / time) of a 2 GiB buffer, or None."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    src = torch.empty(2**29, dtype=torch.float32, device="cuda")
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        dst.copy_(src)
    end.record()
    torch.cuda.synchronize()
    seconds = start.elapsed_time(end) / 1e3 / 10
    return 2 * src.numel() * 4 / seconds / 1e9


def record_bandwidth(out: Path) -> None:
    """Measure the copy bandwidth and write its row to OUT/copy_bandwidth.jsonl, once per run
    folder and only on a GPU."""
    path = out / BANDWIDTH_ROWS
    if path.exists():
        return
    bandwidth = copy_bandwidth_gbps()
    if bandwidth is not None:
        append_record(path, stamp({"workload": "copy_bandwidth", "copy_bandwidth_gbps": bandwidth,
                                   "status": "ok"}, "cuda:0"))


def recorded_bandwidth(out: Path) -> float | None:
    """The copy bandwidth of the run's row (the last one), None where the run has none."""
    path = out / BANDWIDTH_ROWS
    rows = [r for r in read_records(path) if r.get("status") == "ok"] if path.exists() else []
    return rows[-1]["copy_bandwidth_gbps"] if rows else None


def main_table(rows: dict[tuple, dict[str, Any]]) -> list[str]:
    lines = [
        "## Train step, bf16, batch 4, context 512 (median ms; speedup = other / best fast, with its "
        "95 % bootstrap interval from the per-step times; `~`: the interval holds 1)\n",
        "best fast: the faster of `fast` (optimizer as its own phase) and `fast, opt. in bwd` "
        "(`--optimizer-in-backward on`: each weight updated during the backward on a side stream). "
        "The fwd+bwd MFU, the optimizer time and `vs fast, no graphs` are those of `fast`, whose "
        "phases are separate.\n",
        "| size | naive | sdpa | compile | hf | fast, no graphs | fast | fast, opt. in bwd | vs naive "
        "| vs sdpa | vs compile | vs hf | vs fast, no graphs | best fast MFU (whole step) | fast fwd+bwd MFU "
        "| fast optimizer ms | fast peak GiB |",
        "|---|" + "---|" * 16,
    ]
    for size in SIZES:
        got = {v: rows.get((size, 512, 4, v)) for v in VARIANTS}
        if not any(got.values()):
            continue
        fast, best = got["fast"], best_fast(got)
        # what CUDA graphs buy: the same model and optimizer, launched eagerly
        speedups = [ratio_text(got[v], best) for v in PEERS] + [ratio_text(got["fast-eager"], fast)]
        lines.append(
            f"| {size} | " + " | ".join(cell(got[v]) for v in VARIANTS) + " | "
            + " | ".join(speedups) + " | "
            + f"{percent(step_mfu(best))} | {percent(fwd_bwd_mfu(fast))} | "
            + f"{cell(fast, 'optimizer_ms')} | {cell(fast, 'peak_allocated_gib')} |"
        )
    return lines


def strongest_peers(rows: dict[tuple, dict[str, Any]]) -> list[str]:
    """Per size at context 512: eager, torch.compile in each mode and scope, HF and the fast step,
    with compile time, the ratio to the best fast row, whole-step MFU and the host-bound flag."""
    lines = ["\n## Peers at their strongest (train step, bf16, batch 4, context 512)\n",
             "compile: torch.compile of the eager model (sdpa) in its default mode, "
             "`max-autotune-no-cudagraphs` or `reduce-overhead` (CUDA graphs); hf-compile: the same of "
             "HF's Llama; `-blocks`: each block "
             "compiled (`--compile-scope blocks`), else the whole model. compile s: the first compiled "
             "steps, outside the timed ones, in the round that took longest (a process after the "
             "first on a machine may load the compiled code from torch.compile's disk caches). "
             "vs best fast: this row's median over the best fast "
             "row's, with its 95 % interval. GPU busy: kernel time over the step; host-bound: below "
             f"{100 * HOST_BOUND_BELOW:.0f} % of the step (lmscope.measure.host_bound). n: rounds x timed "
             "steps per round.\n",
             "| size | variant | median ms | compile s | vs best fast | MFU (whole step) | GPU busy "
             "| host-bound | n |",
             "|---|---|---|---|---|---|---|---|---|"]
    found = False
    for size in SIZES:
        got = {v: rows.get((size, 512, 4, v)) for v in STRONGEST}
        if not any(got.get(v) for v in STRONGEST if v.startswith("compile-")):
            continue  # only runs that measured a compile mode beside the default
        found = True
        best = best_fast(got)
        for name in STRONGEST:
            record = got[name]
            if record is None:
                continue
            bound = record.get("host_bound")
            lines.append(f"| {size} | {name} | {cell(record)} | {cell(record, 'compile_s')} | "
                         f"{ratio_text(record, best) if record is not best else '-'} | "
                         f"{percent(step_mfu(record))} | {cell(record, 'gpu_busy_share', '{:.0%}')} | "
                         f"{'-' if bound is None else 'yes' if bound else 'no'} | {counts(record)} |")
    return lines if found else []


def counts(record: dict[str, Any]) -> str:
    """'R x S': the rounds pooled in a row and the timed steps of each ('-' without times)."""
    rounds = rounds_of(record) if record.get("times_ms") else []
    if not rounds:
        return "-"
    sizes = sorted({len(r) for r in rounds})
    return f"{len(rounds)} x {sizes[0]}" if len(sizes) == 1 else f"{len(rounds)} x {sizes[0]}-{sizes[-1]}"


def fastest_compile(rows: dict[tuple, dict[str, Any]], size: str) -> dict[str, Any] | None:
    """The fastest ok torch.compile row of `size` at context 512, batch 4, over every mode and scope."""
    compiled = [r for v in STRONGEST if v.startswith("compile")
                if (r := rows.get((size, 512, 4, v))) and r.get("status") == "ok"]
    return min(compiled, key=lambda r: r["median_ms"]) if compiled else None


def targets(rows: dict[tuple, dict[str, Any]], bandwidth: float | None) -> list[str]:
    xl = {v: rows.get(("xl", 512, 4, v)) for v in VARIANTS}
    fast, best = xl["fast"], best_fast(xl)
    lines = ["\n## Targets (xl unless said)\n", "| target | measured | met |", "|---|---|---|"]

    def add(name: str, value: float | None, goal: float, fmt: str, higher: bool = True,
            bounded: RatioInterval | None = None) -> None:
        if value is None:
            lines.append(f"| {name} | not measured | - |")
            return
        met = "yes" if (value >= goal if higher else value <= goal) else "NO"
        if bounded is not None and bounded.holds(goal):
            met += " (the goal is inside the interval)"
        shown = fmt.format(value) if bounded is None else bounded.as_text()
        lines.append(f"| {name} | {shown} | {met} |")

    def add_ratio(name: str, slow: dict[str, Any] | None, quick: dict[str, Any] | None, goal: float) -> None:
        add(name, ratio(slow, quick), goal, "{:.2f}x (no interval)", bounded=interval(slow, quick))

    add_ratio("best fast vs HF >= 2.5x", xl["hf"], best, 2.5)
    add_ratio("best fast vs the fastest torch.compile (sdpa, any mode or scope) >= 1.3x",
              fastest_compile(rows, "xl"), best, 1.3)
    add("fwd+bwd MFU >= 45%", fwd_bwd_mfu(fast), 0.45, "{:.1%}")
    add_ratio("fast vs its own eager step (what CUDA graphs buy)", xl["fast-eager"], fast, 1.0)
    for size in ("xl", "2.7B"):
        optimizer_floor(rows.get((size, 512, 4, "fast")), size, bandwidth, add, lines)
    big = rows.get(("2.7B", 512, 4, "fast"))
    add("2.7B fwd+bwd MFU >= 45%", fwd_bwd_mfu(big), 0.45, "{:.1%}")
    if big is None:
        lines.append("| 2.7B fits in 80 GB (fast, batch 4) | not measured | - |")
    else:
        fits = big.get("status") == "ok" and (big.get("peak_reserved_gib") or 0) < 80
        lines.append(f"| 2.7B fits in 80 GB (fast, batch 4) | {cell(big, 'peak_reserved_gib')} GiB "
                     f"reserved ({big.get('status')}) | {'yes' if fits else 'NO'} |")
    return lines


def optimizer_floor(fast: dict[str, Any] | None, size: str, bandwidth: float | None, add, lines) -> None:
    """The optimizer target: its phase within 1.3x of 28 bytes/parameter at the copy bandwidth."""
    floor = None
    if fast and fast.get("status") == "ok" and bandwidth:
        floor = ADAMW_BYTES_PER_PARAM * fast["parameters"] / (bandwidth * 1e9) * 1e3
        lines.append(f"| ({size} optimizer floor: 28 B/param x {fast['parameters']:,} at {bandwidth:.0f} "
                     f"GB/s copy bandwidth) | {floor:.2f} ms | |")
    over = fast["optimizer_ms"] / floor if floor and fast.get("optimizer_ms") else None
    add(f"{size} optimizer <= 1.3x its memory floor", over, 1.3, "{:.2f}x", higher=False)


LONG_FAST = ("fast", "fast-inbwd", "fast-sdpa", "fast-sdpa-inbwd")
"""The fast rows at long context: our FlashAttention or PyTorch's SDPA, each optimizer mode."""


def long_table(rows: dict[tuple, dict[str, Any]]) -> list[str]:
    """Long context: every row's time, and the peers against the fastest fast row."""
    peers = ("sdpa", "compile", "hf")
    lines = ["\n## large, batch 1, long context (median ms; ratios against the fastest fast row; "
             "peak allocated GiB)\n",
             "fast (sdpa attn): the fast path with PyTorch's SDPA in place of lmscope's FlashAttention "
             "(`--fast on --attention sdpa`).\n",
             "| context | fast | fast, opt. in bwd | fast (sdpa attn) | fast (sdpa attn), opt. in bwd "
             "| sdpa | compile | hf | sdpa / fast | compile / fast | hf / fast | fastest fast | fast GiB "
             "| sdpa GiB |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for context in (8192, 16384):
        got = {v: rows.get(("large", context, 1, v)) for v in (*LONG_FAST, *peers)}
        if not any(got.values()):
            continue
        best = best_fast(got, LONG_FAST)
        name = next((v for v in LONG_FAST if best is not None and got[v] is best), "-")
        ratios = [ratio_text(got[peer], best) for peer in peers]
        lines.append(
            f"| {context} | " + " | ".join(cell(got[v]) for v in (*LONG_FAST, *peers)) + " | "
            + " | ".join(ratios)
            + f" | {name} | {cell(best, 'peak_allocated_gib')} | {cell(got['sdpa'], 'peak_allocated_gib')} |"
        )
    return lines


def parameter_check(rows: dict[tuple, dict[str, Any]]) -> list[str]:
    """HF's parameter count next to ours, per size (they should be equal: same architecture)."""
    lines = []
    for size in SIZES:
        hf = rows.get((size, 512, 4, "hf"))
        ours = next((rows.get((size, 512, 4, v)) for v in ("fast", "sdpa", "naive")
                     if rows.get((size, 512, 4, v), {}).get("parameters")), None)
        if hf and hf.get("parameters") and ours:
            same = "equal" if hf["parameters"] == ours["parameters"] else "DIFFERENT"
            lines.append(f"- {size}: HF {hf['parameters']:,} vs lmscope {ours['parameters']:,} ({same})")
    return ["\n## Parameter counts\n", *lines] if lines else []


def failures(*tables: dict[tuple, dict[str, Any]]) -> list[str]:
    bad = [r for table in tables for r in table.values() if r.get("status") != "ok"]
    if not bad:
        return []
    return ["\n## Failed points\n"] + [
        f"- {r['size']} ctx {r['context_length']} {variant(r)}: {r.get('status')}: {r.get('error')}"
        for r in bad
    ]


def summary_text(out: Path) -> str:
    """The summary of the rows in `out` (markdown), a function of those rows alone."""
    rows, long_rows = latest(out / "bench.jsonl"), latest(out / "long.jsonl")
    device = next((r.get("device_name") for r in [*rows.values(), *long_rows.values()]
                   if r.get("device_name")), "unknown device")
    lines = [f"# lmscope --fast on {device}\n",
             "naive / sdpa: the eager TransformerLM with that attention under autocast; compile: the "
             "eager model (sdpa) under torch.compile; hf: transformers' LlamaForCausalLM, same sizes, "
             "SDPA; fast: FastTransformerLM (Triton RMSNorm, SwiGLU, RoPE, FlashAttention, fused LM "
             "head + cross-entropy), its step replayed from CUDA graphs (`--cuda-graph auto`); "
             "fast, no graphs: the same model launched eagerly. All: fp32 master weights, bf16 "
             "compute; AdamW: torch's fused one for the peers, lmscope's FusedAdamW for fast (rows of "
             "commits before 18a183b: torch's fused one too). "
             "MFU: model FLOPs (lmscope.accounting.flops: causal attention as half the square) "
             "of the whole train step over its median time, against the bf16 peak; fwd+bwd MFU: "
             "the forward+backward FLOPs over the forward and backward phases' time only.\n"]
    lines += main_table(rows) + strongest_peers(rows) + targets(rows, recorded_bandwidth(out))
    lines += long_table(long_rows)
    lines += parameter_check(rows) + failures(rows, long_rows)
    return "\n".join(lines) + "\n"


def main() -> None:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "runs/fast-gpu")
    record_bandwidth(out)
    print(summary_text(out), end="")


if __name__ == "__main__":
    main()
