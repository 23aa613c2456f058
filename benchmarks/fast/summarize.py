"""Markdown summary of benchmarks/fast/run_gpu.sh: step times per variant, ratios, the targets.

Reads OUT/bench.jsonl and OUT/long.jsonl written by `lmscope bench`; measures the GPU's copy
bandwidth (for the optimizer's memory floor) when a GPU is present.
Usage: PYTHONPATH=src python3 benchmarks/fast/summarize.py OUT > OUT/summary.md
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from lmscope.accounting.flops import step_flops
from lmscope.config import preset
from lmscope.report.rounds import pool_rounds, ratio_between
from lmscope.results import read_records
from lmscope.runner import spec_fields
from lmscope.stats import RatioInterval

VARIANTS = ("naive", "sdpa", "compile", "hf", "fast-eager", "fast", "fast-inbwd")
PEERS = ("naive", "sdpa", "compile", "hf")
"""Other models: compared with the faster fast row."""
SIZES = ("small", "medium", "large", "xl", "2.7B")
ADAMW_BYTES_PER_PARAM = 28  # fused AdamW reads param, grad, m, v (16 B) and writes param, m, v (12 B)
H100_BF16_PEAK = 989.0


def variant(record: dict[str, Any]) -> str:
    """Which row of the comparison a bench record is."""
    if record.get("peer") == "hf":
        return "hf"
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
        return "compile"
    return str(record.get("attention"))


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


def fwd_bwd_mfu(record: dict[str, Any]) -> float | None:
    """FLOPs of forward+backward over the forward and backward phases' time, vs the bf16 peak."""
    if record.get("status") != "ok" or record.get("forward_ms") is None:
        return None
    config = preset(record["size"], context_length=record["context_length"])
    flops = step_flops(config, record["batch_size"], record["context_length"], "forward-backward")
    seconds = (record["forward_ms"] + record["backward_ms"]) / 1e3
    return flops / seconds / 1e12 / (record.get("peak_tflops") or H100_BF16_PEAK)


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


def main_table(rows: dict[tuple, dict[str, Any]]) -> list[str]:
    lines = [
        "## Train step, bf16, batch 4, context 512 (median ms; speedup = other / best fast, with its "
        "95 % bootstrap interval from the per-step times; `~`: the interval holds 1)\n",
        "best fast: the faster of `fast` (optimizer as its own phase) and `fast, opt. in bwd` "
        "(`--optimizer-in-backward on`: each weight updated during the backward on a side stream). "
        "The fwd+bwd MFU, the optimizer time and `vs fast, no graphs` are those of `fast`, whose "
        "phases are separate.\n",
        "| size | naive | sdpa | compile | hf | fast, no graphs | fast | fast, opt. in bwd | vs naive "
        "| vs sdpa | vs compile | vs hf | vs fast, no graphs | best fast MFU | fast fwd+bwd MFU "
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
        mfu = fwd_bwd_mfu(fast) if fast else None
        lines.append(
            f"| {size} | " + " | ".join(cell(got[v]) for v in VARIANTS) + " | "
            + " | ".join(speedups) + " | "
            + f"{cell(best, 'mfu', '{:.1%}')} | {'-' if mfu is None else f'{mfu:.1%}'} | "
            + f"{cell(fast, 'optimizer_ms')} | {cell(fast, 'peak_allocated_gib')} |"
        )
    return lines


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
    add_ratio("best fast vs torch.compile (sdpa) >= 1.3x", xl["compile"], best, 1.3)
    add("fwd+bwd MFU >= 45%", fwd_bwd_mfu(fast) if fast else None, 0.45, "{:.1%}")
    add_ratio("fast vs its own eager step (what CUDA graphs buy)", xl["fast-eager"], fast, 1.0)
    for size in ("xl", "2.7B"):
        optimizer_floor(rows.get((size, 512, 4, "fast")), size, bandwidth, add, lines)
    big = rows.get(("2.7B", 512, 4, "fast"))
    add("2.7B fwd+bwd MFU >= 45%", fwd_bwd_mfu(big) if big else None, 0.45, "{:.1%}")
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


def main() -> None:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "runs/fast-gpu")
    rows, long_rows = latest(out / "bench.jsonl"), latest(out / "long.jsonl")
    device = next((r.get("device_name") for r in [*rows.values(), *long_rows.values()]
                   if r.get("device_name")), "unknown device")
    bandwidth = copy_bandwidth_gbps()
    lines = [f"# lmscope --fast on {device}\n",
             "naive / sdpa: the eager TransformerLM with that attention under autocast; compile: the "
             "eager model (sdpa) under torch.compile; hf: transformers' LlamaForCausalLM, same sizes, "
             "SDPA; fast: FastTransformerLM (Triton RMSNorm, SwiGLU, RoPE, FlashAttention, fused LM "
             "head + cross-entropy), its step replayed from CUDA graphs (`--cuda-graph auto`); "
             "fast, no graphs: the same model launched eagerly. All: fp32 master weights, bf16 "
             "compute; AdamW: torch's fused one for the peers, lmscope's FusedAdamW for fast. "
             "MFU counts attention as the full square (as "
             "lmscope.accounting.flops does).\n"]
    lines += main_table(rows) + targets(rows, bandwidth) + long_table(long_rows)
    lines += parameter_check(rows) + failures(rows, long_rows)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
