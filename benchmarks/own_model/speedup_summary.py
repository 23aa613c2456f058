"""Markdown summary and plot of benchmarks/own_model/speedup_gpu.sh: each transformers model in four
setups (eager, torch.compile, Liger-Kernel, lmscope --fast), the ratios and issue 38's targets.

Reads OUT/bench.jsonl (rounds pooled: their per-step times joined), writes OUT/summary.md (printed
too) and OUT/speedup.png. Ratios are a peer's median step time over lmscope's, each side's fastest
variant where several ran (`fast (sdpa-cudnn)` beside `fast`, `compile (<mode>)` beside
`compile`), with the 95 % bootstrap interval (`lmscope.report.rounds.ratio_between`: it resamples
rounds where the rows pooled several, the steps of one process where not).
Usage: PYTHONPATH=src python3 benchmarks/own_model/speedup_summary.py OUT
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from lmscope.records.results import read_records
from lmscope.report.rounds import pool_rounds, ratio_between, rounds_of
from lmscope.running.runner import spec_fields

GROUPS = ("eager", "compile", "liger", "fast")
"""The setups in table order; a group may hold variants: `compile (<mode>)`, `fast (<attention>)`."""
PEERS = GROUPS[:3]
TARGETS = {"liger": 1.15, "compile": 1.0}
"""Issue 38, on the Llama-3.2-1B shape: lmscope's step at least this much faster than the peer's."""
TARGET_MODEL = "llama-3.2-1b-shape"


def setup(record: dict[str, Any]) -> str:
    """Which setup a bench row measured."""
    if record.get("fast"):
        attention = record.get("attention")
        return "fast" if attention == "flash" else f"fast ({attention})"
    if record.get("peer") == "liger":
        return "liger"
    mode = record.get("compile")
    if not mode:
        return "eager"
    return "compile" if mode is True else f"compile ({mode})"


def model(record: dict[str, Any]) -> str:
    """The model of a row: its config's name, with the layer override, context, batch, checkpoint."""
    name = Path(str(record["size"]).removeprefix("hf:")).stem
    layers = f", {record['num_layers']} layers" if record.get("num_layers") else ""
    checkpoint = f", checkpoint {record['checkpoint']}" if record.get("checkpoint", "none") != "none" else ""
    return f"{name}{layers}, batch {record['batch_size']} x {record['context_length']}{checkpoint}"


def grouped(rows: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    """model -> setup -> its row (rounds pooled, compile_s their longest; the last run of a point
    wins)."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for row in pool_rounds(rows, spec_fields("bench")):
        out.setdefault(model(row), {})[setup(row)] = row
    return out


def _ok(row: dict[str, Any] | None) -> bool:
    return bool(row) and row.get("status") == "ok"


def _num(row: dict[str, Any] | None, key: str, fmt: str, scale: float = 1.0) -> str:
    if not _ok(row):
        return str((row or {}).get("status", "-")).upper() if row else "-"
    value = row.get(key)
    return "-" if value is None else fmt.format(value * scale)


def setups_of(setups: dict[str, dict[str, Any]]) -> list[str]:
    """Every group's variants that ran (a group without any: its plain name, shown as missing)."""
    names = []
    for group in GROUPS:
        variants = sorted(name for name in setups if name.split(" ")[0] == group)
        names += variants or [group]
    return names


def best(setups: dict[str, dict[str, Any]], group: str) -> dict[str, Any] | None:
    """The fastest ok variant of `group` (else any of its rows, for the error)."""
    rows = [row for name, row in setups.items() if name.split(" ")[0] == group]
    ok = [row for row in rows if _ok(row)]
    return min(ok, key=lambda r: r["median_ms"]) if ok else (rows[0] if rows else None)


def best_fast(setups: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """lmscope's fastest variant."""
    return best(setups, "fast")


def speedup(peer: dict[str, Any] | None, fast: dict[str, Any] | None) -> tuple[float, float, float] | None:
    """(ratio, low, high): the peer's median step over lmscope's, with its interval."""
    if not (_ok(peer) and _ok(fast) and peer.get("times_ms") and fast.get("times_ms")):
        return None
    interval = ratio_between(peer, fast)  # pooled rows: the interval resamples rounds
    return interval.ratio, interval.low, interval.high


def model_table(setups: dict[str, dict[str, Any]]) -> list[str]:
    """One markdown table: a line per setup, then lmscope's ratio to each peer."""
    lines = ["| setup | step ms (median) | rounds | peak GiB | tokens/s | MFU % | compile s (longest round) "
             "| CUDA graph |",
             "|---|---|---|---|---|---|---|---|"]
    for name in setups_of(setups):
        row = setups.get(name)
        rounds = len(rounds_of(row)) if _ok(row) and row.get("times_ms") else 0
        cells = [name, _num(row, "median_ms", "{:.1f}"), str(rounds or "-"),
                 _num(row, "peak_allocated_gib", "{:.1f}"), _num(row, "tokens_per_s", "{:,.0f}"),
                 _num(row, "mfu_counted", "{:.1f}", 100), _num(row, "compile_s", "{:.0f}"),
                 _num(row, "cuda_graph_used", "{}")]
        lines.append("| " + " | ".join(cells) + " |")
    fast = best_fast(setups)
    lines.append("")
    if _ok(fast):
        lines.append(f"lmscope below: `{setup(fast)}`.")
    for peer in PEERS:
        row = best(setups, peer)
        got = speedup(row, fast)
        text = "-" if got is None else f"{got[0]:.3f}x [{got[1]:.3f}, {got[2]:.3f}]"
        lines.append(f"- {setup(row) if row else peer} step / lmscope step: {text}")
    if _ok(fast):
        lines.append(f"- replaced by --fast: `{fast.get('fast_replaced')}`")
    for name, row in setups.items():
        if row and not _ok(row):
            lines.append(f"- {name}: {row.get('status')}: {row.get('error')}")
    return lines


def targets(setups: dict[str, dict[str, Any]]) -> list[str]:
    """Issue 38's targets on the Llama-3.2-1B shape, met or not (lower bounds of the intervals)."""
    fast, liger = best_fast(setups), setups.get("liger")
    lines = []
    for peer, goal in TARGETS.items():
        got = speedup(best(setups, peer), fast)
        verdict = "not measured" if got is None else ("met" if got[1] >= goal else "not met")
        lines.append(f"- at least {goal}x {peer}'s step: {verdict}")
    if _ok(fast) and _ok(liger):
        verdict = "met" if fast["peak_allocated_gib"] <= liger["peak_allocated_gib"] else "not met"
    else:
        verdict = "not measured"
    lines.append(f"- peak memory no higher than Liger's: {verdict}")
    return lines


def summary(groups: dict[str, dict[str, dict[str, Any]]]) -> str:
    lines = ["# transformers models, faster (benchmarks/own_model/speedup_gpu.sh)", ""]
    for name, setups in groups.items():
        lines += [f"## {name}", "", *model_table(setups), ""]
        if name.startswith(TARGET_MODEL):
            lines += ["Targets (issue 38):", "", *targets(setups), ""]
    return "\n".join(lines)


def plot(groups: dict[str, dict[str, dict[str, Any]]], path: Path) -> None:
    """Speed-up over eager and peak memory per model and setup."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(groups)
    fig, (speed, memory) = plt.subplots(1, 2, figsize=(13, 0.9 * len(names) + 2.5))
    setups = list(dict.fromkeys(s for m in names for s in setups_of(groups[m])))
    height = 0.8 / len(setups)
    for index, name in enumerate(setups):
        ys = [i + (index - (len(setups) - 1) / 2) * height for i in range(len(names))]
        eager = [groups[m].get("eager") for m in names]
        rows = [groups[m].get(name) for m in names]
        ratios = [e["median_ms"] / r["median_ms"] if _ok(e) and _ok(r) else 0.0
                  for e, r in zip(eager, rows, strict=True)]
        peaks = [r["peak_allocated_gib"] if _ok(r) else 0.0 for r in rows]
        speed.barh(ys, ratios, height, label=name)
        memory.barh(ys, peaks, height, label=name)
    for axis, title in ((speed, "speed-up over eager (median step)"), (memory, "peak allocated GiB")):
        axis.set_yticks(range(len(names)), names, fontsize=8)
        axis.invert_yaxis()
        axis.set_title(title)
        axis.grid(axis="x", alpha=0.3)
    speed.axvline(1.0, color="gray", lw=0.8)
    memory.legend(loc="lower right", fontsize=8)
    memory.set_yticks(range(len(names)), [""] * len(names))
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    out = Path(args[0])
    groups = grouped(read_records(out / "bench.jsonl"))
    text = summary(groups)
    (out / "summary.md").write_text(text + "\n")
    if groups:
        plot(groups, out / "speedup.png")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
