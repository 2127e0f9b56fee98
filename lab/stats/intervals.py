"""Uncertainty of the figures the studies report: a rate's interval, and whether two paired measurements differ.

- `wilson(k, n)`: the Wilson score interval of a proportion (Wilson, 1927), which stays inside [0, 1] and is
  not degenerate at 0 or n successes (the normal approximation says 100% +- 0 for 40 of 40; Wilson says
  91.2-100%).
- `paired_difference(a, b)`: the mean of a - b over paired items (the same prompt under two methods) and its
  percentile-bootstrap interval, resampling items; the difference is *distinguishable* from zero when the
  interval excludes it. Pairing removes the items' own difficulty from the comparison.
- `bootstrap(stat, *columns)`: the percentile-bootstrap interval (Efron & Tibshirani, 1993, ch. 13) of any
  statistic of per-item columns, resampling items (sequences, prompts) with replacement. Ratios of sums
  (perplexity = exp(sum NLL / sum tokens), tokens per second = sum tokens / sum seconds) are resampled as
  ratios, not as means of per-item ratios. Comparing two methods on the same items passes both methods'
  columns to one `stat`, so each resample draws the same items for both: a paired comparison.
- `spread(values)`: the median of a figure measured in independent, interleaved runs and the span (min to
  max) of those runs (`Spread`; its `interval` needs at least 3 of them): on a machine whose speed drifts between runs minutes apart (up to 1.5x
  here), a timing ratio's interval over the steps of one run measures the wrong spread, so a timing verdict rests
  on the spread of run-level ratios instead (issue 34 item 6).
- `significance(interval, null)`: the word every table and verdict uses, "distinguishable" when the interval
  excludes `null` (0 for a difference, 1 for a ratio), else "not distinguishable".

Every interval returned here contains its point estimate (issue 33): a figure draws it as distances below and
above the point, and a plotting library refuses a negative one. Wilson's ends are clamped to contain k/n (exact
0 and 1 at the edges, not a rounding residue); a percentile interval that misses its point
(`percentile_interval`) is widened to reach it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

Z95 = 1.959963984540054  # the standard normal's 97.5% quantile


DISTINGUISHABLE, NOT_DISTINGUISHABLE = "distinguishable", "not distinguishable"


@dataclass(frozen=True)
class Interval:
    """A point estimate with its (95% by default) interval."""
    value: float
    low: float
    high: float

    def excludes(self, null: float) -> bool:
        return self.low > null or self.high < null

    def columns(self, name: str) -> dict:
        """{name: value, name_low: low, name_high: high}: how a table row carries it."""
        return {name: self.value, f"{name}_low": self.low, f"{name}_high": self.high}

    def __str__(self) -> str:
        return f"{self.value:.4g} ({self.low:.4g} to {self.high:.4g})"


def significance(interval: Interval, null: float = 0.0) -> str:
    """'distinguishable' when the interval excludes `null`, else 'not distinguishable'."""
    return significance_word(interval.excludes(null))


def significance_word(distinguishable: bool) -> str:
    """The word a comparison carries: 'distinguishable' or 'not distinguishable'. Study code takes it from here
    rather than importing the word itself, which is also a verdict's (the ledger's scan for typed verdicts,
    `lab.claims.literals`, refuses an imported verdict word wherever it comes from)."""
    return DISTINGUISHABLE if distinguishable else NOT_DISTINGUISHABLE


def undecided(word: str) -> bool:
    """Whether a significance word or a verdict says the evidence decides nothing ('not distinguishable')."""
    return word == NOT_DISTINGUISHABLE


def bootstrap(stat: Callable[..., np.ndarray], *columns, confidence: float = 0.95, resamples: int = 2000,
              seed: int = 0) -> Interval:
    """`stat` of per-item `columns` with its percentile-bootstrap interval over items.

    Each column holds one value per item (all the same length). `stat` takes the columns resampled as arrays
    of shape (resamples, items) and reduces the last axis, returning one value per resample; the point value
    is `stat` of the columns as drawn (shape (1, items)). Example, perplexity over sequences:
    `bootstrap(lambda nll, n: np.exp(nll.sum(-1) / n.sum(-1)), nll_per_sequence, tokens_per_sequence)`.
    A single item gives the value with a NaN interval, which `significance` calls not distinguishable.
    The interval is `percentile_interval`'s: widened to contain the point where the percentiles miss it.
    """
    cols = [np.asarray(c, dtype=float) for c in columns]
    if not cols or cols[0].ndim != 1 or cols[0].size == 0 or any(c.shape != cols[0].shape for c in cols):
        raise ValueError(f"bootstrap needs one or more 1-D columns of one non-zero length, got shapes "
                         f"{[c.shape for c in cols]}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    value = float(np.asarray(stat(*(c[None, :] for c in cols))).reshape(-1)[0])
    if cols[0].size == 1:  # one item says nothing about its spread: no interval, and no comparison decided by it
        return Interval(value, float("nan"), float("nan"))
    idx = np.random.default_rng(seed).integers(0, cols[0].size, (resamples, cols[0].size))
    draws = np.asarray(stat(*(c[idx] for c in cols)), dtype=float)
    if draws.shape != (resamples,):
        raise ValueError(f"stat must reduce the items axis to one value per resample, returned shape {draws.shape}")
    return percentile_interval(value, draws, confidence)


def percentile_interval(value: float, draws, confidence: float = 0.95, skip_nan: bool = True) -> Interval:
    """`value` with the percentile interval of its bootstrap `draws`, widened where needed to contain `value`.

    The percentile interval can miss its own point: a statistic the resamples cannot reach (the number of
    distinct items, which a resample of n draws rarely keeps at n), or strong skew with few items. Widening
    the missed end to the point is conservative (the interval only grows) and keeps "value (low to high)" and
    its error bar meaningful. `skip_nan`: leave NaN draws (a resample where the statistic is undefined, such as
    a zero denominator) out; otherwise any NaN draw gives NaN ends. NaN ends stay NaN (no interval), and a NaN
    value leaves the ends as the draws give them (nothing to contain).
    """
    q = [(1 - confidence) / 2, (1 + confidence) / 2]
    lo, hi = (np.nanquantile if skip_nan else np.quantile)(np.asarray(draws, dtype=float), q)
    lo, hi, value = float(lo), float(hi), float(value)
    if not (math.isnan(value) or math.isnan(lo) or math.isnan(hi)):
        lo, hi = min(lo, value), max(hi, value)
    return Interval(value, lo, hi)


def mean_interval(values, **kwargs) -> Interval:
    """The mean of per-item values with its bootstrap interval."""
    return bootstrap(lambda v: v.mean(-1), values, **kwargs)


def ratio_of_sums(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """The `bootstrap` stat of a pooled rate: sum(num) / sum(den) over the items axis (NaN where a resample's
    denominator is 0, e.g. prompts without a speculative round)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return num.sum(-1) / den.sum(-1)


def ratio_interval(numerators, denominators, **kwargs) -> Interval:
    """sum(numerators) / sum(denominators) over items (a pooled rate) with its bootstrap interval."""
    return bootstrap(ratio_of_sums, numerators, denominators, **kwargs)


MIN_RUNS = 3


@dataclass(frozen=True)
class Spread:
    """A figure measured once in each of `n` independent runs: the runs' median, min and max (issue 34 item 6)."""
    median: float
    lo: float
    hi: float
    n: int

    @property
    def interval(self) -> tuple[float, float]:
        """(min, max) over the runs; (NaN, NaN), which decides nothing, with fewer than `MIN_RUNS` runs."""
        return (self.lo, self.hi) if self.n >= MIN_RUNS else (math.nan, math.nan)

    def scaled(self, factor: float, offset: float = 0.0) -> "Spread":
        """`offset + factor * x` of each end (a ratio r as a cut in percent: `scaled(-100, 100)`), ends reordered."""
        lo, hi = sorted((offset + factor * self.lo, offset + factor * self.hi))
        return Spread(offset + factor * self.median, lo, hi, self.n)


def spread(values) -> Spread:
    """The run-level `values` as a `Spread`; a NaN (a run that measured nothing, e.g. no step where the whole
    batch ran) is not a run and is left out, so `n` counts the runs that measured."""
    v = np.asarray(values, dtype=float)
    v = v[~np.isnan(v)]
    if not v.size:
        return Spread(math.nan, math.nan, math.nan, 0)
    return Spread(float(np.median(v)), float(v.min()), float(v.max()), int(v.size))


def wilson(k: int, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval (95% by default) of k successes in n trials."""
    if n <= 0 or not 0 <= k <= n:
        raise ValueError(f"need 0 <= k <= n and n > 0, got k={k}, n={n}")
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    # In exact arithmetic low <= p <= high, with low = 0 at k = 0 and high = 1 at k = n; in floating point
    # centre - half at k = 0 can be 2.8e-17 (or centre + half at k = n 1 - 1e-16), which put the point outside
    # its interval and made the error bar below it negative. Clamping to [0, p] and [p, 1] restores both.
    return min(max(0.0, centre - half), p), max(min(1.0, centre + half), p)


def proportion(k: int, n: int) -> Interval:
    """k / n with its Wilson interval, as an `Interval`."""
    return Interval(k / n if n else float("nan"), *wilson(k, n))


def paired_difference(a, b, confidence: float = 0.95, resamples: int = 4000, seed: int = 0) -> dict:
    """mean(a - b) over paired items with its bootstrap interval (`percentile_interval`: it contains the
    difference); `distinguishable`: the interval excludes 0. A NaN in either sample gives NaN throughout; one
    pair gives NaN ends (no interval), not distinguishable."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.shape != b.shape or a.size == 0:
        raise ValueError(f"paired samples must have one equal, non-zero length, got {a.size} and {b.size}")
    d = a - b
    if d.size == 1:  # as `bootstrap`: one item says nothing about its spread, and decides no comparison
        return {"difference": float(d[0]), "low": float("nan"), "high": float("nan"), "distinguishable": False}
    rng = np.random.default_rng(seed)
    means = d[rng.integers(0, d.size, (resamples, d.size))].mean(axis=1)
    iv = percentile_interval(d.mean(), means, confidence, skip_nan=False)
    return {"difference": iv.value, "low": iv.low, "high": iv.high, "distinguishable": iv.excludes(0.0)}


def rate(k: int, n: int) -> str:
    """'k/n = p% (lo-hi%)', the way a table states a rate with its Wilson interval."""
    lo, hi = wilson(k, n)
    return f"{k}/{n} = {k / n:.0%} ({lo:.0%}-{hi:.0%})"
