"""The progression table of benchmarks/results/fast/README.md, from each run folder's bench.jsonl.

Usage (repo root): PYTHONPATH=src:benchmarks/fast python3 benchmarks/fast/progression.py
"""

from pathlib import Path

from summarize import fwd_bwd_mfu, latest

from lmscope.records.provenance import source_label

RESULTS = Path("benchmarks/results/fast")
SIZES = ("small", "medium", "large", "xl", "2.7B")


def cell(record: dict | None, in_backward: dict | None) -> str:
    """Median step ms and forward+backward MFU of a fast row, then the in-backward row's ms; '-'
    for what a run did not measure."""
    separate = "-"
    if record is not None and record.get("status") == "ok":
        separate = f"{record['median_ms']:.1f} ({fwd_bwd_mfu(record):.1%})"
    if in_backward is not None and in_backward.get("status") == "ok":
        return f"{separate} / {in_backward['median_ms']:.1f}"
    return separate


def run_number(name: str) -> tuple[int, str]:
    """'10-handed-over-gradients' -> (10, name): runs in numeric order."""
    head = name.split("-", 1)[0]
    digits = "".join(ch for ch in head if ch.isdigit())
    return (int(digits) if digits else 0, name)


def main() -> None:
    print("| run | commit | " + " | ".join(f"{s}: ms (fwd+bwd MFU) / opt. in bwd ms" for s in SIZES) + " |")
    print("|---|---|" + "---|" * len(SIZES))
    for run in sorted((p.name for p in RESULTS.iterdir() if p.is_dir()), key=run_number):
        rows = latest(RESULTS / run / "bench.jsonl")
        if not rows:  # a kernel benchmark without step rows
            continue
        sha = source_label(next(iter(rows.values())))
        cells = [cell(rows.get((s, 512, 4, "fast")) or rows.get((s, 512, 4, "fast-eager")),
                      rows.get((s, 512, 4, "fast-inbwd"))) for s in SIZES]
        print(f"| {run} | {sha} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
