"""Intervals over independent runs (issue 34 item 6), the one interval rule of the serving and TTFT claims tables.

A timing ratio that a verdict rests on is taken once in each of several runs of both sides, interleaved (a
repeat's two sides run back to back, so drift between repeats moves both), and its interval is the spread of
those run-level ratios, min to max, not a bootstrap over the steps or requests of one run: this machine drifts
between runs minutes apart by more than one run's steps vary. Fewer than `MIN_RUNS` runs give no interval, and
then no verdict: the rules call a value without an interval "not distinguishable" here rather than let one run
decide a claim.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from lab.claims import Rule, judged, shown

MIN_RUNS = 3


@dataclass(frozen=True)
class Spread:
    """The median of a quantity's run-level values, their min and max, and how many runs there were."""
    median: float
    lo: float
    hi: float
    n: int

    @property
    def interval(self) -> tuple[float, float]:
        """(min, max) over the runs; (NaN, NaN), which decides nothing, with fewer than `MIN_RUNS` runs."""
        return (self.lo, self.hi) if self.n >= MIN_RUNS else (math.nan, math.nan)

    def scaled(self, factor: float, offset: float = 0.0) -> Spread:
        """`offset + factor * x` of each end (a ratio r as a cut in percent: `scaled(-100, 100)`), ends reordered."""
        lo, hi = sorted((offset + factor * self.lo, offset + factor * self.hi))
        return Spread(offset + factor * self.median, lo, hi, self.n)


def spread(values) -> Spread:
    """The run-level `values` (NaN dropped) as a `Spread`."""
    v = np.asarray(values, dtype=float)
    v = v[~np.isnan(v)]
    if not v.size:
        return Spread(math.nan, math.nan, math.nan, 0)
    return Spread(float(np.median(v)), float(v.min()), float(v.max()), int(v.size))


def text(s: Spread, rule: Rule) -> str:
    """"v [lo, hi] over n runs", each printed to the digits its verdict needs (`lab.claims.shown`), or "v (n runs:
    no interval)" below `MIN_RUNS`."""
    if s.n >= MIN_RUNS:
        return f"{shown(s.median, rule)} [{shown(s.lo, rule)}, {shown(s.hi, rule)}] over {s.n} runs"
    return f"{shown(s.median, rule)} ({s.n} run{'' if s.n == 1 else 's'}: no interval)"


def judged_runs(rule: Rule, s: Spread) -> tuple[str, str]:
    """(verdict, note) of `rule` against the run-level median and spread (`lab.claims.judged`); with fewer than
    `MIN_RUNS` runs, not distinguishable, and the note says so."""
    word, note = judged(rule, s.median, s.interval)
    if s.n < MIN_RUNS:
        note = f"{s.n} run{'' if s.n == 1 else 's'}: fewer than {MIN_RUNS}, so no interval and no verdict"
    return word, note
