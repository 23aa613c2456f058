"""Peers in the same run: fp32 vs bf16, compile off vs on, one attention backend vs another.

For a field that varies, points equal in every other spec field are paired; the ratio is the
base's median step time over the other's, with the interval of `lmscope.report.rounds.ratio_between`
on their per-step times, the rounds of `--rounds` pooled and resampled as rounds (above 1: the other
value is faster; an interval holding 1: inside the noise; too few steps or rounds: no interval).
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from typing import Any

from lmscope.records.results import Record
from lmscope.report.page.model import TableBlock
from lmscope.report.rounds import pool_rounds, ratio_between
from lmscope.running.runner import spec_fields

PEER_FIELDS = ("precision", "compile", "compile_scope", "attention", "fast", "checkpoint", "peer",
               "cuda_graph")
"""Fields whose values are peers of one another (not sizes or shapes)."""
BASE_FIRST = ("fp32", False, "naive", "none", "off")
"""Values taken as the base of a ratio when present (else the first seen)."""
IGNORED = {"device", "artifacts_dir", "timeout_s", "snapshot", "top", "max_entries"}


def times(record: Record) -> list[float]:
    """The record's per-step times in ms (positive numbers only)."""
    values = record.get("times_ms") or []
    return [float(t) for t in values if isinstance(t, int | float) and t > 0]


def verdict(interval: Any, faster: str, slower: str) -> str:
    """'inside the noise', which side is faster, or why there is no interval."""
    if not interval.bounded:
        return f"no interval: {interval.reason}"
    if interval.within_noise:
        return "inside the noise"
    return faster if interval.ratio > 1 else slower


def varying_peer_fields(records: Sequence[Record]) -> list[str]:
    """The peer fields that take more than one value among ok records with times."""
    usable = [r for r in records if r.get("status") == "ok" and times(r)]
    return [f for f in PEER_FIELDS if len({json.dumps(r.get(f)) for r in usable if f in r}) > 1]


def peer_table(records: Sequence[Record], field: str, confidence: float = 0.95) -> TableBlock | None:
    """Ratios base/other of `field` per point, or None when no two points pair up."""
    usable = [r for r in records if r.get("status") == "ok" and times(r)]
    if not usable:
        return None
    workload = str(usable[0].get("workload"))
    usable = pool_rounds(usable, spec_fields(workload))
    keys = [k for k in spec_fields(workload) if k != field and k not in IGNORED]
    groups: dict[str, dict[str, Record]] = {}
    for record in usable:
        group = groups.setdefault(json.dumps([record.get(k) for k in keys], default=str), {})
        group[json.dumps(record.get(field))] = record
    values = list(dict.fromkeys(json.dumps(r.get(field)) for r in usable))
    base = next((json.dumps(v) for v in BASE_FIRST if json.dumps(v) in values), values[0])
    varying = [k for k in keys if len({json.dumps(r.get(k), default=str) for r in usable}) > 1]
    rows = []
    for group in groups.values():
        if base not in group:
            continue
        for value, other in group.items():
            if value == base:
                continue
            interval = ratio_between(group[base], other, "times_ms", confidence)
            label = " ".join(f"{k}={other.get(k)}" for k in varying) or "-"
            rows.append([label, json.loads(base), json.loads(value),
                         round(statistics.median(times(group[base])), 3),
                         round(statistics.median(times(other)), 3), round(interval.ratio, 3),
                         _rounded(interval.low), _rounded(interval.high),
                         verdict(interval, f"{json.loads(value)} faster", f"{json.loads(value)} slower")])
    if not rows:
        return None
    header = ["point", f"{field} (base)", field, "base median ms", "median ms", "ratio base/other",
              f"low ({confidence:.0%})", f"high ({confidence:.0%})", "verdict"]
    return TableBlock(f"{field}: ratio of median step times with its {confidence:.0%} interval", header, rows)


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 3)
