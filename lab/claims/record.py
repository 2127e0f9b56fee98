"""One claim of a source article, as the ledger records it, and the link to the notebook row that checks it.

A claim is either linked to a row of a notebook's claims table (found by a substring of the row's claim cell,
so a reworded number or a reordered table still finds it, while a dropped row is reported as missing) or
carries its verdict and the reason no notebook checks it ("not checkable here", "not yet checked", with the
measurement that would decide it), or the argument that refutes it ("wrong by argument").

A claim the ledger finds wrong names its `cause`: the article's underlying mistake, one `Cause` of its seed's
registry, so that one error repeated over many rows (a KV size with one head instead of eight) is counted once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from lab.claims.model_class import ModelClass
from lab.claims.rules import (BY_ARGUMENT, EVIDENCE, NOT_CHECKABLE, NOT_YET, ON_CPU, SCOPES, VERDICTS, LabNumber,
                              Rule, parse_lab)

SEEDS = {"000": "000_6360c6a068e5cdc2.txt", "002": "002_2e53536036edbb4f.txt", "003": "003_1a250c76ca76c1c9.txt"}


@dataclass(frozen=True)
class Link:
    """Where a notebook checks a claim: a row of `table` in the notebook's latest reference run whose claim
    cell contains `match` (exactly one row must). `lab_pattern` picks the lab's number out of the row's
    measured cell (a regex with group `v`, optionally `lo` and `hi`); without it, the first number (`lab_figure`,
    a function of the cell, where the figure needs several of its numbers). `evidence`
    says how the row's figure was obtained (`lab.claims.rules.EVIDENCE`: measured, projected to a GPU, a physics
    bound, arithmetic; a measurement becomes "on a GPU" when the run had one), `setting` adds what the lab's
    setting needs said beyond the run's device and model (the GPU projected to, the batch), and `bound` picks
    out of the measured cell a physics bound on the same quantity (a regex with group `v`), which can refute
    a claim that no measurement in this setting decides (`rules.beyond`)."""
    notebook: str
    match: str
    table: str = "claims.csv"
    lab_pattern: str | None = None
    evidence: str = ON_CPU
    setting: str = ""
    bound: str | None = None
    lab_figure: Callable[[str], LabNumber | None] | None = None

    def __post_init__(self):
        if self.evidence not in EVIDENCE:
            raise ValueError(f"{self.match!r}: evidence {self.evidence!r} is not one of {EVIDENCE}")
        if self.lab_figure is not None and self.lab_pattern:
            raise ValueError(f"{self.match!r}: the figure is read by a pattern or a function, not both")

    def figure(self, cell: str) -> LabNumber | None:
        """The lab's number (and interval) in a measured cell: `lab_figure(cell)` where the figure is computed from
        several of the cell's numbers (a count with the rows that could go either way as its interval), else
        `lab_pattern`'s groups or the first number."""
        return self.lab_figure(cell) if self.lab_figure is not None else parse_lab(cell, self.lab_pattern)


@dataclass(frozen=True)
class Assumption:
    """A number a verdict rests on that the article does not state (issue 48 item 3): a threshold read into a vague
    word ("hardly worth it"), a latency or bandwidth, a context length, a request-length distribution. `value`
    (in `unit`) is the one the lab's figure used and `source` where it comes from; `low`-`high` is the range a
    reader could defend (`plausible` says why). The ledger recomputes the lab's figure over the range through the
    same code and finds where the verdict flips: through the notebook's claims table with its parameter `param`
    set to each value (the notebook's `Rebuild`), or through `figure(value)`, a function of the assumed value
    that calls what the notebook's row calls; or, where the assumption is the threshold the lab reads into a vague
    word, `rule(value)` gives the claim's rule at that threshold and the row's figure stays as measured; or, where the
    notebook's own code computes the flip point and prints it in the row (the all-reduce latency at which tensor
    parallelism falls behind one card), `flip_pattern` reads it (group `v`). A verdict that flips inside the
    plausible range is not distinguishable, with the range stated."""
    name: str
    value: float
    unit: str
    source: str
    low: float
    high: float
    plausible: str
    param: str = ""
    figure: Callable[[float], float] | None = None
    rule: Callable[[float], Rule] | None = None
    flip_pattern: str = ""
    log: bool = True

    def __post_init__(self):
        if not (self.low <= self.value <= self.high) or self.low >= self.high:
            raise ValueError(f"{self.name}: the plausible range {self.low}-{self.high} must hold the value used, "
                             f"{self.value}")
        if sum((bool(self.param), self.figure is not None, self.rule is not None, bool(self.flip_pattern))) != 1:
            raise ValueError(f"{self.name}: the assumption moves the figure (through a notebook parameter or a "
                             f"function) or the rule (a threshold read into the article's words), or the notebook's "
                             f"row states where it flips (`flip_pattern`), one of these")
        if self.log and self.low <= 0:
            raise ValueError(f"{self.name}: a log-scaled range needs a positive low end")


@dataclass(frozen=True)
class Reading:
    """One reading of an article's ambiguous words (「顯存占用」: the weights alone, or the weights and a KV cache),
    with the lab's figure under it: `lab_pattern` picks it out of the row's measured cell (a regex with group `v`).
    Where a claim has readings the ledger judges each and decides only where they agree."""
    name: str
    lab_pattern: str


@dataclass(frozen=True)
class Part:
    """One part of a claim made of several (acceptance of at least 0.7 on code, rewriting, translation and
    summarization, under 0.5 on open-ended writing): its figure picked out of the row's measured cell by
    `lab_pattern` (group `v`, and `lo`, `hi` for its interval) and judged by its own `rule`; the claim's verdict is
    `rules.all_of` the parts'."""
    name: str
    lab_pattern: str
    rule: Rule


@dataclass(frozen=True)
class Claim:
    """A claim: id ("003-16"), seed ("003") and section ("§2.1"), the claim in one English sentence, the article's
    number as printed. `rule` (a Number, Range or Bound) makes the ledger judge the linked row's number by the
    rules, as its notebook did; `verdict` is the verdict of an unlinked claim (a linked one's comes from its row);
    `why` says why (the argument, for one wrong by argument), or adds a note to a linked row; `decider` names
    the measurement or computation that would decide a claim not yet checked (`lab claims --check` fails
    without one); `cause` is the key of the seed's `Cause` that explains a wrong verdict (`lab claims --check`
    fails on a wrong verdict without one)."""
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
    cause: str = ""
    about: str = ""
    scope: str = ""
    model: ModelClass | None = None
    assumptions: tuple[Assumption, ...] = ()
    readings: tuple[Reading, ...] = ()
    parts: tuple[Part, ...] = ()

    def __post_init__(self):
        if self.parts and (self.rule is not None or self.link is None):
            raise ValueError(f"{self.id}: a claim made of parts is judged by its parts' rules, on a linked row")
        if self.scope and self.scope not in SCOPES:
            raise ValueError(f"{self.id}: scope {self.scope!r} is not one of {sorted(SCOPES)}")
        if self.scope and SCOPES[self.scope].needs_class and self.model is None:
            raise ValueError(f"{self.id}: a {self.scope} claim names the class of model it is about (`model`)")
        if (self.assumptions or self.readings) and self.rule is None:
            raise ValueError(f"{self.id}: assumptions and readings move a figure judged by a rule; this claim has none")
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
            if self.cause and self.verdict != BY_ARGUMENT:  # a linked row's verdict is known only once gathered
                raise ValueError(f"{self.id}: a claim {self.verdict} has no mistake of the article to name")
        elif self.verdict is not None:
            raise ValueError(f"{self.id}: a linked claim's verdict comes from its row (and its rule), not the registry")


@dataclass(frozen=True)
class Cause:
    """One underlying mistake of an article, which may make several of its claims wrong: `key` is what a
    claim's `cause` names, `section` where the mistake first appears ("§2.2"), `statement` the mistake in one
    sentence. The ledger groups the wrong verdicts by it, so a reader counts the article's errors, not its rows."""
    key: str
    section: str
    statement: str

    def __post_init__(self):
        if not self.key or self.key != self.key.strip() or " " in self.key:
            raise ValueError(f"a cause's key is one word, not {self.key!r}")
        if not self.section.startswith("§") or not self.statement.strip():
            raise ValueError(f"{self.key}: a cause names its first section (§N.N) and says what the mistake is")


def cause_table(causes: tuple[Cause, ...] | list[Cause]) -> dict[str, Cause]:
    """A seed's causes by key, in the order written; a key written twice is refused (a dict literal would keep
    the second silently)."""
    table: dict[str, Cause] = {}
    for cause in causes:
        if cause.key in table:
            raise ValueError(f"the cause {cause.key!r} is defined twice")
        table[cause.key] = cause
    return table
