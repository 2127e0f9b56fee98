"""Every interval `lab.stats.intervals` (and `lab.machine.timing`) returns contains its point, exactly at the edges (issue 33).

A figure draws an interval as distances below and above its point; an interval that misses the point by a
rounding residue (0 of n passing: Wilson's lower bound 2.8e-17 above 0) or by a percentile bootstrap's skew
gives a negative distance, which matplotlib refuses.
"""

import math

import numpy as np
import pytest

from lab.stats.intervals import bootstrap, mean_interval, paired_difference, proportion, ratio_interval, wilson
from lab.machine.timing import ratio_interval as timing_ratio_interval

SIZES = (1, 2, 3, 6, 7, 10, 12, 40, 100, 1000)


@pytest.mark.parametrize("n", SIZES)
def test_wilson_contains_k_over_n_for_every_k_and_is_exact_at_the_edges(n):
    for k in range(n + 1):
        low, high = wilson(k, n)
        assert 0.0 <= low <= k / n <= high <= 1.0, (k, n, low, high)
    assert wilson(0, n)[0] == 0.0 and wilson(n, n)[1] == 1.0
    assert proportion(0, n).low == 0.0 and proportion(n, n).high == 1.0


def test_wilson_at_zero_of_n_was_the_reported_residue():
    # The defect: 0 of n gave a lower bound of 2.775558e-17 (centre - half, equal in exact arithmetic), so the
    # bar below the point (0 - low) was negative. The old formula, for the record of what the fix is for:
    z, n = 1.959963984540054, 12
    centre = (z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(z * z / (4 * n * n)) / (1 + z * z / n)
    assert max(0.0, centre - half) == pytest.approx(2.775558e-17, rel=1e-6)  # the old lower bound
    assert wilson(0, n)[0] == 0.0


@pytest.mark.parametrize("value", [0.1, 1 / 3, 1e-12, 7.0, -2.5])
@pytest.mark.parametrize("items", [2, 3, 10, 57])
def test_a_bootstrap_of_equal_samples_is_its_value(value, items):
    iv = mean_interval([value] * items)
    assert iv.low <= iv.value <= iv.high
    assert iv.low == pytest.approx(value, rel=1e-12) and iv.high == pytest.approx(value, rel=1e-12)
    r = ratio_interval([value] * items, [1.0] * items)
    assert r.low <= r.value <= r.high


def test_one_sample_still_has_no_interval():
    for iv in (mean_interval([0.25]), ratio_interval([3.0], [4.0])):
        assert np.isnan(iv.low) and np.isnan(iv.high) and not np.isnan(iv.value)


def test_paired_difference_of_identical_samples_is_zero_and_contains_it():
    a = [0.1, 0.7, 1 / 3, 2.0, 1e-12]
    d = paired_difference(a, a)
    assert d["difference"] == d["low"] == d["high"] == 0.0 and not d["distinguishable"]


def test_a_missing_item_leaves_a_paired_difference_undefined():
    d = paired_difference([1.0, float("nan"), 2.0], [0.0, 0.0, 0.0])
    assert np.isnan(d["difference"]) and np.isnan(d["low"]) and np.isnan(d["high"]) and not d["distinguishable"]


def _distinct(v: np.ndarray) -> np.ndarray:
    """The number of distinct values per resample (the items axis last)."""
    return (np.diff(np.sort(v, axis=-1), axis=-1) != 0).sum(-1) + 1.0


def test_a_skewed_bootstrap_is_widened_to_contain_its_point():
    # Ten distinct items: the point is 10 distinct values, while a resample of 10 draws holds all 10 only with
    # probability 10!/10**10 = 0.00036, so the plain 95% percentile interval (about 5 to 8) misses the point.
    iv = bootstrap(_distinct, np.arange(10.0))
    assert iv.value == 10.0 and iv.low <= iv.value <= iv.high and iv.high == 10.0 and iv.low < 10.0


def test_a_heavy_tailed_ratio_contains_its_point():
    rng = np.random.default_rng(3)
    for seed in range(20):
        num, den = rng.pareto(0.8, 6) + 1e-3, rng.pareto(0.8, 6) + 1e-3
        r = ratio_interval(num, den, seed=seed)
        assert r.low <= r.value <= r.high
        t = timing_ratio_interval(list(num), list(den), seed=seed)
        assert t[1] <= t[0] <= t[2]


def test_paired_difference_with_a_skewed_sample_contains_its_point():
    for seed in range(20):
        rng = np.random.default_rng(seed)
        a, b = rng.pareto(0.7, 4), rng.pareto(0.7, 4)
        d = paired_difference(a, b, seed=seed)
        assert d["low"] <= d["difference"] <= d["high"]


def test_a_timing_ratio_of_one_sample_each_is_that_ratio():
    assert timing_ratio_interval([2.0], [4.0]) == (0.5, 0.5, 0.5)


def test_one_pair_decides_no_comparison():
    """One item has no spread: NaN ends, not distinguishable (it was a zero-width interval that excluded 0)."""
    d = paired_difference([3.0], [1.0])
    assert d["difference"] == 2.0 and np.isnan(d["low"]) and np.isnan(d["high"]) and not d["distinguishable"]
