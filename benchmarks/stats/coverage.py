"""Does one run's round-level interval cover what other runs measure? (issue 34)

Usage: python3 benchmarks/stats/coverage.py RUN_JSONL... --out DIR [--field attention] [--base naive]
       [--command "the command that made the runs"]

Each RUN_JSONL is one `lmscope bench --rounds R` comparison of two points that differ in --field.
Per run: the ratio base / other of the pooled median step times with its 95 % interval over the
rounds (`lmscope.report.rounds.ratio_between`, as `--compare` shows it), and the same ratio pooled
over all the other runs' rounds; the run's interval covers it or not. Writes DIR/coverage.jsonl
(one row per run, then a summary row) and DIR/summary.md (the table, the count, the command,
the device and the date).

The true ratio is unknown, so the reference is itself measured: the other runs' pooled ratio
(leave one out), which carries their noise too, less than one run's since it pools several. A
run is thus checked against a noisy target, and the count tends to come out a little lower than
coverage of the true ratio would (for runs that share one true ratio), not higher.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lmscope.records.results import Record, append_record, read_records
from lmscope.report.rounds import pool_rounds, ratio_between, rounds_of
from lmscope.running.runner import spec_fields

Rounds = list[list[float]]
PROVENANCE = ("time", "host", "device_name", "cpu_count", "load_1m", "torch", "git_sha")


def leave_one_out(runs: Sequence[tuple[Record, Record]], confidence: float = 0.95) -> list[dict[str, Any]]:
    """Per run (a pooled base row and other row): its ratio and interval, the pooled ratio of the
    other runs, and whether the interval covers it."""
    rows = []
    for index, (base, other) in enumerate(runs):
        interval = ratio_between(base, other, "times_ms", confidence)
        rest = [pair for j, pair in enumerate(runs) if j != index]
        others = _pooled_median(rest, 0) / _pooled_median(rest, 1)
        rows.append({"run": index, "ratio": interval.ratio, "low": interval.low, "high": interval.high,
                     "confidence": confidence, "rounds_base": interval.rounds_base,
                     "rounds_other": interval.rounds_other, "steps_base": interval.n_base,
                     "steps_other": interval.n_other, "reason": interval.reason,
                     "others_ratio": others, "covers": interval.holds(others)})
    return rows


def _pooled_median(runs: Sequence[tuple[Record, Record]], side: int) -> float:
    return statistics.median(t for pair in runs for times in rounds_of(pair[side]) for t in times)


def run_pair(records: Sequence[Record], field: str, base: str | None) -> tuple[Record, Record]:
    """The run's two pooled ok rows, base first (`base`, else the first value of `field` seen)."""
    pooled = [r for r in pool_rounds(records, spec_fields("bench")) if r.get("status") == "ok"]
    values = list(dict.fromkeys(str(r.get(field)) for r in pooled))
    if len(values) != 2:
        raise ValueError(f"a run must compare two values of {field}, found {values}")
    first = base if base is not None else values[0]
    if first not in values:
        raise ValueError(f"--base {first} is not a value of {field}: choose one of {', '.join(values)}")
    by_value = {str(r.get(field)): r for r in pooled}
    return by_value[first], by_value[next(v for v in values if v != first)]


def summary_markdown(rows: list[dict[str, Any]], field: str, pair: tuple[Record, Record],
                     command: str) -> str:
    """summary.md: the command, where and when, the table of runs and the count that covers."""
    base, other = pair
    covered = sum(r["covers"] for r in rows)
    lines = [
        f"# Coverage of the round-level interval over {len(rows)} runs",
        "",
        f"Rows: [coverage.jsonl](coverage.jsonl). Command (each run): `{command}`",
        "",
        f"Device: {base.get('device_name')} ({base.get('cpu_count')} CPUs) on {base.get('host')}; torch "
        f"{base.get('torch')}; git {base.get('git_sha')}; runs from {min(_times(rows))} to "
        f"{max(_times(rows))}; each row records the host's load.",
        "",
        f"Ratio: median step time of {field}={base.get(field)} over {field}={other.get(field)}, "
        "pooled over the rounds, with its 95 % interval over the rounds; others: the same ratio pooled "
        "over every other run's rounds ([coverage.jsonl](coverage.jsonl)).",
        "",
        "| run | rounds | steps base/other | ratio [95 % interval] | others' ratio | covers |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        shown = (f"{r['ratio']:.3f} [{r['low']:.3f}, {r['high']:.3f}]" if r["low"] is not None
                 else f"{r['ratio']:.3f} (no interval: {r['reason']})")
        lines.append(f"| {r['run']} | {r['rounds_base']}/{r['rounds_other']} | "
                     f"{r['steps_base']}/{r['steps_other']} | {shown} | {r['others_ratio']:.3f} | "
                     f"{'yes' if r['covers'] else 'NO'} |")
    lines += ["", f"{covered} of {len(rows)} intervals cover the pooled ratio of the other runs "
              f"([coverage.jsonl](coverage.jsonl)).", ""]
    return "\n".join(lines)


def _times(rows: list[dict[str, Any]]) -> list[str]:
    return [str(r["time"]) for r in rows if r.get("time")]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--field", default="attention")
    parser.add_argument("--base", default=None)
    parser.add_argument("--command", default="lmscope bench ...")
    args = parser.parse_args(argv)
    pairs = [run_pair(read_records(path), args.field, args.base) for path in args.runs]
    rows = leave_one_out(pairs)
    for row, (base, _), path in zip(rows, pairs, args.runs, strict=True):
        row.update({k: base.get(k) for k in PROVENANCE}, file=path.name, command=args.command)
    args.out.mkdir(parents=True, exist_ok=True)
    jsonl = args.out / "coverage.jsonl"
    jsonl.unlink(missing_ok=True)
    for row in rows:
        append_record(jsonl, row)
    covered = sum(r["covers"] for r in rows)
    append_record(jsonl, {"summary": True, "runs": len(rows), "covered": covered, "command": args.command,
                          **{k: pairs[0][0].get(k) for k in PROVENANCE if k != "time"}})
    (args.out / "summary.md").write_text(summary_markdown(rows, args.field, pairs[0], args.command))
    print(f"{covered} of {len(rows)} run intervals cover the pooled ratio of the others -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
