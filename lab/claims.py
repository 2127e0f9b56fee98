"""Checking a source article's numbers: the study recomputes each one, and the verdict is computed, not typed.

The studies set every number their source articles state beside the lab's own recomputation or measurement of
it; `check` turns the pair into a verdict word and, when it is wrong, by how much, so that a table of claims can
never say "holds" about a number it did not check.

`claim_row` is the one shape of a notebook's claims table (`claims.csv`), which `lab claims` gathers into the
ledger: the claim, the article's figure, what the lab measured (with its interval), the verdict in the ledger's
words, computed from the evidence (`check` for a number, `judge` for a quantity with an interval), and a note.
"""

from __future__ import annotations


HOLDS, WRONG, NOT_DISTINGUISHABLE, NOT_CHECKABLE = "holds", "wrong", "not distinguishable", "not checkable here"
VERDICTS = {HOLDS: True, WRONG: False, NOT_DISTINGUISHABLE: None, NOT_CHECKABLE: None}  # verdict -> `holds` cell
CLAIMS_COLUMNS = ("claim", "article", "measured here", "verdict", "holds", "note")


def check(claimed, computed: float, rel_tol: float = 0.02) -> tuple[str, str]:
    """("holds", "") when the recomputation agrees within `rel_tol` (a (lo, hi) claim: falls inside it), else
    ("wrong", "the lab gets Nx the claim")."""
    lo, hi = claimed if isinstance(claimed, tuple) else (claimed, claimed)
    if lo * (1 - rel_tol) <= computed <= hi * (1 + rel_tol):
        return HOLDS, ""
    ref = lo if computed < lo else hi
    return WRONG, f"the lab gets {computed / ref:.4g}x the claim"


def judge(low: float, high: float, lo: float = float("-inf"), hi: float = float("inf")) -> str:
    """The verdict on a claim that a quantity lies in [lo, hi] (an end may be open), from the quantity's
    interval [low, high]: holds when the interval is inside, wrong when disjoint, not distinguishable when it
    straddles an end (the ledger's `Range` rule with an interval)."""
    if lo <= low and high <= hi:
        return HOLDS
    if high < lo or low > hi:
        return WRONG
    return NOT_DISTINGUISHABLE


def claim_row(claim: str, article: str, measured: str, verdict: str, note: str = "") -> dict:
    """One row of a claims table in the one shape (`CLAIMS_COLUMNS`): the claim in a sentence, the article's figure
    as printed, what the lab measured (a number with its interval as "v [low, high]" where there is one), the
    verdict (holds / wrong / not distinguishable / not checkable here; `holds` is True, False or empty
    accordingly), and a note saying why where the verdict alone does not."""
    if verdict not in VERDICTS:
        raise ValueError(f"verdict must be one of {tuple(VERDICTS)}, not {verdict!r}")
    return {"claim": claim, "article": article, "measured here": measured, "verdict": verdict,
            "holds": VERDICTS[verdict], "note": note}


def from_check(holds) -> str:
    """The verdict word of a True / False (numpy's bools too) / None (not decided by the interval) check."""
    return NOT_DISTINGUISHABLE if holds is None else HOLDS if bool(holds) else WRONG
