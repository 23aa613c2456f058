"""The union of [start, end) intervals that every busy-time and self-time figure is built on."""

from __future__ import annotations

import random

import pytest

from lmscope.measure.intervals import covered_ns, merged


@pytest.mark.parametrize(("intervals", "union"), [
    ([], []),
    ([(3, 3), (7, 5)], []),  # empty and reversed intervals cover nothing
    ([(0, 10), (5, 15)], [(0, 15)]),  # overlapping
    ([(0, 20), (5, 9), (11, 12)], [(0, 20)]),  # nested
    ([(0, 4), (4, 9)], [(0, 9)]),  # touching: one interval, no seam
    ([(12, 13), (5, 9), (0, 3), (2, 4), (9, 10)], [(0, 4), (5, 10), (12, 13)]),  # unsorted
    ([(1, 2), (2, 2), (2, 5)], [(1, 5)]),
])
def test_the_union_joins_overlapping_nested_and_touching_intervals(intervals, union):
    assert merged(intervals) == union
    assert covered_ns(intervals) == sum(end - start for start, end in union)


def test_covered_time_is_the_count_of_covered_instants():
    rng = random.Random(7)
    for _ in range(50):
        intervals = [(start, start + rng.randrange(-3, 12)) for start in
                     (rng.randrange(0, 61) for _ in range(rng.randrange(0, 9)))]
        instants = {t for start, end in intervals for t in range(start, end)}
        assert covered_ns(intervals) == len(instants)
        pieces = merged(intervals)
        assert all(a_end < b_start for (_, a_end), (b_start, _) in zip(pieces, pieces[1:], strict=False))
