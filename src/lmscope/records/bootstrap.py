"""Resampling step times the way they vary, and widening an interval drawn from few units.

What a resample redraws is the unit that varies independently:

- rounds (`lmscope bench --rounds R`): separate processes, which differ by more than their steps
  do (clocks, placement, a neighbour's load between runs). A resample draws R rounds with
  replacement, each with its steps as measured. The steps are not redrawn inside the rounds as
  well: their noise is already in the spread between rounds, and redrawing them would count it
  twice and widen the interval for nothing (Davison & Hinkley 1997, section 3.8).
- one series of steps (one process): consecutive steps are correlated, so they are redrawn by a
  circular block bootstrap (Politis & Romano 1992): blocks of `b` consecutive steps, wrapping
  around the end, from random starts, until the series' length is reached.

The block length comes from the data: the lag-1 autocorrelation r of the log times
(bias-corrected by (1 + 3r) / n, Kendall's first-order term) put into Politis & White's (2004)
rule for the circular block bootstrap under an AR(1) model,
b = (3/2)^(1/3) (2r / (1 - r^2))^(2/3) n^(1/3), kept between 1 (r <= 0: independent steps, the
plain bootstrap) and n / 3 (at least three blocks).

A percentile interval drawn this way is too narrow, for three reasons that `widening` corrects:
- blocks of b steps see the correlation between steps less than b apart only, in part: the
  block bootstrap's variance is a Bartlett-window estimate of the series' long-run variance and
  falls short of it. Under the AR(1) model the block length comes from, the shortfall is known,
  (1 + r) / (1 - r) over 1 + 2 sum_{k<b} (1 - k/b) r^k (`block_bias`), and is put back.
- the bootstrap spread of a mean over k independent units (rounds, or blocks) is (k - 1) / k of
  the true one;
- its tails are normal where, from k units, they are Student's t.
The last two are Hesterberg's (2015) expanded percentile interval, here for two sides at once
(Welch-Satterthwaite's degrees of freedom).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from statistics import NormalDist

import numpy as np

MAX_CORRELATION = 0.95
"""Largest lag-1 autocorrelation the block length is computed from (the rule diverges at 1)."""
CHUNK_VALUES = 2_000_000
"""Resampled times held in memory at once (resamples are drawn in chunks of this many values)."""


def lag1_correlation(times: np.ndarray) -> float:
    """Lag-1 autocorrelation of the log times, bias-corrected (0 below 3 steps)."""
    if times.size < 3:
        return 0.0
    centred = np.log(times) - np.log(times).mean()
    squares = float(np.dot(centred, centred))
    if squares <= 0.0:
        return 0.0
    raw = float(np.dot(centred[1:], centred[:-1])) / squares
    return raw + (1.0 + 3.0 * raw) / times.size


def block_length(times: np.ndarray) -> int:
    """The circular block bootstrap's block length for a series (1: steps look independent)."""
    r = min(max(lag1_correlation(times), 0.0), MAX_CORRELATION)
    scale = 1.5 ** (1 / 3) * (2 * r / (1 - r * r)) ** (2 / 3)
    return int(min(max(round(scale * times.size ** (1 / 3)), 1), max(times.size // 3, 1)))


def block_bias(rounds: Sequence[np.ndarray]) -> float:
    """How much the block bootstrap's variance falls short of the true one under the AR(1) model
    of the block length (1 for rounds, whose steps are not redrawn)."""
    if len(rounds) > 1:
        return 1.0
    r = min(max(lag1_correlation(rounds[0]), 0.0), MAX_CORRELATION)
    block = block_length(rounds[0])
    seen = 1.0 + 2.0 * sum((1.0 - k / block) * r**k for k in range(1, block))
    return (1.0 + r) / (1.0 - r) / seen


def independent_units(rounds: Sequence[np.ndarray]) -> float:
    """How many independent units a resample draws: the rounds, or one series' blocks."""
    if len(rounds) > 1:
        return float(len(rounds))
    return rounds[0].size / float(block_length(rounds[0]))


def resampled_medians(rounds: Sequence[np.ndarray], rng: np.random.Generator, resamples: int) -> np.ndarray:
    """The median of all steps of each of `resamples` resamples: of the rounds, drawn with
    replacement, or of one series, drawn in blocks."""
    if len(rounds) == 1:
        draw = _block_resampler(rounds[0], rng)
        width = rounds[0].size
    else:
        draw = _round_resampler(rounds, rng)
        width = sum(times.size for times in rounds)
    chunk = max(1, CHUNK_VALUES // width)
    return np.concatenate([draw(min(chunk, resamples - done)) for done in range(0, resamples, chunk)])


def _round_resampler(rounds: Sequence[np.ndarray], rng: np.random.Generator):
    lengths = np.array([times.size for times in rounds])
    table = np.full((len(rounds), int(lengths.max())), np.nan)  # rounds padded to the longest
    for index, times in enumerate(rounds):
        table[index, : times.size] = times
    equal = bool(np.all(lengths == lengths[0]))

    def draw(resamples: int) -> np.ndarray:
        values = table[rng.integers(0, len(rounds), size=(resamples, len(rounds)))].reshape(resamples, -1)
        return np.median(values, axis=1) if equal else np.nanmedian(values, axis=1)

    return draw


def _block_resampler(times: np.ndarray, rng: np.random.Generator):
    n, block = times.size, block_length(times)
    position = np.arange(n)
    # position p of a resample lies in block p // b, at offset p % b from the block's random start
    # (wrapping around the end: start + offset < 2n)
    offset, which = position % block, position // block

    def draw(resamples: int) -> np.ndarray:
        starts = rng.integers(0, n, size=(resamples, -(-n // block)))
        index = starts[:, which] + offset
        return np.median(times[np.where(index >= n, index - n, index)], axis=1)

    return draw


def widening(variances: Sequence[float], units: Sequence[float], biases: Sequence[float],
             confidence: float) -> float:
    """How much to widen a percentile interval about its point (see the module docstring).

    sqrt(sum u / sum v) * t(p, df) / z(p), p = 1 - (1 - confidence) / 2, with u = v c k / (k - 1):
    each side's bootstrap variance v, over its k independent units, with its block bias c; and
    Student's t at Welch-Satterthwaite's df of the u in place of the normal quantile. 1 when
    nothing varies.
    """
    total = float(sum(variances))
    if total <= 0.0:
        return 1.0
    sides = list(zip(variances, units, biases, strict=True))
    corrected = sum(v * c * k / (k - 1) for v, k, c in sides)
    df = corrected**2 / sum((v * c * k / (k - 1)) ** 2 / (k - 1) for v, k, c in sides)
    p = 1.0 - (1.0 - confidence) / 2.0
    return math.sqrt(corrected / total) * t_quantile(p, df) / NormalDist().inv_cdf(p)


def t_quantile(p: float, df: float) -> float:
    """Student's t quantile at p in [0.5, 1) for real df >= 1.

    With t = sqrt(df) tan(theta) the density integrates as c cos(theta)^(df - 1) over
    [0, pi/2), bounded for df >= 1: its cumulative integral on a fine grid is inverted directly
    (from df 30 on, over t up to 12 only, where all but 1e-12 of the mass lies).
    """
    if not 0.5 <= p < 1.0 or not df >= 1.0:
        raise ValueError(f"t_quantile needs 0.5 <= p < 1 and df >= 1, got p={p!r}, df={df!r}")
    df = min(df, 1e6)  # beyond, t is the normal to 1e-6 (and cos(theta)^df loses precision)
    top = math.pi / 2 if df < 30 else math.atan(12.0 / math.sqrt(df))
    theta = np.linspace(0.0, top, 8193)
    density = np.cos(theta) ** (df - 1.0)
    scale = math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2)) / math.sqrt(math.pi)
    cumulative = np.concatenate([[0.0], np.cumsum((density[1:] + density[:-1]) / 2 * np.diff(theta))])
    angle = float(np.interp(p - 0.5, cumulative * scale, theta))
    return math.sqrt(df) * math.tan(angle)
