"""The ratio interval: exact on known answers, honest about noise, correlated steps and rounds.

The coverage tests draw from fixed seeds, so each is deterministic: a known ratio, many trials,
and the share of 95 % intervals that hold it.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from lmscope.records.bootstrap import block_length, t_quantile
from lmscope.records.stats import (
    MIN_ROUNDS,
    MIN_STEPS,
    median_interval,
    ratio_interval,
    ratio_interval_rounds,
)

RATIO = 1.3


def ar1_times(rng: np.random.Generator, n: int, r: float, scale: float = 1.0,
              sigma: float = 0.05) -> np.ndarray:
    """Lognormal step times whose logs are a stationary AR(1) series with lag-1 correlation r."""
    noise = rng.normal(0.0, sigma, n)
    logs = np.empty(n)
    logs[0] = noise[0] / math.sqrt(1.0 - r * r)
    for i in range(1, n):
        logs[i] = r * logs[i - 1] + noise[i]
    return scale * np.exp(logs)


def coverage(r: float, n: int, trials: int, seed: int, confidence: float = 0.95) -> float:
    rng = np.random.default_rng(seed)
    held = sum(ratio_interval(ar1_times(rng, n, r, RATIO), ar1_times(rng, n, r), confidence).holds(RATIO)
               for _ in range(trials))
    return held / trials


def test_correlated_steps_keep_the_coverage():
    # lag-1 correlation 0.7, 30 steps a side: a plain bootstrap of the steps covers about 2 in 3
    assert coverage(0.7, 30, trials=300, seed=34) >= 0.90


def test_independent_steps_are_covered_at_the_stated_confidence():
    # the bootstrap of a median at 30 steps is a little conservative
    assert 0.93 <= coverage(0.0, 30, trials=300, seed=8) <= 0.995


def test_the_width_is_that_of_the_stated_confidence():
    # for many independent steps the log median is normal with sd sigma sqrt(pi / 2n), so a 95 %
    # interval of the log ratio has half-width 1.96 sigma sqrt(pi / n); a 90 % interval labelled
    # 95 % is 0.84 of it, a 99 % one 1.31
    rng = np.random.default_rng(2)
    n, sigma = 1000, 0.05
    widths = [math.log(r.high / r.low) / 2 / (1.959964 * sigma * math.sqrt(math.pi / n))
              for r in (ratio_interval(rng.lognormal(0.3, sigma, n), rng.lognormal(0.0, sigma, n))
                        for _ in range(10))]
    assert 0.93 <= float(np.mean(widths)) <= 1.07


def test_a_single_time_per_side_gives_no_interval_and_says_why():
    result = ratio_interval([21.4], [1.0])
    assert result.ratio == pytest.approx(21.4) and result.low is None and result.high is None
    assert not result.bounded and not result.within_noise and not result.holds(21.4)
    assert result.as_text() == "21.40x (no interval: 1 time on one side, need 5)"
    short = ratio_interval([10.0] * 20, [5.0] * 4)
    assert short.as_text() == f"2.00x (no interval: 4 times on one side, need {MIN_STEPS})"
    assert ratio_interval([10.0] * MIN_STEPS, [5.0] * MIN_STEPS).bounded


def test_rounds_with_a_run_to_run_offset_are_covered_where_one_run_a_side_is_not():
    rng = np.random.default_rng(21)
    rounds_held = steps_held = 0
    trials = 120
    for _ in range(trials):
        # every round (a process) is off by its own factor, 5 % spread, its steps 3 % around it
        base = [RATIO * np.exp(rng.normal(0, 0.05) + rng.normal(0, 0.03, 20)) for _ in range(5)]
        other = [np.exp(rng.normal(0, 0.05) + rng.normal(0, 0.03, 20)) for _ in range(5)]
        rounds_held += ratio_interval_rounds(base, other).holds(RATIO)
        # the steps of one process cannot see its offset: their interval misses most of the time
        steps_held += ratio_interval(base[0], other[0]).holds(RATIO)
    assert rounds_held / trials >= 0.90
    assert steps_held / trials <= 0.6


def test_rounds_give_the_pooled_median_ratio_and_need_enough_rounds():
    base = [[10.0, 10.4, 10.2], [11.0, 10.8, 10.9], [10.5, 10.6, 10.1]]
    other = [[5.0, 5.2], [5.1, 5.3], [5.6, 5.2]]
    result = ratio_interval_rounds(base, other)
    assert result.ratio == pytest.approx(np.median(sum(base, [])) / np.median(sum(other, [])))
    assert (result.n_base, result.n_other, result.rounds_base, result.rounds_other) == (9, 6, 3, 3)
    assert result.bounded and result.low < result.ratio < result.high
    two = ratio_interval_rounds(base[:2], other)
    assert two.as_text() == f"{two.ratio:.2f}x (no interval: 2 rounds on one side, need {MIN_ROUNDS})"
    one_run = sum(base, []), sum(other, [])
    assert ratio_interval_rounds([one_run[0]], [one_run[1]]) == ratio_interval(*one_run)


def test_a_constant_factor_gives_that_ratio_with_a_tight_interval():
    rng = np.random.default_rng()
    other = rng.uniform(9.0, 11.0, size=41)
    result = ratio_interval(other * 1.5, other)
    assert result.ratio == pytest.approx(1.5, rel=1e-12)
    assert result.holds(1.5)
    assert not result.within_noise


def test_identical_distributions_are_inside_the_noise_most_of_the_time():
    rng = np.random.default_rng()
    inside = sum(
        ratio_interval(rng.normal(10.0, 0.5, 30), rng.normal(10.0, 0.5, 30)).within_noise
        for _ in range(200)
    )
    assert 180 <= inside <= 200


def test_a_clear_difference_is_outside_the_noise_and_reads_as_text():
    rng = np.random.default_rng()
    result = ratio_interval(rng.normal(20.0, 0.2, 20), rng.normal(10.0, 0.1, 20))
    assert result.ratio == pytest.approx(2.0, rel=0.05)
    assert not result.within_noise
    assert result.as_text().endswith("]") and not result.as_text().startswith("~")


def test_the_interval_is_a_function_of_the_times():
    base, other = [10.2, 10.4, 9.9, 10.1, 10.8], [9.1, 9.3, 9.0, 9.6, 9.2]
    assert ratio_interval(base, other) == ratio_interval(base, other)


def test_the_median_interval_narrows_with_more_steps():
    rng = np.random.default_rng()
    times = rng.lognormal(0.0, 0.05, 400)
    few, many = median_interval(times[:20]), median_interval(times)
    assert few.relative_half_width > many.relative_half_width > 0
    assert many.low < many.median < many.high and many.median == pytest.approx(np.median(times))
    assert median_interval(times[:4]).relative_half_width is None


def test_block_length_grows_with_the_correlation():
    rng = np.random.default_rng(1)  # seeded: a shuffled series gets a block of 3 in about 6 % of draws
    assert block_length(ar1_times(rng, 200, 0.0) * 0 + np.arange(1.0, 201.0)[rng.permutation(200)]) <= 2
    assert block_length(ar1_times(rng, 200, 0.9)) >= 5
    assert block_length(ar1_times(rng, 6, 0.9)) <= 2  # at least three blocks


@pytest.mark.parametrize("p,df,expected", [
    (0.975, 1, 12.7062), (0.975, 2, 4.30265), (0.995, 3, 5.84091), (0.975, 10, 2.22814),
    (0.975, 100, 1.98397), (0.975, 1e9, 1.95996)])
def test_t_quantiles_match_the_tables(p, df, expected):
    assert t_quantile(p, df) == pytest.approx(expected, abs=2e-4)


@pytest.mark.parametrize("base,other", [([], [1.0]), ([1.0], []), ([0.0], [1.0]), ([float("nan")], [1.0])])
def test_bad_times_are_refused(base, other):
    with pytest.raises(ValueError):
        ratio_interval(base, other)


def test_bad_rounds_and_confidence_are_refused():
    with pytest.raises(ValueError, match="no base rounds"):
        ratio_interval_rounds([], [[1.0]])
    with pytest.raises(ValueError, match="base round 1"):
        ratio_interval_rounds([[1.0], []], [[1.0]])
    with pytest.raises(ValueError, match="confidence"):
        ratio_interval([1.0] * 5, [1.0] * 5, confidence=1.5)


def test_a_trend_widens_the_interval_beside_the_same_times_shuffled():
    rng = np.random.default_rng()
    ramp = np.linspace(10.0, 11.0, 40) * rng.lognormal(0.0, 0.002, 40)
    shuffled = rng.permutation(ramp)
    other = rng.lognormal(np.log(5.0), 0.01, 40)
    trend, flat = ratio_interval(ramp, other), ratio_interval(shuffled, other)
    assert trend.ratio == flat.ratio and block_length(ramp) > block_length(shuffled)
    assert math.log(trend.high / trend.low) > 3 * math.log(flat.high / flat.low)
