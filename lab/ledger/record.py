"""One claim of a source article, as the ledger records it, and the link to the notebook row that checks it.

A claim is either linked to a row of a notebook's claims table (found by a substring of the row's claim cell,
so a reworded number or a reordered table still finds it, while a dropped row is reported as missing) or
carries its verdict and the reason no notebook checks it ("not checkable here", "not yet checked", with the
measurement that would decide it), or the argument that refutes it ("wrong by argument").
"""

from __future__ import annotations

from dataclasses import dataclass

from lab.ledger.rules import BY_ARGUMENT, NOT_CHECKABLE, NOT_YET, VERDICTS, Rule

SEEDS = {"000": "000_6360c6a068e5cdc2.txt", "002": "002_2e53536036edbb4f.txt", "003": "003_1a250c76ca76c1c9.txt"}


@dataclass(frozen=True)
class Link:
    """Where a notebook checks a claim: a row of `table` in the notebook's latest reference run whose claim
    cell contains `match` (exactly one row must). `lab_pattern` picks the lab's number out of the row's
    measured cell (a regex with group `v`, optionally `lo` and `hi`); without it, the first number."""
    notebook: str
    match: str
    table: str = "claims.csv"
    lab_pattern: str | None = None


@dataclass(frozen=True)
class Claim:
    """A claim: id ("003-16"), seed ("003") and section ("§2.1"), the claim in one English sentence, the article's
    number as printed. `rule` (a Number, Range or Bound) makes the ledger judge the linked row's number by the
    rules, as its notebook did; `verdict` is the verdict of an unlinked claim (a linked one's comes from its row);
    `why` says why (the argument, for one wrong by argument), or adds a note to a linked row; `decider` names
    the measurement or computation that would decide a claim not yet checked (`lab claims --check` fails
    without one)."""
    id: str
    seed: str
    section: str
    claim: str
    article: str
    link: Link | None = None
    rule: Rule | None = None
    verdict: str | None = None
    why: str = ""
    decider: str = ""

    def __post_init__(self):
        if self.seed not in SEEDS or not self.id.startswith(self.seed + "-"):
            raise ValueError(f"{self.id}: seed {self.seed!r} is not one of {sorted(SEEDS)} or not its id's prefix")
        if not self.section.startswith("§"):
            raise ValueError(f"{self.id}: a section is written §N.N, not {self.section!r}")
        if self.verdict is not None and self.verdict not in VERDICTS:
            raise ValueError(f"{self.id}: {self.verdict!r} is not a verdict")
        if self.link is None:
            if self.verdict not in (NOT_CHECKABLE, NOT_YET, BY_ARGUMENT) or not self.why:
                raise ValueError(f"{self.id}: an unlinked claim is not checkable here, not yet checked or wrong by "
                                 f"argument, and says why")
            if self.rule is not None:
                raise ValueError(f"{self.id}: a rule needs a linked row to judge")
        elif self.verdict is not None:
            raise ValueError(f"{self.id}: a linked claim's verdict comes from its row (and its rule), not the registry")
