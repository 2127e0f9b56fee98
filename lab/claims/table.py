"""A notebook's claims table: one shape, and verdicts from the ledger's rules, never typed.

The studies set every number their source articles state beside the lab's own recomputation or measurement of
it. The verdict comes from the one verdict system, `lab.claims.rules`: `judged(rule, value, interval)` gives the
verdict and, when it is not "holds", by how much, so a table of claims can never say "holds" about a number it
did not check and `lab claims` reads the same verdict back that its rules would give. A claim no number can
decide is "wrong by argument" (`BY_ARGUMENT`) with the argument in the note; one this lab cannot check is "not
checkable here" with the reason. Those two are the only verdict words a study writes itself
(tests/test_ledger_checks.py greps for the others).

`claim_row` is the one shape of a notebook's claims table (`claims.csv`), which `lab claims` gathers into the
ledger: the claim, the article's figure, what the lab measured (with its interval), the verdict and a note.

The ledger reads such tables back through `columns` and `measured_cell`, whatever shape a table has (the
notebooks grew them apart: "claim" or "article ...", "measured here", "evidence", ...): the gathering, the
rebuilds and the assumption sweeps all read rows through here.
"""

from __future__ import annotations

from lab.claims.rules import (BY_ARGUMENT, HOLDS, NOT_CHECKABLE, NOT_DISTINGUISHABLE, ROUNDING, WRONG, Bound, Number,
                              Range, Rule, all_of, from_flag, verdict)

__all__ = ["BY_ARGUMENT", "CLAIMS_COLUMNS", "HOLDS", "NOT_CHECKABLE", "NOT_DISTINGUISHABLE", "ROUNDING", "VERDICTS",
           "WRONG", "Bound", "Number", "Range", "all_of", "claim_row", "columns", "from_flag", "holds_cell", "judged",
           "measured_cell", "shown", "verdict"]

# The verdicts a claims table may carry, each with its `holds` cell.
VERDICTS = {HOLDS: True, WRONG: False, ROUNDING: False, BY_ARGUMENT: False, NOT_DISTINGUISHABLE: None,
            NOT_CHECKABLE: None}
CLAIMS_COLUMNS = ("claim", "article", "measured here", "verdict", "holds", "note")


def _off(rule: Rule, value: float) -> str:
    """By how much a wrong value misses the claim: its ratio to the claim's number (a range: to its nearer end),
    or, for a bound, the value on the wrong side of it."""
    if isinstance(rule, Bound):
        return f"{value:.3g} is not {'above' if rule.above else 'below'} {rule.threshold}"
    ends = [float(rule.text)] if isinstance(rule, Number) else [float(e) for e in (rule.lo, rule.hi) if e is not None]
    ref = min(ends, key=lambda e: abs(e - value))
    return f"the lab gets {value / ref:.4g}x the claim" if ref else f"the lab gets {value:.4g}"


def judged(rule: Rule, value: float, interval: tuple[float, float] | None = None) -> tuple[str, str]:
    """(verdict, note): `lab.claims.rules.verdict`, and why when it is not "holds": by how much a wrong value
    misses ("the lab gets 0.5x the claim"), or that the interval straddles an edge of the claim."""
    word = verdict(rule, value, interval)
    if word in (WRONG, ROUNDING):
        return word, _off(rule, value)
    return word, "the interval straddles an edge of the claim" if word == NOT_DISTINGUISHABLE else ""


def shown(value: float, rule: Rule, digits: int = 4) -> str:
    """`value` printed to `digits` significant digits, or more until the printed figure gets the verdict the value
    gets (131072 rather than 1.311e+05 against "131072", which that figure cannot decide), so the ledger reads
    back from the table the verdict the notebook wrote."""
    want = verdict(rule, value)
    for n in range(digits, 18):
        text = f"{value:.{n}g}"
        if verdict(rule, text) == want:
            return text
    return repr(float(value))


def holds_cell(word: str) -> bool | None:
    """Whether a verdict says the claim holds: True, False (wrong in any way), None (undecided); its `holds` cell."""
    return VERDICTS[word]


def claim_row(claim: str, article: str, measured: str, verdict: str, note: str = "") -> dict:
    """One row of a claims table in the one shape (`CLAIMS_COLUMNS`): the claim in a sentence, the article's figure
    as printed, what the lab measured (a number with its interval as "v [low, high]" where there is one), the
    verdict (`VERDICTS`; `holds` is True, False or empty accordingly), and a note saying why where the verdict
    alone does not (the argument itself, for a claim wrong by argument)."""
    if verdict not in VERDICTS:
        raise ValueError(f"verdict must be one of {tuple(VERDICTS)}, not {verdict!r}")
    if verdict == BY_ARGUMENT and not note:
        raise ValueError(f"{claim!r}: a claim wrong by argument carries the argument in its note")
    return {"claim": claim, "article": article, "measured here": measured, "verdict": verdict,
            "holds": VERDICTS[verdict], "note": note}


# How the ledger reads a claims table of any shape: which column holds the claim and which the lab's figure.
CLAIM_COLUMNS = ("claim",)
LAB_COLUMNS = ("the lab computes", "recomputed or measured", "measured here", "measured or computed here", "evidence")


def columns(header: list[str]) -> tuple[str, str, str | None, str | None]:
    """(claim, lab, verdict, holds) column names of a claims table, whichever shape it has."""
    claim = next((h for h in header if h in CLAIM_COLUMNS or h.startswith("article")), None)
    lab = next((h for h in LAB_COLUMNS if h in header), None)
    if claim is None or lab is None:
        raise ValueError(f"a claims table without a claim or a measured column: {header}")
    return claim, lab, "verdict" if "verdict" in header else None, "holds" if "holds" in header else None


def measured_cell(row: dict) -> str:
    """A claims-table row's measured cell, whichever of `LAB_COLUMNS` its table names it."""
    return str(next(row[c] for c in LAB_COLUMNS if c in row))
