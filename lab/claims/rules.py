"""The one verdict system (issue 23 item 1, issue 34 item 1): every verdict on a claim, in a notebook's claims table
and in the ledger, is `verdict(rule, the lab's value, its interval)`, so it is a function of the evidence that can
come out either way, never a word typed beside a number.

A claim is judged from the article's number as the article prints it: printed precision matters, "35.8" says
"to a tenth", "5.7e14" says "to 1e13". Only the claim's precision sets the rounding: a lab value printed more
coarsely than the claim ("2" against "1.6") stands for the span its last digit allows (1.5-2.5), which decides
nothing at the claim's precision unless the whole span does.

Verdicts, in three kinds that the ledger counts apart:

- measured (from a number, by the rules below):
  - **holds**: the lab's value agrees with the claim under the rule for its kind.
  - **wrong**: it does not, by more than rounding.
  - **wrong by rounding**: the article's own arithmetic, printed wrong in the last digit: the claim and the lab's
    number differ by less than one unit of the claim's last printed digit, but the lab's number rounds to
    something else (70e9 x 0.55 B = 35.86 GiB printed as "35.8" rather than 35.9). A slip of the pen.
  - **not distinguishable**: the lab's interval (a confidence interval, the span its assumptions allow, or the
    span its printed digits allow) holds values the rule would call different things.
- **wrong by argument**: no number can decide the claim; an argument written in the row refutes it (the first
  token of a new prompt costs the same with or without a KV cache: there is nothing cached yet).
- undecided:
  - **not checkable here**: the claim needs what this lab does not have (a GPU, a cluster, a 70B checkpoint), or
    it is a setting or a definition rather than a statement with a truth value; the row says which.
  - **not yet checked**: this lab could check it but no notebook does yet; the row names what would decide it.

Rules, by the kind of claim (each a region of values that holds; an interval holds when it lies wholly inside
the region, is wrong when it lies wholly in one wrong region, and is not distinguishable otherwise):

- `Number(text, exact=True)`: the article's own arithmetic on inputs it states (the figure is determined, so the
  only slack is printing). The lab's value rounded to the claim's printed precision equals the claim -> holds;
  differs from it by less than one unit of that precision -> wrong by rounding; else wrong.
- `Number(text, exact=False)`: an estimate about a real model, device or measurement, where modelling choices the
  article does not state move the figure: holds within `rel_tol` (2%) of the claim, or when it rounds to the
  claim at the claim's precision; wrong otherwise.
- `Range(lo, hi)` (an end may be open: "at least 4x"): holds when the lab's value, rounded to the finest precision
  the range's ends are printed to, is inside; wrong when outside.
- `Bound(threshold, above)`: a comparison the claim implies without printing a number to round ("recomputing
  beats receiving": receive / recompute above 1), or a criterion a notebook states for a qualitative claim
  ("hardly worth it": under 1.1x): holds strictly on the claimed side, wrong elsewhere: the threshold itself
  refutes a strict claim (two identical formats, a ratio of exactly 1 [1, 1], say neither is better), while an
  interval from the threshold into the claimed side is not distinguishable.
- A claim with no number ("keys are more sensitive than values") takes its notebook's verdict, which the notebook
  computes from its evidence with the functions here (`Bound` on an interval, `from_flag` on a comparison);
  `from_notebook` reads it back in these words.

Scope (issue 40): a verdict says where it holds. The articles speak of 70B models served in fp16 on H100s; the lab
measures a 135M model whose weights are already 4-bit, on a 2-core CPU. `scoped` lets a measurement decide a claim
only where the evidence's setting matches the claim's in what the claim depends on, by one rule per kind of claim
(`SCOPES`); elsewhere the verdict is "not checkable here" and the measurement's verdict is kept apart as the
verdict *in this setting*, so a reader counting "wrong" counts the articles' errors, not the lab's setting. A figure
that depends on the model (acceptance, quantization error, how a cost grows with context) is decided only on a model
of the claim's class, its scale band and architecture (`ModelClass`, issue 48), and `undecided_by` names the
dimension of the setting that kept a measurement from deciding.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal

from lab.claims.model_class import ModelClass

HOLDS, WRONG, ROUNDING, NOT_DISTINGUISHABLE = "holds", "wrong", "wrong by rounding", "not distinguishable"
BY_ARGUMENT = "wrong by argument"
NOT_CHECKABLE, NOT_YET = "not checkable here", "not yet checked"
MEASURED = (HOLDS, WRONG, ROUNDING, NOT_DISTINGUISHABLE)  # from a number, by a rule
ARGUED = (BY_ARGUMENT,)                                   # from an argument written in the row
UNDECIDED = (NOT_CHECKABLE, NOT_YET)
VERDICTS = (*MEASURED, *ARGUED, *UNDECIDED)
# The verdicts that say the article is wrong: each names the article's mistake behind it (`lab.claims.record.Cause`).
WRONGS = (WRONG, ROUNDING, BY_ARGUMENT)
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
class Bound:
    """The claim that the lab's quantity lies above (`above`) or below `threshold`, strictly and unrounded: a
    comparison the article implies, or the criterion a notebook states for a qualitative claim."""
    threshold: str
    above: bool = True

    def __post_init__(self):
        Decimal(self.threshold)


Rule = Number | Range | Bound


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


def precision(rule: Rule) -> int:
    """The exponent of the claim's last printed digit (a range: its finer end), the only precision that rounds."""
    if isinstance(rule, Number):
        return exponent(rule.text)
    if isinstance(rule, Bound):
        return exponent(rule.threshold)
    return min(exponent(end) for end in (rule.lo, rule.hi) if end is not None)


def _unit(exp: int) -> Decimal:
    return Decimal(1).scaleb(exp)


def _round(value: Decimal, exp: int) -> Decimal:
    return value.quantize(_unit(exp), rounding=ROUND_HALF_UP) if value.is_finite() else value


def _decimal(value) -> Decimal | None:
    """A printed figure as it reads, a float at its shortest exact form; None for NaN (no value: no verdict)."""
    if isinstance(value, Decimal):
        return None if value.is_nan() else value
    if isinstance(value, str):
        return _decimal(Decimal(value))
    value = float(value)
    return None if math.isnan(value) else Decimal(repr(value))


def _point(rule: Rule, x: Decimal) -> str:
    """The verdict on one exact value."""
    if isinstance(rule, Bound):
        t = Decimal(rule.threshold)
        return HOLDS if (x > t if rule.above else x < t) else WRONG
    exp = precision(rule)
    if isinstance(rule, Range):
        x = _round(x, exp)
        inside = (rule.lo is None or x >= Decimal(rule.lo)) and (rule.hi is None or x <= Decimal(rule.hi))
        return HOLDS if inside else WRONG
    a = Decimal(rule.text)
    if _round(x, exp) == a:
        return HOLDS
    if rule.exact:
        return ROUNDING if abs(x - a) < _unit(exp) else WRONG
    return HOLDS if abs(x - a) <= Decimal(str(rule.rel_tol)) * abs(a) else WRONG


def _edges(rule: Rule) -> list[Decimal]:
    """The values where `_point`'s verdict can change: an interval over one of them may hold two verdicts."""
    if isinstance(rule, Bound):
        return [Decimal(rule.threshold)]
    half = _unit(precision(rule)) / 2
    if isinstance(rule, Range):
        return [Decimal(e) + d for e, d in ((rule.lo, -half), (rule.hi, half)) if e is not None]
    a = Decimal(rule.text)
    step = 2 * half if rule.exact else Decimal(str(rule.rel_tol)) * abs(a)
    return [a - half, a + half, a - step, a + step]


def _printed_span(rule: Rule, text: str) -> tuple[Decimal, Decimal] | None:
    """The span a figure printed more coarsely than the claim stands for (its last digit, plus or minus half)."""
    exp = exponent(text)
    if exp <= precision(rule):
        return None
    half, v = _unit(exp) / 2, Decimal(text)
    return v - half, v + half


def verdict(rule: Rule, value, interval=None) -> str:
    """THE verdict on a claim: `rule` (the claim's number, range or bound, at its printed precision) against the
    lab's `value` (a printed figure or a float) and its `interval` (low, high) where it has one. Over an
    interval, one verdict when every value in it gets that verdict, else not distinguishable; no value (NaN):
    not distinguishable."""
    v = _decimal(value)
    if v is None:
        return NOT_DISTINGUISHABLE
    if interval is None and isinstance(value, str):
        interval = _printed_span(rule, value)
    if interval is None:
        return _point(rule, v)
    ends = [_decimal(x) for x in interval]
    if None in ends:
        return NOT_DISTINGUISHABLE
    lo, hi = min(ends), max(ends)
    seen = {_point(rule, lo), _point(rule, hi)} | {_point(rule, e) for e in _edges(rule) if lo <= e <= hi}
    return seen.pop() if len(seen) == 1 else NOT_DISTINGUISHABLE


def side(rule: Rule, value: float) -> int:
    """Which side of the claim's band `value` misses it on: -1 below, +1 above, 0 where it holds."""
    x = Decimal(repr(float(value)))
    if _point(rule, x) == HOLDS:
        return 0
    if isinstance(rule, Bound):
        return -1 if rule.above else 1
    return -1 if x < Decimal(rule.lo if isinstance(rule, Range) and rule.lo is not None else
                             rule.text if isinstance(rule, Number) else rule.hi) else 1


def judge(claim: Rule, lab: LabNumber) -> str:
    """`verdict` on the lab's number as its table prints it."""
    return verdict(claim, lab.text, lab.interval)


def from_flag(holds) -> str:
    """The verdict of a comparison a notebook computed from its evidence: True (numpy's bools too) holds, False is
    wrong, None (the evidence decides neither way) is not distinguishable."""
    return NOT_DISTINGUISHABLE if holds is None else HOLDS if bool(holds) else WRONG


def all_of(*verdicts: str) -> str:
    """The verdict on a claim made of parts, each judged: wrong (by rounding) when a part is, holds when every part
    holds, else not distinguishable."""
    for word in (WRONG, ROUNDING):
        if word in verdicts:
            return word
    return HOLDS if all(v == HOLDS for v in verdicts) else NOT_DISTINGUISHABLE


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


def run_cell(before: str) -> str:
    """A `Link.lab_pattern` for the figure after `before` in a run-level cell (`lab.claims.across_runs.text` writes "v [lo, hi]
    over n runs"). A cell from fewer than three runs has no interval and gives the ledger no number (its notebook
    gave no verdict)."""
    return rf"{before}(?P<v>{NUMBER}) \[(?P<lo>{NUMBER}), (?P<hi>{NUMBER})\] over"


def from_notebook(verdict_text: str | None, holds: str | None) -> str:
    """A notebook's own verdict (its "verdict" text and/or "holds" column) in the ledger's words."""
    text = (verdict_text or "").strip().lower()
    flag = (holds or "").strip().lower()
    if text in VERDICTS:  # the one shape writes the words themselves
        return text
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


# Evidence kinds (issue 40): how the lab's figure was obtained, which the ledger counts verdicts by.
ON_CPU, ON_GPU = "measured on this CPU", "measured on a GPU"
PROJECTED, PHYSICS_BOUND, ARITHMETIC = "projected to a GPU", "a physics bound", "arithmetic"
ARGUMENT, NO_EVIDENCE = "argument", "none"
EVIDENCE = (ON_CPU, ON_GPU, PROJECTED, PHYSICS_BOUND, ARITHMETIC, ARGUMENT, NO_EVIDENCE)


@dataclass(frozen=True)
class Evidence:
    """What a verdict rests on: its `kind` (`EVIDENCE`) and, for a measurement, whether the model measured had
    16-bit weights (`weights16`: False for the embedded model, dequantized from a Q4_1 GGUF; None when unknown)
    and its class (`model`: None when unknown)."""
    kind: str
    weights16: bool | None = None
    model: ModelClass | None = None

    def __post_init__(self):
        if self.kind not in EVIDENCE:
            raise ValueError(f"evidence kind {self.kind!r} is not one of {EVIDENCE}")


@dataclass(frozen=True)
class Scope:
    """A kind of claim and the evidence that can decide it: `decides` (kinds whose verdict stands), `refutes`
    (kinds that can only show the claim impossible, a bound: "wrong" stands, anything else says what it allows),
    `needs16` (only a model with 16-bit weights decides), `needs_class` (a measurement decides only on a model of
    the claim's class: its scale band and architecture), and `wanting`, what would decide it otherwise."""
    name: str
    meaning: str
    decides: tuple[str, ...]
    refutes: tuple[str, ...] = ()
    needs16: bool = False
    needs_class: bool = False
    wanting: str = ""


SCOPES = {s.name: s for s in (
    Scope("arithmetic", "the article's own arithmetic on inputs it states, or a published figure",
          (ARITHMETIC, ON_CPU, ON_GPU, PROJECTED, PHYSICS_BOUND)),
    Scope("behaviour", "what a method or system does whatever the model and the device's speed: token and byte "
                       "counts, blocks held, exactness, what a scheduler or a cache does",
          (ON_CPU, ON_GPU, ARITHMETIC, PROJECTED)),
    Scope("model-behaviour", "what a method does that depends on the model it runs: acceptance, quantization and KV "
                             "error, perplexity changes, how a cost grows with context on a given machine",
          (ON_CPU, ON_GPU, ARITHMETIC, PROJECTED), needs_class=True,
          wanting="the same measurement on a model of the claim's class (its scale and architecture: `lab run all "
                  "--model`), or a projection from measured inputs"),
    Scope("gpu-speed", "a time, speed or speedup on a GPU (its kernels, its serving stack)",
          (ON_GPU, PROJECTED), refutes=(PHYSICS_BOUND, ARITHMETIC),
          wanting="a measurement on the GPU the claim names"),
    Scope("weight-accuracy", "the accuracy cost of quantizing the weights of a 16-bit model",
          (ON_CPU, ON_GPU), needs16=True,
          wanting="the same measurement on a 16-bit checkpoint (notebook 02's MODEL parameter)"),
)}
MEASUREMENTS = (ON_CPU, ON_GPU)


def undecided_by(scope: str, evidence: Evidence, claim_model: ModelClass | None = None) -> str:
    """What keeps `evidence` from deciding a claim of `scope` about models of `claim_model` ("" where nothing does):
    the device, the weights' precision, or the model's scale or architecture."""
    rule = SCOPES[scope]
    if evidence.kind in (ARGUMENT, NO_EVIDENCE):
        return ""
    if evidence.kind not in rule.decides:
        return f"device ({evidence.kind}; the claim needs {rule.wanting or ', '.join(rule.decides)})"
    if rule.needs16 and evidence.weights16 is not True:
        return "weight precision (the measured model's weights are not 16-bit)"
    if rule.needs_class and evidence.kind in MEASUREMENTS:
        return (claim_model or ModelClass()).mismatch(evidence.model)
    return ""


def scoped(scope: str, evidence: Evidence, measured: str, claim_model: ModelClass | None = None) -> tuple[str, str]:
    """(the verdict, the verdict in the lab's setting): `measured` stands where `undecided_by` finds nothing in the
    way; elsewhere the verdict is "not checkable here" and `measured` is kept as the verdict in this setting. A
    bound that refutes a claim (`Scope.refutes`) decides "wrong" only: a claim inside what physics allows is not
    thereby shown to hold."""
    rule = SCOPES[scope]
    if measured not in MEASURED or evidence.kind in (ARGUMENT, NO_EVIDENCE):
        return measured, ""
    if not undecided_by(scope, evidence, claim_model):
        return measured, ""
    if evidence.kind in rule.refutes and measured in (WRONG, ROUNDING):
        return measured, ""
    return NOT_CHECKABLE, measured


def beyond(rule: Rule, bound) -> bool:
    """Whether a claim asks for more than a physics bound on the same quantity allows (a speedup above what the
    bytes read permit): its smallest value, less half a unit of its last printed digit, above `bound`. A claim
    with no lower end (an upper bound itself) never exceeds one."""
    b = _decimal(bound)
    if b is None:
        return False
    half = _unit(precision(rule)) / 2
    if isinstance(rule, Number):
        low = Decimal(rule.text) - half
    elif isinstance(rule, Range):
        low = None if rule.lo is None else Decimal(rule.lo) - half
    else:
        low = Decimal(rule.threshold) if rule.above else None
    return low is not None and low > b
