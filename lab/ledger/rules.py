"""The ledger's verdict rules, written down once (issue 23, item 1).

A claim is judged from the article's number as the article prints it and the lab's number as its notebook's
claims table prints it. Printed precision matters: "35.8" says "to a tenth", "5.7e14" says "to 1e13".

Verdicts:

- **holds**: the claim agrees with the lab's number under the rule below.
- **wrong**: it does not, by more than rounding.
- **wrong by rounding**: the article's own arithmetic, printed wrong in the last digit: the claim and the lab's
  number differ by less than one unit of the last printed digit, but the lab's number rounds to something
  else (70e9 x 0.55 B = 35.86 GiB printed as "35.8" rather than 35.9). A slip of the pen, not a wrong figure.
- **not distinguishable**: the lab's interval (a confidence interval, or the span its assumptions allow)
  holds values that satisfy the claim and values that refute it.
- **not checkable here**: the claim needs what this lab does not have (a GPU, a cluster, a 70B checkpoint), or
  it is a setting or a definition rather than a statement with a truth value; the ledger says which.
- **not yet checked**: this lab could check it but no notebook does yet; the ledger says what would.

Rules, by the kind of claim:

- `Number(text, exact=True)`: the article's own arithmetic on inputs it states (the figure is determined, so
  the only slack is printing). Both numbers are rounded to the coarser of the two printed precisions: equal
  -> holds; differing by less than one unit of that precision -> wrong by rounding; else wrong.
- `Number(text, exact=False)`: an estimate about a real model, device or measurement, where modelling
  choices the article does not state move the figure: holds within `rel_tol` (2%) of the claim, or equal at the
  common printed precision; wrong otherwise. With a lab interval: inside the band -> holds, disjoint from it
  -> wrong, overlapping its edge -> not distinguishable.
- `Range(lo, hi)` (an end may be open: "at least 4x"): holds when the lab's number, rounded to the finest
  precision the range's ends are printed to, is inside the range; wrong when outside. With a lab interval:
  inside -> holds, disjoint -> wrong, straddling an end -> not distinguishable.
- A claim with no number (qualitative: "keys are more sensitive than values") takes its notebook's verdict,
  mapped onto these words by `from_notebook`. Where a rule above gives a numeric claim another verdict than
  its notebook's, the rule's stands and the ledger's row says what the notebook said.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal

HOLDS, WRONG, ROUNDING = "holds", "wrong", "wrong by rounding"
NOT_DISTINGUISHABLE, NOT_CHECKABLE, NOT_YET = "not distinguishable", "not checkable here", "not yet checked"
VERDICTS = (HOLDS, WRONG, ROUNDING, NOT_DISTINGUISHABLE, NOT_CHECKABLE, NOT_YET)
# Not a verdict on the claim: its evidence row is absent from the notebook's latest reference run.
MISSING = "evidence missing"

NUMBER = r"[-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?"
_INTERVAL = re.compile(rf"\[\s*({NUMBER})\s*,\s*({NUMBER})\s*\]")


@dataclass(frozen=True)
class Number:
    """One number as the article prints it, in the unit of the lab's figure ("2.6e6" for its "2.6 MB")."""
    text: str
    exact: bool = True
    rel_tol: float = 0.02

    def __post_init__(self):
        Decimal(self.text)  # refuses what is not a number


@dataclass(frozen=True)
class Range:
    """A range the article gives ("2-2.5x"); None for an open end ("at least 4": Range("4", None))."""
    lo: str | None
    hi: str | None

    def __post_init__(self):
        if self.lo is None and self.hi is None:
            raise ValueError("a range needs at least one end")
        for end in (self.lo, self.hi):
            if end is not None:
                Decimal(end)


@dataclass(frozen=True)
class LabNumber:
    """The lab's number as printed in its table, and the interval around it when the table gives one."""
    text: str
    lo: str | None = None
    hi: str | None = None

    @property
    def interval(self) -> tuple[Decimal, Decimal] | None:
        return None if self.lo is None else (Decimal(self.lo), Decimal(self.hi))


def exponent(text: str) -> int:
    """The power of ten of the last printed digit: "35.8" -> -1, "5.7e14" -> 13, "131072" -> 0."""
    return Decimal(text).as_tuple().exponent


def _round(value: Decimal, exp: int) -> Decimal:
    return value.quantize(Decimal(1).scaleb(exp), rounding=ROUND_HALF_UP)


def parse_lab(cell: str, pattern: str | None = None) -> LabNumber | None:
    """The lab's number from a table cell: `pattern`'s group `v` (and `lo`, `hi` when it has them), else the
    first number in the cell and the first "[lo, hi]" after it. None when the cell has no such number."""
    if pattern:
        m = re.search(pattern, cell)
        if not m:
            return None
        groups = m.groupdict()
        return LabNumber(groups["v"], groups.get("lo"), groups.get("hi"))
    m = re.search(NUMBER, cell)
    if not m:
        return None
    ci = _INTERVAL.search(cell, m.end())
    return LabNumber(m.group(0), *(ci.groups() if ci else (None, None)))


def _by_interval(inside, outside, interval) -> str:
    lo_in, hi_in = inside(interval[0]), inside(interval[1])
    if lo_in and hi_in:
        return HOLDS
    return WRONG if outside(interval) else NOT_DISTINGUISHABLE


def judge_number(claim: Number, lab: LabNumber) -> str:
    a, v = Decimal(claim.text), Decimal(lab.text)
    exp = max(exponent(claim.text), exponent(lab.text))
    same_when_printed = _round(a, exp) == _round(v, exp)
    if claim.exact:
        if same_when_printed:
            return HOLDS
        return ROUNDING if abs(v - a) < Decimal(1).scaleb(exp) else WRONG
    tol = Decimal(str(claim.rel_tol)) * abs(a)
    band = (a - tol, a + tol)
    if lab.interval is not None:
        return _by_interval(lambda x: band[0] <= x <= band[1],
                            lambda iv: iv[1] < band[0] or iv[0] > band[1], lab.interval)
    return HOLDS if same_when_printed or band[0] <= v <= band[1] else WRONG


def judge_range(claim: Range, lab: LabNumber) -> str:
    exp = min(exponent(end) for end in (claim.lo, claim.hi) if end is not None)
    lo = Decimal(claim.lo) if claim.lo is not None else None
    hi = Decimal(claim.hi) if claim.hi is not None else None

    def inside(x: Decimal) -> bool:
        x = _round(x, exp)
        return (lo is None or x >= lo) and (hi is None or x <= hi)

    if lab.interval is not None:
        def outside(iv):
            return (hi is not None and _round(iv[0], exp) > hi) or (lo is not None and _round(iv[1], exp) < lo)
        return _by_interval(inside, outside, lab.interval)
    return HOLDS if inside(Decimal(lab.text)) else WRONG


def judge(claim: Number | Range, lab: LabNumber) -> str:
    """The verdict the rules above give `claim` against the lab's number."""
    return judge_range(claim, lab) if isinstance(claim, Range) else judge_number(claim, lab)


def from_notebook(verdict_text: str | None, holds: str | None) -> str:
    """A notebook's own verdict (its "verdict" text and/or "holds" column) in the ledger's words."""
    text = (verdict_text or "").strip().lower()
    flag = (holds or "").strip().lower()
    if text.startswith(("not checkable", "not testable")):
        return NOT_CHECKABLE
    if text.startswith("not distinguishable"):  # before the flag: an interval straddling the claim decides nothing
        return NOT_DISTINGUISHABLE
    if flag in ("true", "yes"):
        return HOLDS
    if flag in ("false", "no"):
        return WRONG
    if text.startswith(("correct", "holds", "arithmetic right", "true of")):
        return HOLDS
    if text.startswith("wrong") or "does not hold" in text:
        return WRONG
    raise ValueError(f"a notebook verdict the ledger cannot map: {verdict_text!r} / holds={holds!r}")
