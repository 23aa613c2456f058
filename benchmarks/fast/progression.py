"""The progression table of benchmarks/results/fast/README.md, from each run folder's bench.jsonl.

Usage (repo root): PYTHONPATH=src:benchmarks/fast python3 benchmarks/fast/progression.py
"""

from pathlib import Path

from summarize import fwd_bwd_mfu, latest

RESULTS = Path("benchmarks/results/fast")
SIZES = ("small", "medium", "large", "xl", "2.7B")


def cell(record: dict | None) -> str:
    """Median step ms and forward+backward MFU of a fast row, or '-'."""
    if record is None or record.get("status") != "ok":
        return "-"
    return f"{record['median_ms']:.1f} ({fwd_bwd_mfu(record):.1%})"


def main() -> None:
    print("| run | commit | " + " | ".join(f"{s}: ms (fwd+bwd MFU)" for s in SIZES) + " |")
    print("|---|---|" + "---|" * len(SIZES))
    for run in sorted(p.name for p in RESULTS.iterdir() if p.is_dir()):
        rows = latest(RESULTS / run / "bench.jsonl")
        sha = next(iter(rows.values()))["git_sha"]
        cells = [cell(rows.get((s, 512, 4, "fast")) or rows.get((s, 512, 4, "fast-eager"))) for s in SIZES]
        print(f"| {run} | {sha} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
