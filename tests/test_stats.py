"""The ratio interval: exact on known answers, honest about noise."""

from __future__ import annotations

import numpy as np
import pytest

from lmscope.stats import ratio_interval


def test_a_constant_factor_gives_that_ratio_with_a_tight_interval():
    rng = np.random.default_rng()
    other = rng.uniform(9.0, 11.0, size=41)
    result = ratio_interval(other * 1.5, other)
    assert result.ratio == pytest.approx(1.5, rel=1e-12)
    assert result.low <= 1.5 <= result.high
    assert not result.within_noise


def test_identical_distributions_are_inside_the_noise_most_of_the_time():
    rng = np.random.default_rng()
    inside = sum(
        ratio_interval(rng.normal(10.0, 0.5, 30), rng.normal(10.0, 0.5, 30)).within_noise
        for _ in range(200)
    )
    # a 95 % interval covers the true ratio 1 in about 95 % of draws; the bootstrap of a median
    # is somewhat conservative or liberal at n=30, so allow a wide band that a broken one misses
    assert 170 <= inside <= 200


def test_coverage_of_a_known_ratio():
    rng = np.random.default_rng()
    covered = 0
    for _ in range(200):
        base = rng.lognormal(np.log(12.0), 0.05, 25)
        other = rng.lognormal(np.log(10.0), 0.05, 25)
        result = ratio_interval(base, other)
        covered += result.low <= 1.2 <= result.high
    assert 170 <= covered <= 200


def test_a_clear_difference_is_outside_the_noise_and_reads_as_text():
    rng = np.random.default_rng()
    result = ratio_interval(rng.normal(20.0, 0.2, 20), rng.normal(10.0, 0.1, 20))
    assert result.ratio == pytest.approx(2.0, rel=0.05)
    assert not result.within_noise
    assert result.as_text().endswith("]") and not result.as_text().startswith("~")


def test_the_interval_is_a_function_of_the_times():
    base, other = [10.2, 10.4, 9.9, 10.1, 10.8], [9.1, 9.3, 9.0, 9.6, 9.2]
    assert ratio_interval(base, other) == ratio_interval(base, other)


@pytest.mark.parametrize("base,other", [([], [1.0]), ([1.0], []), ([0.0], [1.0]), ([float("nan")], [1.0])])
def test_bad_times_are_refused(base, other):
    with pytest.raises(ValueError):
        ratio_interval(base, other)
