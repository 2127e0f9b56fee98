"""lab.stats.intervals: the bootstrap covers what it should, refuses bad input, and pairs comparisons."""

import numpy as np
import pytest

from lab.stats.intervals import (Interval, bootstrap, mean_interval, proportion, ratio_interval, significance,
                           wilson)


def test_bootstrap_mean_covers_the_true_mean_about_95_percent_of_the_time():
    rng = np.random.default_rng(0)
    hits = sum(mean_interval(rng.normal(1.0, 1.0, 30), resamples=500, seed=i).excludes(1.0) is False
               for i in range(200))
    assert 0.88 <= hits / 200 <= 0.99  # percentile bootstrap at n=30 is slightly narrow


def test_ratio_of_sums_is_not_the_mean_of_ratios():
    # Two items: 1 token in 1 s and 99 tokens in 1 s: pooled rate 50/s, mean of per-item rates also 50;
    # with 1/1 and 99/9 the pooled rate is 10/s while the mean of ratios is 6.0.
    r = ratio_interval([1, 99], [1, 9])
    assert r.value == pytest.approx(10.0)
    assert r.low <= r.value <= r.high


def test_paired_comparison_is_tighter_than_the_items_spread():
    rng = np.random.default_rng(1)
    difficulty = rng.normal(0, 5, 40)  # items differ a lot, methods differ by a constant 0.3
    a, b = difficulty + 0.3 + rng.normal(0, 0.05, 40), difficulty
    paired = bootstrap(lambda x, y: (x - y).mean(-1), a, b)
    assert significance(paired) == "distinguishable"
    unpaired_width = mean_interval(a).high - mean_interval(a).low
    assert paired.high - paired.low < unpaired_width / 10


def test_significance_words_and_interval_columns():
    assert significance(Interval(0.1, -0.2, 0.4)) == "not distinguishable"
    assert significance(Interval(1.2, 1.05, 1.3), null=1.0) == "distinguishable"
    assert Interval(1, 0, 2).columns("x") == {"x": 1, "x_low": 0, "x_high": 2}


def test_proportion_is_wilson():
    p = proportion(40, 40)
    assert p.value == 1.0 and (p.low, p.high) == wilson(40, 40) and p.low == pytest.approx(0.912, abs=1e-3)


@pytest.mark.parametrize("columns", [(), ([],), ([1, 2], [1, 2, 3]), ([[1, 2]],)])
def test_bootstrap_refuses_empty_or_ragged_columns(columns):
    with pytest.raises(ValueError, match="bootstrap needs"):
        bootstrap(lambda *c: c[0].mean(-1), *columns)


def test_bootstrap_refuses_a_stat_that_does_not_reduce_items():
    with pytest.raises(ValueError, match="one value per resample"):
        bootstrap(lambda v: v, [1.0, 2.0, 3.0])


def test_one_item_has_no_interval_and_decides_no_comparison():
    one = mean_interval([2.5])
    assert one.value == 2.5 and np.isnan(one.low) and np.isnan(one.high)
    assert significance(one) == "not distinguishable"
