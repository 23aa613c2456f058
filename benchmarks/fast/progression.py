"""Print the progression table of benchmarks/results/fast/README.md from the runs' bench.jsonl."""
from pathlib import Path
from summarize import latest, fwd_bwd_mfu
R = Path('benchmarks/results/fast')
SIZES = ("small", "medium", "large", "xl", "2.7B")
print("| run | commit | " + " | ".join(f"{s}: ms (fwd+bwd MFU)" for s in SIZES) + " |")
print("|---|---|" + "---|" * len(SIZES))
for d in sorted(p.name for p in R.iterdir() if p.is_dir()):
    rows = latest(R / d / 'bench.jsonl')
    sha = next(iter(rows.values()))['git_sha']
    cells = []
    for s in SIZES:
        r = rows.get((s, 512, 4, 'fast')) or rows.get((s, 512, 4, 'fast-eager'))
        cells.append('-' if r is None or r.get('status') != 'ok' else f"{r['median_ms']:.1f} ({fwd_bwd_mfu(r):.1%})")
    print(f"| {d} | {sha} | " + " | ".join(cells) + " |")
