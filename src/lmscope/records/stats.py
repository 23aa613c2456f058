"""Ratios of median times, and medians, with confidence intervals that hold for real step times.

A speed claim is a ratio of two medians: the base's median step time over the other's (above 1:
the other is faster). Its interval is a percentile bootstrap that resamples what varies
independently (`lmscope.records.bootstrap`): the rounds of `lmscope bench --rounds R` (separate
processes), or, within one process, blocks of consecutive steps (steps are correlated, so
resampling them one by one would make the interval too narrow). The percentile interval is then
widened for the few independent units it rests on (Hesterberg's expanded percentile interval).
The resampling uses a fixed seed: the same times always give the same interval.

- `ratio_interval(base_times, other_times)`: one series of steps per side (one process each).
- `ratio_interval_rounds(base_rounds, other_rounds)`: a list of rounds per side, each a list of
  step times. The ratio is of the pooled medians (all steps of all rounds): the median that
  tables show for a pooled point (`lmscope.report.rounds`), robust to a slow step and to a slow
  round alike. Rounds with more steps weigh more in it.
- `median_interval(times)` and `median_interval_rounds(rounds)`: the interval of one median, whose
  relative half-width is what adaptive sampling (`lmscope.measure.sampling`) drives down.

Below MIN_STEPS steps or MIN_ROUNDS rounds on a side there is no interval (nothing about the
spread can be known from fewer): the result's `low` and `high` are None and `reason` says why,
and `as_text()` prints the ratio with that reason in place of the bracket. A ratio whose
interval holds 1 is inside the noise: the two cannot be told apart from these times.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from lmscope.records.bootstrap import block_bias, independent_units, resampled_medians, widening

RESAMPLES = 4000
"""Bootstrap resamples per interval: the more, the less its bounds depend on the draw (their own
Monte Carlo error), at a cost linear in the count."""
SEED = 20261123
"""Fixed seed of the resampling: an interval is a function of the times alone."""
MIN_STEPS = 5
"""Fewest steps a side needs for an interval."""
MIN_ROUNDS = 3
"""Fewest rounds a side needs for a round-level interval (with two, the spread between rounds
rests on one difference)."""


@dataclass(frozen=True)
class RatioInterval:
    """base_median / other_median with its bootstrap interval (None: too few times, see reason)."""

    ratio: float
    low: float | None
    high: float | None
    confidence: float
    n_base: int
    n_other: int
    rounds_base: int = 1
    rounds_other: int = 1
    reason: str | None = None
    """Why there is no interval (low and high None), else None."""

    @property
    def bounded(self) -> bool:
        """Whether there is an interval."""
        return self.low is not None and self.high is not None

    def holds(self, value: float) -> bool:
        """Whether the interval holds `value` (False without an interval)."""
        return self.bounded and bool(self.low <= value <= self.high)  # type: ignore[operator]

    @property
    def within_noise(self) -> bool:
        """Whether the interval holds 1: no difference can be claimed (False without an interval:
        check `bounded` first)."""
        return self.holds(1.0)

    def as_text(self, digits: int = 2) -> str:
        """'R.RRx [L.LL, H.HH]' (ratio and interval at `digits` decimals), '~' in front when the
        difference is inside the noise, or 'R.RRx (no interval: REASON)' (REASON as in `reason`)."""
        if not self.bounded:
            return f"{self.ratio:.{digits}f}x (no interval: {self.reason})"
        mark = "~" if self.within_noise else ""
        return f"{mark}{self.ratio:.{digits}f}x [{self.low:.{digits}f}, {self.high:.{digits}f}]"


@dataclass(frozen=True)
class MedianInterval:
    """A median with its bootstrap interval (None: too few times, see reason)."""

    median: float
    low: float | None
    high: float | None
    confidence: float
    n: int
    rounds: int = 1
    reason: str | None = None

    @property
    def relative_half_width(self) -> float | None:
        """(high - low) / 2 / median: the precision adaptive sampling aims at (None: no interval)."""
        if self.low is None or self.high is None:
            return None
        return (self.high - self.low) / 2.0 / self.median


def ratio_interval(
    base_times: Sequence[float], other_times: Sequence[float], confidence: float = 0.95
) -> RatioInterval:
    """median(base) / median(other) with a block-bootstrap interval at `confidence`.

    Both sequences need at least one time, every time positive; with fewer than MIN_STEPS on a
    side the result has no interval.
    """
    return ratio_interval_rounds([base_times], [other_times], confidence)


def ratio_interval_rounds(
    base_rounds: Sequence[Sequence[float]],
    other_rounds: Sequence[Sequence[float]],
    confidence: float = 0.95,
) -> RatioInterval:
    """Pooled median(base) / pooled median(other) with a bootstrap interval over the rounds.

    Each side is a list of rounds, each round its step times. One round a side is a plain step
    series (`ratio_interval`); with more, every side needs MIN_ROUNDS rounds for an interval.
    """
    base, other = _rounds(base_rounds, "base"), _rounds(other_rounds, "other")
    _check_confidence(confidence)
    ratio = float(np.median(np.concatenate(base)) / np.median(np.concatenate(other)))
    counts = dict(confidence=confidence, n_base=sum(r.size for r in base), n_other=sum(r.size for r in other),
                  rounds_base=len(base), rounds_other=len(other))
    reason = _too_few(base, other)
    if reason:
        return RatioInterval(ratio=ratio, low=None, high=None, reason=reason, **counts)
    rng = np.random.default_rng(SEED)
    base_logs = np.log(resampled_medians(base, rng, RESAMPLES))
    other_logs = np.log(resampled_medians(other, rng, RESAMPLES))
    factor = widening([float(base_logs.var()), float(other_logs.var())],
                      [independent_units(base), independent_units(other)],
                      [block_bias(base), block_bias(other)], confidence)
    low, high = _expanded(math.log(ratio), base_logs - other_logs, confidence, factor)
    return RatioInterval(ratio=ratio, low=min(low, ratio), high=max(high, ratio), **counts)


def median_interval(
    times: Sequence[float], confidence: float = 0.95, resamples: int = RESAMPLES
) -> MedianInterval:
    """The median of one step series with its block-bootstrap interval."""
    return median_interval_rounds([times], confidence, resamples)


def median_interval_rounds(
    rounds: Sequence[Sequence[float]], confidence: float = 0.95, resamples: int = RESAMPLES
) -> MedianInterval:
    """The pooled median of rounds of steps with its bootstrap interval over the rounds."""
    series = _rounds(rounds, "")
    _check_confidence(confidence)
    median = float(np.median(np.concatenate(series)))
    counts = dict(confidence=confidence, n=sum(r.size for r in series), rounds=len(series))
    reason = _too_few(series)
    if reason:
        return MedianInterval(median=median, low=None, high=None, reason=reason, **counts)
    logs = np.log(resampled_medians(series, np.random.default_rng(SEED), resamples))
    factor = widening([float(logs.var())], [independent_units(series)], [block_bias(series)], confidence)
    low, high = _expanded(math.log(median), logs, confidence, factor)
    return MedianInterval(median=median, low=min(low, median), high=max(high, median), **counts)


def _expanded(point: float, resampled: np.ndarray, confidence: float, factor: float) -> tuple[float, float]:
    """The percentile interval of the log `resampled`, widened about the log `point` by `factor`,
    as times."""
    tail = (1.0 - confidence) / 2.0
    low, high = np.quantile(resampled, [tail, 1.0 - tail])
    return math.exp(point + factor * (low - point)), math.exp(point + factor * (high - point))


def _too_few(*sides: list[np.ndarray]) -> str | None:
    """Why these sides (lists of rounds) are too small for an interval, or None."""
    where = " on one side" if len(sides) > 1 else ""
    rounds = min(len(side) for side in sides)
    if max(len(side) for side in sides) > 1 and rounds < MIN_ROUNDS:
        return f"{rounds} round{'s' * (rounds != 1)}{where}, need {MIN_ROUNDS}"
    steps = min(sum(r.size for r in side) for side in sides)
    if steps < MIN_STEPS:
        return f"{steps} time{'s' * (steps != 1)}{where}, need {MIN_STEPS}"
    return None


def _check_confidence(confidence: float) -> None:
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must lie between 0 and 1, got {confidence!r}")


def _rounds(rounds: Sequence[Sequence[float]], name: str) -> list[np.ndarray]:
    label = f"{name} " if name else ""
    if len(rounds) == 0:
        raise ValueError(f"no {label}rounds: a median needs at least one round of steps")
    return [_checked(times, f"{label}round {index}" if len(rounds) > 1 else name or "step")
            for index, times in enumerate(rounds)]


def _checked(times: Sequence[float], name: str) -> np.ndarray:
    values = np.asarray(list(times), dtype=np.float64)
    if values.size == 0:
        raise ValueError(f"no {name} times: a median needs at least one step on each side")
    if not np.all(np.isfinite(values)) or np.any(values <= 0):
        raise ValueError(f"{name} times must be finite and positive")
    return values
