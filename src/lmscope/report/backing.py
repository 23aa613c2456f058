"""Whether a number printed in prose lies within rounding of the rows its text refers to.

A number N printed with d decimals (``a.b ms``: d = 1) stands for any value within half a unit
of its last digit (0.05 ms there); values are compared by magnitude (a sign is often a word:
"``a.b %`` below"). N with a unit is *backed* by the rows when

- **a field of a row** rounds to it, converted into N's unit from the unit the field's name
  carries (snake_case keys carry their unit: `fwd_ms` backs seconds, `saved_mib` backs GiB,
  `_pct` backs %, `_frac` and `mfu` back % as a fraction times 100, a field named as a ratio,
  `speedup` or `vs_floor`, backs x). A field of another kind, or whose name carries no unit (a
  count, a size, an error), backs nothing;
- or, for a ratio (``r.rrx``), it is the quotient a / b of two numbers printed in the same table
  row or sentence, each of which a field of the rows rounds to (``HF a ms, fast b ms: r.rrx``),
  within the rounding that a and b carry into the quotient. A ratio whose operands
  are not shown comes from a generated block: searched over every pair of rows, almost any
  ratio is some pair's.

So a backed number is one the rows could have printed at the precision shown. It does not prove
that the sentence reads them right: generated blocks and review do that. CSV cells count where
they parse as numbers; list fields (per-step times) back nothing, or any number near some step
time would pass.
"""

from __future__ import annotations

import math
import re
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

UNIT_KIND = {
    "ms": ("time", 1e-3), "s": ("time", 1.0), "us": ("time", 1e-6), "µs": ("time", 1e-6),
    "μs": ("time", 1e-6),
    "GiB": ("memory", 2.0**30), "MiB": ("memory", 2.0**20),
    "GB/s": ("bandwidth", 1e9), "TB/s": ("bandwidth", 1e12),
    "TFLOP/s": ("flop rate", 1e12),
    "tokens/s": ("token rate", 1.0),
    "%": ("percent", 1.0),
}
"""A printed unit -> (its kind, its size in the kind's base unit)."""

FIELD_UNIT = {
    "ms": ("time", 1e-3), "s": ("time", 1.0), "us": ("time", 1e-6),
    "gib": ("memory", 2.0**30), "mib": ("memory", 2.0**20), "bytes": ("memory", 1.0),
    "gbps": ("bandwidth", 1e9), "tflops": ("flop rate", 1e12),
    "pct": ("percent", 1.0), "frac": ("percent", 100.0), "mfu": ("percent", 100.0),
    "mhz": ("frequency", 1e6), "w": ("power", 1.0), "watts": ("power", 1.0), "mb": ("memory", 1e6),
}
"""A unit word in a field's name (its last one, between '_') -> (kind, size in the kind's base
unit); `tokens_per_s` is the token rate."""

RATIO_FIELD = re.compile(r"ratio|speedup|factor|(?:^|_)vs(?:_|$)")
"""A field whose name says it holds a ratio (`speedup`, `vs_floor`): it backs a number printed
with x."""

NUMBER = re.compile(r"(?<![\w.,^/])(\d{1,3}(?:,\d{3})+|\d+)(?:\.(\d+))?(?![\w^/]|,\d{3}|\.\d)")
"""A number as prose prints it, with or without thousands separators; not one inside a word,
a version (2.11.0), an exponent (2^27) or a path."""


def field_unit(name: str) -> tuple[str, float] | None:
    """(kind, size) of the unit a field's name carries ('ratio' for a ratio), None when it names
    none."""
    if name.endswith("tokens_per_s"):
        return ("token rate", 1.0)
    for word in reversed(name.lower().split("_")):
        if word in FIELD_UNIT:
            return FIELD_UNIT[word]
    return ("ratio", 1.0) if RATIO_FIELD.search(name.lower()) else None


@dataclass(frozen=True)
class Printed:
    """A number as the prose prints it: value, decimals shown, unit ('' for none)."""

    value: float
    decimals: int
    unit: str = ""

    @property
    def slack(self) -> float:
        """Half a unit of the last printed digit, and a hair for binary floating point."""
        return 0.5 * 10.0**-self.decimals * (1 + 1e-9) + 1e-12


def parse(text: str) -> Printed:
    """The Printed of a hit like 'a.b ms', 'r.rrx', 'n,nnn MiB' (thousands separated) or 'p.p %'."""
    match = re.match(r"(\d{1,3}(?:,\d{3})+|\d+)(?:\.(\d+))?", text)
    if match is None:
        raise ValueError(f"no number at the start of {text!r}")
    whole, decimals = match.group(1).replace(",", ""), match.group(2) or ""
    unit = text[match.end():].strip()
    return Printed(float(f"{whole}.{decimals}" if decimals else whole), len(decimals), unit)


def numbers(text: str) -> list[Printed]:
    """Every number printed in `text` (units left off)."""
    return [parse(m.group(0)) for m in NUMBER.finditer(text)]


@dataclass
class Backing:
    """The values of a set of rows, sorted for the within-rounding test."""

    by_kind: dict[str, list[float]] = field(default_factory=dict)
    """Kind -> absolute values in the kind's base unit ('' for fields whose name carries none:
    they back no printed unit, only the operands of a printed ratio)."""
    raw: list[float] = field(default_factory=list)
    """Every absolute value as the row holds it (operands of a printed ratio)."""

    @classmethod
    def of(cls, rows: Iterable[dict[str, Any]]) -> Backing:
        """Index the scalar numeric fields of `rows` (nested dicts included, lists not)."""
        backing = cls()
        for row in rows:
            for name, value in _scalars(row):
                kind, size = field_unit(name) or ("", 1.0)
                backing.by_kind.setdefault(kind, []).append(abs(value) * size)
                backing.raw.append(abs(value))
        for values in (*backing.by_kind.values(), backing.raw):
            values.sort()
        return backing

    def backs(self, number: Printed, beside: Sequence[Printed] = ()) -> bool:
        """Whether the rows back `number`, printed with the numbers `beside` it (module docstring)."""
        low, high = number.value - number.slack, number.value + number.slack
        if number.unit == "x":
            return _any_in(self.by_kind.get("ratio", []), low, high) or self._quotient(number, beside)
        kind, size = UNIT_KIND[number.unit]
        return _any_in(self.by_kind.get(kind, []), low * size, high * size)

    def holds(self, number: Printed) -> bool:
        """Whether some value of the rows, as the row holds it, rounds to `number`."""
        return _any_in(self.raw, number.value - number.slack, number.value + number.slack)

    def _quotient(self, number: Printed, beside: Sequence[Printed]) -> bool:
        operands = [n for n in beside if n.value > 0 and self.holds(n)]
        for a in operands:
            for b in operands:
                if a is b:
                    continue
                quotient = a.value / b.value
                carried = quotient * (a.slack / a.value + b.slack / b.value)
                if abs(quotient - number.value) <= number.slack + carried:
                    return True
        return False


def _any_in(values: Sequence[float], low: float, high: float) -> bool:
    """Whether sorted `values` hold one within [low, high]."""
    return bisect_right(values, high) > bisect_left(values, low)


def _scalars(row: dict[str, Any]) -> Iterable[tuple[str, float]]:
    """(field name, value) of every finite number in `row`, a nested dict's fields by their own
    name; CSV strings that parse as numbers count; `_file` and other private keys do not."""
    for key, value in row.items():
        if key.startswith("_") or isinstance(value, bool):
            continue
        if isinstance(value, dict):
            yield from _scalars(value)
        elif isinstance(value, int | float):
            if math.isfinite(value):
                yield key, float(value)
        elif isinstance(value, str):
            try:
                number = float(value)
            except ValueError:
                continue
            if math.isfinite(number):
                yield key, number
