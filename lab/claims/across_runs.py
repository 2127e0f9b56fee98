"""Intervals over independent runs (issue 34 item 6), the one interval rule of the serving and TTFT claims tables.

A timing ratio that a verdict rests on is taken once in each of several runs of both sides, interleaved (a
repeat's two sides run back to back, so drift between repeats moves both), and its interval is the spread of
those run-level ratios, min to max, not a bootstrap over the steps or requests of one run: this machine drifts
between runs minutes apart by more than one run's steps vary. Fewer than `MIN_RUNS` runs give no interval, and
then no verdict: the rules call a value without an interval "not distinguishable" here rather than let one run
decide a claim. The spread itself (`Spread`, `spread`) lives in `lab.stats.intervals` with the lab's other intervals;
here is how a claims table prints and judges one.
"""

from __future__ import annotations

from lab.claims.table import Rule, judged, shown
from lab.stats.intervals import MIN_RUNS, Spread, spread

__all__ = ["MIN_RUNS", "Spread", "judged_runs", "spread", "text"]


def text(s: Spread, rule: Rule) -> str:
    """"v [lo, hi] over n runs" (what `lab.claims.rules.run_cell` reads back), each printed to the digits its
    verdict needs (`lab.claims.table.shown`), or "v (n runs: no interval)" below `MIN_RUNS`."""
    if s.n >= MIN_RUNS:
        return f"{shown(s.median, rule)} [{shown(s.lo, rule)}, {shown(s.hi, rule)}] over {s.n} runs"
    return f"{shown(s.median, rule)} ({s.n} run{'' if s.n == 1 else 's'}: no interval)"


def judged_runs(rule: Rule, s: Spread) -> tuple[str, str]:
    """(verdict, note) of `rule` against the run-level median and spread (`lab.claims.table.judged`); with fewer than
    `MIN_RUNS` runs, not distinguishable, and the note says so."""
    word, note = judged(rule, s.median, s.interval)
    if s.n < MIN_RUNS:
        note = f"{s.n} run{'' if s.n == 1 else 's'}: fewer than {MIN_RUNS}, so no interval and no verdict"
    return word, note
