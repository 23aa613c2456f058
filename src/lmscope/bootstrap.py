"""`lmscope.bootstrap`, where docs/method.md points: resampling step times the way they vary.

The code lives in `lmscope.records.bootstrap`; this module re-exports its public names.
"""

from lmscope.records.bootstrap import (
    block_bias,
    block_length,
    independent_units,
    lag1_correlation,
    resampled_medians,
    t_quantile,
    widening,
)

__all__ = [
    "block_bias",
    "block_length",
    "independent_units",
    "lag1_correlation",
    "resampled_medians",
    "t_quantile",
    "widening",
]
