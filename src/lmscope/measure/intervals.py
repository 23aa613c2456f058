"""The union of half-open time intervals [start, end): busy time of kernels that may overlap (two
streams, compute and communication), host time inside nested ranges, an op's self-time pieces.

One rule for all of them: an interval with end <= start covers nothing; intervals that overlap,
nest or touch (one ends where the next starts) join into one.
"""

from __future__ import annotations

from collections.abc import Iterable

Interval = tuple[int, int]


def merged(intervals: Iterable[Interval]) -> list[Interval]:
    """The union of the intervals as disjoint, non-touching intervals in time order."""
    out: list[Interval] = []
    for start, end in sorted(intervals):
        if end <= start:
            continue
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def covered_ns(intervals: Iterable[Interval]) -> int:
    """Length of the union of the intervals (time covered by at least one)."""
    return sum(end - start for start, end in merged(intervals))
