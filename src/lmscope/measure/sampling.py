"""When to stop timing steps: once the median is known to the asked precision, or the time budget
is spent, after at least the minimum count (as pyperf and torch.utils.benchmark's
adaptive_autorange do).

The precision is the relative half-width of the median's 95 % interval
(`lmscope.records.stats.median_interval`: a block bootstrap, so correlated steps do not pass for
independent ones; no interval below `lmscope.records.stats.MIN_STEPS` steps). It is checked once the
minimum steps are timed and then each time the count has grown by a tenth, so the checks cost
little beside the steps (they run between steps, outside the timed region).

Why a point stopped (`stop_reason` of its row): `target` (the half-width reached `target_ci`),
`time` (the budget `max_time_s` ran out first), `steps` (no target: exactly the minimum count),
`limit` (`lmscope.inputs.limits.MAX_STEPS`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from lmscope.inputs.limits import MAX_STEPS, MAX_TIMEOUT_S
from lmscope.records.stats import median_interval

CONFIDENCE = 0.95
"""Confidence of the median's interval whose half-width is the precision."""
CHECK_RESAMPLES = 1000
"""Bootstrap resamples of a precision check (its Monte Carlo error is a few % of the half-width)."""


@dataclass(frozen=True, kw_only=True)
class StopRule:
    """How long to keep timing steps after the minimum count."""

    target_ci: float = 0.0
    """Relative half-width of the median's 95 % interval to reach (0.01: +-1 %); 0: no target,
    time exactly the minimum count."""
    max_time_s: float = 10.0
    """Seconds the timed steps may take while the target is not reached (the minimum count always
    runs)."""

    def __post_init__(self) -> None:
        check_stop_rule(self.target_ci, self.max_time_s)


def check_stop_rule(target_ci: object, max_time_s: object) -> None:
    """ValueError naming the flag and a fix for a target or budget that cannot be used."""
    if not isinstance(target_ci, int | float) or isinstance(target_ci, bool) or not 0 <= target_ci < 1:
        raise ValueError(f"target_ci must be a relative half-width from 0 (off) up to 1, got {target_ci!r}: "
                         "pass --target-ci 0.01 (+-1 % of the median) or --target-ci off")
    if (not isinstance(max_time_s, int | float) or isinstance(max_time_s, bool)
            or not math.isfinite(max_time_s) or not 0 < max_time_s <= MAX_TIMEOUT_S):
        raise ValueError(f"max_time_s must be a positive number of seconds up to {MAX_TIMEOUT_S:g}, got "
                         f"{max_time_s!r}: pass --max-time 10")


def parse_target(text: str) -> float:
    """--target-ci: a relative half-width such as 0.01, or off (0)."""
    if text.strip().lower() in ("off", "none", "0"):
        return 0.0
    try:
        return float(text)
    except ValueError:
        raise ValueError(
            f"--target-ci takes a relative half-width such as 0.01 (+-1 %) or off, got {text!r}") from None


def precision(times_ms: list[float]) -> float | None:
    """Relative half-width of the median's 95 % interval (None: too few steps for one)."""
    return median_interval(times_ms, CONFIDENCE, CHECK_RESAMPLES).relative_half_width


class Sampler:
    """Says, after each step, whether to stop and why; keeps the last precision it computed."""

    def __init__(self, rule: StopRule, minimum: int) -> None:
        self.rule = rule
        self.minimum = minimum
        self._next_check = minimum

    def stop_reason(self, times_ms: list[float], elapsed_s: float) -> str | None:
        """Why to stop after these steps, or None to time another."""
        count = len(times_ms)
        if count < self.minimum:
            return None
        if not self.rule.target_ci:
            return "steps"
        if count >= self._next_check:
            self._next_check = count + max(1, count // 10)
            reached = precision(times_ms)
            if reached is not None and reached <= self.rule.target_ci:
                return "target"
        if elapsed_s >= self.rule.max_time_s:
            return "time"
        return "limit" if count >= MAX_STEPS else None


def sampling_metrics(times_ms: list[float], rule: StopRule, stop_reason: str) -> dict[str, Any]:
    """What a row records of its sampling: the precision reached, the target, why it stopped."""
    return {"median_ci_rel": precision(times_ms), "ci_target": rule.target_ci or None,
            "stop_reason": stop_reason}
