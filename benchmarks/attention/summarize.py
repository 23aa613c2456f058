"""Summarize a GPU run of benchmarks/attention/run_gpu.sh: markdown tables, plots, the verdict.

Usage: python3 benchmarks/attention/summarize.py OUT_DIR

Reads OUT_DIR/{leaderboard,classic,tflops}.jsonl (those present) and writes OUT_DIR/summary.md,
OUT_DIR/classic.png and OUT_DIR/tflops.png; prints the leaderboard ratio table and the verdict
against the issue's targets last. Ratios are flash-triton / peer (below 1: flash-triton faster).
"""

from __future__ import annotations

import sys
from pathlib import Path

from lmscope.records.provenance import source_label
from lmscope.records.results import Record, read_records
from lmscope.records.stats import ratio_interval
from lmscope.report import console
from lmscope.report.attention_plots import plot_attention
from lmscope.report.tables import build_table, render
from lmscope.running.runner import spec_fields

LEADERBOARD_BEST_MS = 5.364
"""Best verified CS336 leaderboard entry for the reference workload (issue 5): the bar to beat."""
MIN_SPEEDUP_VS_SDPA_FLASH = 1.3
"""Issue 5: flash-triton at least 1.3x faster than sdpa-flash in the same run."""


def _load(out: Path, name: str) -> list[Record]:
    path = out / f"{name}.jsonl"
    if not path.exists():
        return []
    rows = [r for r in read_records(path) if r.get("workload") == "attention"]
    # flash-triton's column first (the ratios' base, `_section`)
    return sorted(rows, key=lambda r: r.get("impl") != "flash-triton")


def _last_ok(records: list[Record], impl: str) -> Record | None:
    rows = [r for r in records if r.get("impl") == impl and r.get("status") == "ok"]
    return rows[-1] if rows else None


def _fwd_bwd(records: list[Record], impl: str) -> float | None:
    row = _last_ok(records, impl)
    return row.get("fwd_bwd_ms") if row else None


def _speedup_text(records: list[Record], peer: str, speedup: float) -> str:
    """peer / flash-triton with its 95 % bootstrap interval when both rows kept per-call times."""
    ours, theirs = _last_ok(records, "flash-triton"), _last_ok(records, peer)
    if ours and theirs and ours.get("fwd_bwd_times_ms") and theirs.get("fwd_bwd_times_ms"):
        return ratio_interval(theirs["fwd_bwd_times_ms"], ours["fwd_bwd_times_ms"]).as_text(3)
    return f"{speedup:.2f}x (no interval)"


def verdict(records: list[Record]) -> list[str]:
    """The leaderboard targets of issue 5, each as one line with its numbers."""
    ours = _fwd_bwd(records, "flash-triton")
    if ours is None:
        return ["flash-triton has no fwd_bwd_ms in the leaderboard results: no verdict"]
    lines = [f"flash-triton fwd+bwd {ours:.3f} ms; best leaderboard entry {LEADERBOARD_BEST_MS} ms: "
             + ("beaten" if ours < LEADERBOARD_BEST_MS else "NOT beaten")]
    for peer, bar, word in (("sdpa-flash", MIN_SPEEDUP_VS_SDPA_FLASH, "must"), ("sdpa-cudnn", 1.0, "goal")):
        theirs = _fwd_bwd(records, peer)
        if theirs is None:
            lines.append(f"{peer}: no result in this run")
            continue
        speedup = theirs / ours
        met = "met" if speedup >= bar else "NOT met"
        lines.append(f"{peer} {theirs:.3f} ms: speedup {peer}/flash-triton "
                     f"{_speedup_text(records, peer, speedup)} ({word}: >= {bar:g}x, {met})")
    return lines


def _section(title: str, records: list[Record], compare: bool) -> str:
    keys = spec_fields("attention")
    parts = [f"## {title}\n"]
    if compare:
        parts.append("fwd_bwd_ms per implementation; ratio = flash-triton / peer (below 1: faster), "
                     "with its 95 % bootstrap interval; `~`: the interval holds 1.\n")
        base = "flash-triton" if any(r.get("impl") == "flash-triton" for r in records) else None
        parts.append(render(build_table(records, keys, compare="impl", compare_base=base), "md"))
    parts.append("\nAll metrics (ms, TFLOP/s, MiB; max_error vs float64):\n")
    parts.append(render(build_table(records, keys), "md"))
    failed = [r for r in records if r.get("status") != "ok"]
    reasons = sorted({f"{r.get('impl')}: {r.get('status')} ({r.get('error')})" for r in failed})
    if reasons:
        parts.append("\nFailed or unavailable points, by reason:\n\n" + "\n".join(f"- {x}" for x in reasons))
    return "\n".join(parts) + "\n"


def _plot(records: list[Record], path: Path, metrics: list[str]) -> None:
    try:
        plot_attention(records, path, metrics)
    except ImportError as error:  # no matplotlib on this machine: the tables still get written
        console.say(f"no plot {path.name}: {error}")


def summary_text(out: Path) -> str:
    """The summary.md of the rows in `out`: a function of the rows alone."""
    leaderboard, classic, tflops = (_load(out, n) for n in ("leaderboard", "classic", "tflops"))
    first = next((r for r in leaderboard + classic + tflops), {})
    text = [f"# lmscope attention on {first.get('device_name', '?')}\n",
            f"torch {first.get('torch')}, triton {first.get('triton')}, git {source_label(first)}\n"]
    if leaderboard:
        lines = "\n".join(f"- {x}" for x in verdict(leaderboard))
        text.append(f"## Verdict (issue 5 targets)\n\n{lines}\n")
        text.append(_section("Reference workload (--preset leaderboard)", leaderboard, compare=True))
    if tflops:
        text.append(_section("Forward-only and backward-only TFLOP/s (--preset tflops)", tflops, False))
    if classic:
        text.append(_section("Classic grid (--preset classic)", classic, compare=True))
    return "\n".join(text)


def main(out: Path) -> None:
    (out / "summary.md").write_text(summary_text(out))
    console.say(f"wrote {out / 'summary.md'}")
    tflops, classic = _load(out, "tflops"), _load(out, "classic")
    if tflops:
        _plot(tflops, out / "tflops.png", ["fwd_tflops", "bwd_tflops"])
    if classic:
        _plot(classic, out / "classic.png", ["fwd_bwd_ms"])
    leaderboard = _load(out, "leaderboard")
    if leaderboard:
        console.show_table(build_table(leaderboard, spec_fields("attention"), compare="impl"),
                           title="reference workload: fwd_bwd_ms, ratio = flash-triton / peer")
        for line in verdict(leaderboard):
            console.say(line)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: summarize.py OUT_DIR")
    main(Path(sys.argv[1]))
