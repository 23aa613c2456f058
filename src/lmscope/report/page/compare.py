"""Two runs side by side: per matching point, the ratio of median step times with its interval.

Points match by workload and spec fields (provenance, device and artifact paths left out), so the
same study on two machines, or before and after a change, lines up. The ratio is A's median over
B's (above 1: B is faster) from `lmscope.report.rounds.ratio_between` on the per-step times (the
rounds of `--rounds` pooled, and resampled as rounds); a ratio whose interval holds 1 is inside the
noise, one with too few steps or rounds has no interval and says why.
"""

from __future__ import annotations

import statistics

from lmscope.records.results import Record
from lmscope.report.page.load import Run
from lmscope.report.page.model import PageSection, TableBlock, TextBlock
from lmscope.report.page.peers import times as _times
from lmscope.report.page.peers import verdict
from lmscope.report.rounds import pool_rounds, ratio_between
from lmscope.running.runner import spec_fields

IGNORED = {"device", "artifacts_dir", "timeout_s"}


def _key(record: Record) -> tuple[str, str] | None:
    workload = str(record.get("workload"))
    try:
        keys = spec_fields(workload)
    except (ValueError, AttributeError, ModuleNotFoundError):
        return None
    spec = {k: record.get(k) for k in keys if k not in IGNORED}
    return workload, repr(sorted(spec.items(), key=lambda item: item[0]))


def matched(a: Run, b: Run) -> list[tuple[Record, Record]]:
    """Pairs of ok records of the same point that both carry per-step times (rounds pooled, else
    the last record wins)."""

    def index(run: Run) -> dict[tuple[str, str], Record]:
        out = {}
        for record in _pooled(run.records):
            key = _key(record)
            if key is not None and record.get("status") == "ok" and _times(record):
                out[key] = record
        return out

    left, right = index(a), index(b)
    return [(left[k], right[k]) for k in left if k in right]


def _pooled(records: list[Record]) -> list[Record]:
    """The records with the rounds of each workload's points pooled."""
    out: list[Record] = []
    for workload in dict.fromkeys(str(r.get("workload")) for r in records):
        mine = [r for r in records if str(r.get("workload")) == workload]
        try:
            out += pool_rounds(mine, spec_fields(workload))
        except (ValueError, AttributeError, ModuleNotFoundError):
            out += mine
    return out


def _label(record: Record) -> str:
    keys = (
        "size",
        "context_length",
        "batch_size",
        "mode",
        "precision",
        "attention",
        "compile",
        "checkpoint",
        "warmup",
        "fast",
    )
    return " ".join(f"{k}={record[k]}" for k in keys if record.get(k) not in (None, False, "none"))


def compare_section(a: Run, b: Run, confidence: float = 0.95) -> PageSection:
    """The comparison table of runs `a` and `b`."""
    pairs = matched(a, b)
    section = PageSection(
        title=f"compare: {a.label} vs {b.label}",
        question=f"Is {b.label} faster or slower than {a.label}, point by point, "
        "beyond the noise of the per-step times?",
    )
    if not pairs:
        section.blocks.append(
            TextBlock(
                "No point of one run matches a point of the other with per-step "
                "times (times_ms): nothing to compare."
            )
        )
        return section
    rows = []
    inside = 0
    for left, right in pairs:
        interval = ratio_between(left, right, "times_ms", confidence)
        inside += interval.within_noise
        rows.append(
            [
                left.get("workload"),
                _label(left),
                round(statistics.median(_times(left)), 3),
                round(statistics.median(_times(right)), 3),
                round(interval.ratio, 3),
                None if interval.low is None else round(interval.low, 3),
                None if interval.high is None else round(interval.high, 3),
                interval.n_base,
                interval.n_other,
                verdict(interval, f"{b.label} faster", f"{b.label} slower"),
            ]
        )
    header = [
        "workload",
        "point",
        f"{a.label} median ms",
        f"{b.label} median ms",
        "ratio A/B",
        f"low ({confidence:.0%})",
        f"high ({confidence:.0%})",
        "steps A",
        "steps B",
        "verdict",
    ]
    section.blocks.append(
        TextBlock(
            f"{len(pairs)} matching point(s); {inside} inside the noise (the {confidence:.0%} "
            f"bootstrap interval of the ratio of median step times holds 1). "
            f"Ratio above 1: {b.label} is faster."
        )
    )
    section.blocks.append(TableBlock("ratio per point", header, rows))
    devices = {r.get("device_name") for r in a.records} | {r.get("device_name") for r in b.records}
    section.provenance = [
        f"{a.label}: {', '.join(sorted({str(r.get('device_name')) for r in a.records}))}",
        f"{b.label}: {', '.join(sorted({str(r.get('device_name')) for r in b.records}))}",
    ]
    if len(devices) > 1:
        section.provenance.append("the runs come from different devices")
    return section
