"""Ratios between two sets of per-step times, with a confidence interval.

A speed claim is a ratio of two medians: the base's median step time over the other's (above 1:
the other is faster). The interval comes from a percentile bootstrap: both sets of per-step times
are resampled with replacement, the ratio of the resampled medians is taken each time, and the
interval is the central `confidence` share of those ratios. The resampling uses a fixed seed, so
the same times always give the same interval. A ratio whose interval holds 1 is inside the noise:
the two cannot be told apart from these steps.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

RESAMPLES = 4000
"""Bootstrap resamples per interval (the interval's own Monte Carlo error is well under 1 %)."""
SEED = 20261123
"""Fixed seed of the resampling: an interval is a function of the times alone."""


@dataclass(frozen=True)
class RatioInterval:
    """base_median / other_median with its bootstrap interval."""

    ratio: float
    low: float
    high: float
    confidence: float
    n_base: int
    n_other: int

    @property
    def within_noise(self) -> bool:
        """Whether the interval holds 1: no difference can be claimed from these steps."""
        return self.low <= 1.0 <= self.high

    def as_text(self, digits: int = 2) -> str:
        """'1.48x [1.45, 1.51]', with '~' in front when the difference is inside the noise."""
        mark = "~" if self.within_noise else ""
        return f"{mark}{self.ratio:.{digits}f}x [{self.low:.{digits}f}, {self.high:.{digits}f}]"


def ratio_interval(
    base_times: Sequence[float], other_times: Sequence[float], confidence: float = 0.95
) -> RatioInterval:
    """median(base) / median(other) with a percentile-bootstrap interval at `confidence`.

    Both sequences need at least one time, every time positive. With one time on each side the
    interval is that single ratio (no spread can be known): say so where it is shown.
    """
    base = _checked(base_times, "base")
    other = _checked(other_times, "other")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must lie between 0 and 1, got {confidence!r}")
    ratio = float(np.median(base) / np.median(other))
    rng = np.random.default_rng(SEED)
    base_medians = np.median(rng.choice(base, size=(RESAMPLES, base.size), replace=True), axis=1)
    other_medians = np.median(rng.choice(other, size=(RESAMPLES, other.size), replace=True), axis=1)
    ratios = base_medians / other_medians
    tail = (1.0 - confidence) / 2.0
    low, high = np.quantile(ratios, [tail, 1.0 - tail])
    return RatioInterval(ratio=ratio, low=float(min(low, ratio)), high=float(max(high, ratio)),
                         confidence=confidence, n_base=int(base.size), n_other=int(other.size))


def _checked(times: Sequence[float], name: str) -> np.ndarray:
    values = np.asarray(list(times), dtype=np.float64)
    if values.size == 0:
        raise ValueError(f"no {name} times: a ratio needs at least one step on each side")
    if not np.all(np.isfinite(values)) or np.any(values <= 0):
        raise ValueError(f"{name} times must be finite and positive")
    return values
