"""`--compare FIELD`: a swept field pivoted into columns, with ratios against a base value.

The base is `--compare-base VALUE`, or else the first value of FIELD that has an `ok` row (an
implementation unavailable on this machine is never the base). A ratio of times is base / other
(above 1: the other is faster) of the median step times, with a bootstrap confidence interval from
both rows' per-step times, resampled by round where the rows pool `--rounds`
(`lmscope.report.rounds.ratio_between`): '<ratio>x [<low>, <high>]', and '~<ratio>x [<low>, <high>]'
when the interval holds 1 (a difference inside the noise). Rows without per-step times say
'no interval', rows with too few say why. Ratios of metrics that are not timings (memory,
fractions, bandwidth) are plain numbers.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from lmscope.records.results import Record
from lmscope.report.rounds import ratio_between

ATTENTION_TIMES = {f"{p}_ms": f"{p}_times_ms" for p in ("fwd", "bwd", "fwd_bwd")}
TIMES_OF: dict[str, dict[str, str]] = {
    "bench": {"median_ms": "times_ms"},
    "memory": {"median_ms": "times_ms"},
    "profile": {"step_ms": "times_ms"},
    "attention": ATTENTION_TIMES,
}
"""Per workload, metric -> the key of the per-step times whose median it is: the times its ratio's
interval is drawn from. (ddp's step_ms is a mean over ranks: `lmscope ddp`'s own summary bounds
its ratios from rank 0's times instead.)"""

TRUE_WORDS = ("on", "true", "yes", "1")
FALSE_WORDS = ("off", "false", "no", "0")

Table = tuple[list[str], list[list[Any]]]


def _matches(value: Any, wanted: str) -> bool:
    if isinstance(value, bool):
        return wanted.strip().lower() in (TRUE_WORDS if value else FALSE_WORDS)
    return wanted.strip() in (str(value), json.dumps(value))


def find_base(values: Sequence[Any], wanted: str, field: str) -> Any:
    """The value of `field` that `--compare-base wanted` names; ValueError naming the choices."""
    for value in values:
        if _matches(value, wanted):
            return value
    choices = ", ".join(dict.fromkeys(str(v) for v in values))
    raise ValueError(f"--compare-base {wanted!r} is not a value of {field}: choose one of {choices}")


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def ratio_text(base: Record, other: Record, metric: str, cell: Callable[[Record, str], Any]) -> Any:
    """The ratio cell of `other` against `base` for `metric` (None when either has no number)."""
    top, bottom = cell(base, metric), cell(other, metric)
    if not (_is_number(top) and _is_number(bottom)) or not bottom:
        return None
    times_key = TIMES_OF.get(base.get("workload", ""), {}).get(metric)
    if times_key is None and not metric.endswith("_ms"):
        return top / bottom
    interval = ratio_between(base, other, times_key) if times_key else None
    if interval is None:
        return f"{top / bottom:.2f}x (no interval)"
    return interval.as_text()


def pivot(
    records: Sequence[Record],
    axes: list[str],
    field: str,
    metric: str,
    *,
    cell: Callable[[Record, str], Any],
    base: str | None = None,
) -> Table:
    """One row per combination of the other axes; a `metric` column per value, then the ratios."""
    if field not in axes:
        raise ValueError(
            f"cannot compare by {field!r}: it does not vary in these results "
            f"(swept fields: {', '.join(axes) or 'none'})"
        )
    raw = list({json.dumps(r.get(field)): r.get(field) for r in records}.values())
    keys = [a for a in axes if a != field]
    groups: dict[str, dict[str, Record]] = {}
    for record in records:
        group = groups.setdefault(json.dumps([record.get(k) for k in keys]), {})
        group[json.dumps(record.get(field))] = record
    if base is not None:
        chosen = find_base(raw, base, field)
    else:
        usable = [v for v in raw if any(json.dumps(r.get(field)) == json.dumps(v)
                                         and _is_number(cell(r, metric)) for r in records)]
        chosen = (usable or raw)[0]
    others = [v for v in raw if json.dumps(v) != json.dumps(chosen)]
    header = keys + [f"{metric} {field}={v}" for v in raw] + [f"ratio {chosen}/{v}" for v in others]
    rows = []
    for group_key, group in groups.items():
        values = [_value(group.get(json.dumps(v)), metric, cell) for v in raw]
        base_record = group.get(json.dumps(chosen))
        ratios = [
            ratio_text(base_record, group[json.dumps(v)], metric, cell)
            if base_record is not None and json.dumps(v) in group else None
            for v in others
        ]
        rows.append(json.loads(group_key) + values + ratios)
    return header, rows


def _value(record: Record | None, metric: str, cell: Callable[[Record, str], Any]) -> Any:
    return None if record is None else cell(record, metric)
