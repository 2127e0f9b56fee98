"""Checking a source article's numbers: the study recomputes each one, and the verdict is computed, not typed.

The memory-accounting and replay studies set every number their source articles state beside the lab's own
recomputation of it; `verdict` turns the pair into "correct" or by how much the claim is off, so that a table
of claims can never say "correct" about a number it did not check.

`claim_row` is the one shape of a notebook's claims table (`claims.csv`), which `lab claims` gathers into the
ledger: the claim, the article's figure, what the lab measured (with its interval), and the verdict in the
ledger's words, computed from the evidence: `judge` for a quantity with an interval.
"""

from __future__ import annotations


def verdict(claimed, computed: float, rel_tol: float = 0.02) -> str:
    """'correct' when the recomputation agrees within rounding (a range: falls inside it), else by how much."""
    lo, hi = claimed if isinstance(claimed, tuple) else (claimed, claimed)
    if lo * (1 - rel_tol) <= computed <= hi * (1 + rel_tol):
        return "correct"
    ref = lo if computed < lo else hi
    return f"wrong: the lab gets {computed / ref:.4g}x the claim"


HOLDS, WRONG, NOT_DISTINGUISHABLE = "holds", "wrong", "not distinguishable"
CLAIMS_COLUMNS = ("claim", "article", "measured here", "verdict", "holds")


def judge(low: float, high: float, lo: float = float("-inf"), hi: float = float("inf")) -> str:
    """The verdict on a claim that a quantity lies in [lo, hi] (an end may be open), from the quantity's
    interval [low, high]: holds when the interval is inside, wrong when disjoint, not distinguishable when it
    straddles an end (the ledger's `Range` rule with an interval)."""
    if lo <= low and high <= hi:
        return HOLDS
    if high < lo or low > hi:
        return WRONG
    return NOT_DISTINGUISHABLE


def claim_row(claim: str, article: str, measured: str, verdict: str) -> dict:
    """One row of a claims table; `verdict` is one of holds / wrong / not distinguishable (the `holds`
    column is True, False or empty accordingly)."""
    flags = {HOLDS: True, WRONG: False, NOT_DISTINGUISHABLE: None}
    if verdict not in flags:
        raise ValueError(f"verdict must be one of {tuple(flags)}, not {verdict!r}")
    return {"claim": claim, "article": article, "measured here": measured, "verdict": verdict,
            "holds": flags[verdict]}
