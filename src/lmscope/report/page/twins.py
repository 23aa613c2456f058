"""A point that several study sections ask for: measured once and reused, or measured twice.

The study measures a shared point once and copies its row into the other sections, marked
`reused_from` (lmscope.study.execute): the report says which rows are such copies. Where the same
point was measured in two sections anyway (a study run before points were shared), the report
shows both measurements side by side with their ratio and its interval, so a reader sees how far
two measurements of one point disagree instead of getting whichever row a section holds.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from lmscope.records.results import Record
from lmscope.records.stats import ratio_interval
from lmscope.report.page.load import Run
from lmscope.report.page.model import Block, TableBlock, TextBlock
from lmscope.report.page.peers import times, verdict
from lmscope.report.tables import format_value
from lmscope.running.runner import identity_key, record_spec, spec_fields


def reuse_note(records: Sequence[Record]) -> Block | None:
    """Which of a section's rows were measured in another section and reused here."""
    sources: dict[str, int] = {}
    for record in records:
        if record.get("reused_from"):
            sources[str(record["reused_from"])] = sources.get(str(record["reused_from"]), 0) + 1
    if not sources:
        return None
    said = ", ".join(f"{n} in {name}" for name, n in sources.items())
    return TextBlock(f"Measured once, reused here: {sum(sources.values())} of this section's "
                     f"{len(records)} row(s) are the rows of the same points measured in another "
                     f"section ({said}; the rows say reused_from), not measurements of their own.")


def _key(record: Record) -> str | None:
    workload = str(record.get("workload"))
    try:
        keys = spec_fields(workload)
    except (ValueError, AttributeError, ModuleNotFoundError):
        return None
    return identity_key(workload, record_spec(record, keys, workload))


def _label(record: Record, keys: Sequence[str]) -> str:
    return " ".join(f"{k}={format_value(record.get(k))}" for k in keys if record.get(k) is not None)


def twin_table(run: Run, section_file: str, records: Sequence[Record],
               confidence: float = 0.95) -> TableBlock | None:
    """The section's points that another section's file measured too (not a reused copy): both
    medians, their ratio with its interval; None when there are none."""
    measured = [r for r in run.records if r.get("status") == "ok" and times(r) and not r.get("reused_from")]
    elsewhere: dict[str, list[Record]] = {}
    for record in measured:
        if record.get("_file") != section_file and (key := _key(record)) is not None:
            elsewhere.setdefault(key, []).append(record)
    rows = []
    for record in records:
        if record.get("status") != "ok" or not times(record) or record.get("reused_from"):
            continue
        for other in elsewhere.get(_key(record) or "", []):
            interval = ratio_interval(times(record), times(other), confidence)
            there = str(other["_file"]).removesuffix(".jsonl")
            rows.append([_label(record, ("size", "context_length", "mode", "precision", "compile")),
                         round(statistics.median(times(record)), 3), there,
                         round(statistics.median(times(other)), 3), round(interval.ratio, 3),
                         round(interval.low, 3), round(interval.high, 3),
                         verdict(interval, "faster there", "slower there"),
                         f"{record.get('time')} / {other.get('time')}"])
    if not rows:
        return None
    header = ["point", "median ms here", "also measured in", "median ms there", "ratio here/there",
              f"low ({confidence:.0%})", f"high ({confidence:.0%})", "verdict", "measured at (here / there)"]
    return TableBlock("the same point measured in another section: two measurements, their ratio",
                      header, rows)
