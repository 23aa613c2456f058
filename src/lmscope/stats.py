"""`lmscope.stats`, where users import it: ratios of median times and medians with their intervals.

The code lives in `lmscope.records.stats`; this module re-exports its public names.
"""

from lmscope.records.stats import (
    MIN_ROUNDS,
    MIN_STEPS,
    RESAMPLES,
    SEED,
    MedianInterval,
    RatioInterval,
    median_interval,
    median_interval_rounds,
    ratio_interval,
    ratio_interval_rounds,
)

__all__ = [
    "MIN_ROUNDS",
    "MIN_STEPS",
    "RESAMPLES",
    "SEED",
    "MedianInterval",
    "RatioInterval",
    "median_interval",
    "median_interval_rounds",
    "ratio_interval",
    "ratio_interval_rounds",
]
