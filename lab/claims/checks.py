"""What `lab claims --check` fails on: every way the ledger can stop telling the truth about its evidence.

- **evidence missing**: a linked row is absent from its notebook's latest reference run.
- **stale**: the committed CLAIMS.csv gives a row another lab figure or verdict than its evidence run gives now
  (a run was replaced and the ledger not rewritten).
- **disagrees**: the rules give a row's printed figure another verdict than its notebook wrote (one verdict system:
  the notebook judged by another rule, or printed too few digits for its verdict to be read back).
- **undecided without a decider**: a "not yet checked" row that does not name the measurement that would decide
  it, or a "wrong by argument" row without its argument.
- **verdict literal**: study code that types a decided verdict instead of computing it (`lab.claims.literals`).
- **causes**: a wrong verdict (wrong, wrong by rounding, wrong by argument) that names no cause, a cause its seed
  does not define, a cause named by a row that is not wrong, and a defined cause that explains no wrong verdict:
  the grouping of CLAIMS.md by the article's mistakes counts every wrong row once and no mistake without a row.

- **unscoped**: a claim without the setting it is about or without its scope (issue 40), so its verdict could
  not say where it holds.
- **off its class** (issue 48): a model-dependent verdict decided by a measurement on a model outside the claim's
  class, or a claim measured in a model-dependent study (quantization, KV error, acceptance) scoped as if the
  model did not matter.
- **no rule**: a measured verdict (or verdict in this setting) that takes its notebook's word, with no rule the
  ledger can apply and mutate.
- **assumption**: an assumption whose flip point could not be computed, or a threshold the lab chose (a `Bound` at
  a value the article does not print) that the row does not name as an assumption.
- **by construction**: a measured figure that no perturbation of its evidence moves (`lab.claims.rebuild`), unless
  the claim is the article's own arithmetic.

Each failure is one line naming the claim (or the file and line), so the check's output says what to fix.
"""

from __future__ import annotations

import csv
from pathlib import Path

import re
from decimal import Decimal

from lab.claims.ledger import CAUSES

from lab.claims import literals
from lab.claims.gather import Entry
from lab.claims.table import measured_cell
from lab.claims.rebuild import Rebuild, movements
from lab.claims.record import Cause
from lab.claims.rules import (BY_ARGUMENT, MEASURED, MEASUREMENTS, MISSING, NOT_YET, NUMBER, SCOPES,
                              WRONGS, Bound)

# Studies whose every measured figure depends on the model it ran: quantization error, KV error, acceptance.
MODEL_DEPENDENT_NOTEBOOKS = ("02_quantization_accuracy", "03_kv_quantization", "05_speculative_acceptance")


def missing(entries: list[Entry]) -> list[str]:
    return [f"evidence missing: {e.claim.id} ({e.claim.link.notebook}): {e.why}" for e in entries
            if e.verdict == MISSING]


def disagreeing(entries: list[Entry]) -> list[str]:
    return [f"disagrees: {e.claim.id} ({e.claim.link.notebook}): its notebook wrote {e.notebook_verdict!r}, the rules "
            f"give {e.verdict!r} from {e.lab!r}" for e in entries if e.disagrees]


def undecided(entries: list[Entry]) -> list[str]:
    out = [f"no decider: {e.claim.id}: a claim not yet checked names the measurement that would decide it"
           for e in entries if e.verdict == NOT_YET and not e.claim.decider.strip()]
    return out + [f"no argument: {e.claim.id}: a claim wrong by argument carries the argument" for e in entries
                  if e.verdict == BY_ARGUMENT and not e.why.strip()]


def unexplained(entries: list[Entry], causes: dict[str, dict[str, Cause]]) -> list[str]:
    """The wrong verdicts without a defined cause, the causes named by rows that are not wrong, and the causes
    (of the seeds `entries` cover) that explain no wrong verdict: one left over after its rows changed verdict
    would count a mistake no row shows. A row whose evidence is missing keeps its cause (it fails as missing)."""
    out, explaining = [], {seed: set() for seed in causes}
    for e in entries:
        c, key = e.claim, e.claim.cause
        if e.verdict in WRONGS and not key:
            out.append(f"no cause: {c.id}: a {e.verdict!r} verdict names the article's mistake behind it")
        elif key and key not in causes.get(c.seed, {}):
            out.append(f"undefined cause: {c.id} names {key!r}, which seed {c.seed}'s causes do not define")
        elif key and e.verdict not in (*WRONGS, MISSING):
            out.append(f"cause without a wrong verdict: {c.id} names {key!r}, but its verdict is {e.verdict!r}")
        elif key:
            explaining[c.seed].add(key)
    seeds = sorted({e.claim.seed for e in entries} & set(causes))
    return out + [f"unused cause: seed {seed}'s {key!r} explains no wrong verdict" for seed in seeds
                  for key in causes[seed] if key not in explaining[seed]]


def unscoped(entries: list[Entry]) -> list[str]:
    return [f"unscoped: {e.claim.id}: a claim names the setting it is about (`about`) and its scope (`scope`)"
            for e in entries if not (e.claim.about.strip() and e.claim.scope)]


def measured(e: Entry) -> bool:
    """Whether a verdict (or the verdict in this setting) came from a measurement or computation by a rule."""
    return e.claim.link is not None and (e.verdict in MEASURED or e.in_setting in MEASURED)


def off_class(entries: list[Entry]) -> list[str]:
    """Model-dependent verdicts decided off the claim's class, and model-dependent studies' rows scoped as though the
    model did not matter."""
    out = []
    for e in entries:
        c = e.claim
        if not c.scope or c.link is None:
            continue
        if SCOPES[c.scope].needs_class and e.verdict in MEASURED and e.evidence in MEASUREMENTS and e.undecided_by:
            out.append(f"off its class: {c.id}: decided by a measurement its class of model does not admit")
        if c.scope == "behaviour" and c.link.notebook in MODEL_DEPENDENT_NOTEBOOKS and c.link.evidence in MEASUREMENTS:
            out.append(f"off its class: {c.id}: a figure measured in {c.link.notebook} depends on the model; its scope "
                       f"is model-behaviour (with the class of model the claim is about), not behaviour")
    return out


def ruleless(entries: list[Entry]) -> list[str]:
    return [f"no rule: {e.claim.id} ({e.claim.link.notebook}): a measured verdict takes its notebook's word; give the "
            f"claim the rule its notebook judged by" for e in entries
            if measured(e) and e.claim.rule is None and not e.claim.parts]


def _printed(text: str) -> set[Decimal]:
    return {Decimal(m) for m in re.findall(NUMBER, text.replace(",", ""))}


def unnamed_assumptions(entries: list[Entry]) -> list[str]:
    """Assumptions whose flip point is missing, and thresholds the lab chose without naming them: a `Bound` at a
    value that is not a comparison's natural null (0 or 1) and that the article does not print."""
    out = [f"assumption: {e.claim.id}: {f.assumption.name}: {f.error}" for e in entries for f in e.flips if f.error]
    for e in entries:
        c = e.claim
        if isinstance(c.rule, Bound) and measured(e) and Decimal(c.rule.threshold) not in (0, 1) \
                and Decimal(c.rule.threshold) not in _printed(c.article + " " + c.claim) and not c.assumptions:
            out.append(f"assumption: {c.id}: the threshold {c.rule.threshold} is not the article's; name it as an "
                       f"assumption with its plausible range, so the ledger shows where the verdict flips")
    return out


def _readers(entry: Entry) -> tuple:
    """(the figure its verdict is judged on, the whole measured cell) as read from a row of the rebuilt table."""
    link, rule = entry.claim.link, entry.claim.rule

    def judged(row: dict):
        if rule is None:
            return measured_cell(row), row.get("verdict", "")
        number = link.figure(measured_cell(row))
        return None if number is None else (number.text, number.lo, number.hi)
    return judged, measured_cell


def by_construction(entries: list[Entry], rebuilds: dict[str, Rebuild], root: Path | None = None) -> list[str]:
    """The measured rows whose judged figure no perturbation of their evidence moves, for every notebook with a
    `Rebuild`: a row measured here (on this CPU or a GPU) whose figure stays put, and a row of any kind whose
    measured cell moves with the run's inputs while the figure its verdict reads does not (a ratio set to 1.00x
    beside figures that were measured). The article's own arithmetic, computed from what the article states, is
    exempt; so is a projection or bound that reads nothing of the run. A notebook whose claims table cannot be
    rebuilt from its run fails too."""
    out, by_notebook = [], {}
    for e in entries:
        if measured(e) and e.claim.scope != "arithmetic" and e.run_dir is not None:
            by_notebook.setdefault(e.claim.link.notebook, []).append(e)
    for notebook, group in sorted(by_notebook.items()):
        if notebook not in rebuilds:
            continue
        run_dir = group[0].run_dir
        readers = {}
        for e in group:
            judged, cell = _readers(e)
            readers[e.claim.link.match] = judged
            readers[e.claim.link.match + "\0cell"] = cell
        try:
            # the same evidence is followed many times in one process (the tests call --check repeatedly, on
            # copies of the runs too): `movements` keeps the rebuilt tables by the content of their inputs
            moved = movements(rebuilds[notebook], run_dir, readers)
        except Exception as exc:  # noqa: BLE001 - a claims table that cannot be rebuilt is itself the failure
            out.append(f"by construction: {notebook}: its claims table could not be rebuilt from {run_dir.name} "
                       f"({type(exc).__name__}: {exc})")
            continue
        for e in group:
            m, whole = moved[e.claim.link.match], moved[e.claim.link.match + "\0cell"]
            if m.base is None:
                out.append(f"by construction: {e.claim.id}: the rebuilt claims table of {notebook} has no figure for "
                           f"{e.claim.link.match!r}")
            elif m.by_construction and (e.evidence in MEASUREMENTS or not whole.by_construction):
                out.append(f"by construction: {e.claim.id} ({notebook}): no perturbation of its evidence moves its "
                           f"figure {m.base[0]!r}; make it an argument or measure what can move it")
    return out


def committed_rows(path: Path) -> dict[str, dict] | None:
    """The committed CLAIMS.csv's rows by claim id (read before `lab claims` rewrites it); None without one."""
    if not path.exists():
        return None
    with path.open(newline="") as f:
        return {r["id"]: r for r in csv.DictReader(f)}


def stale(entries: list[Entry], committed: dict[str, dict] | None, name: str = "CLAIMS.csv") -> list[str]:
    """The rows of the committed ledger (`committed_rows`) whose lab figure or verdict is not what the evidence
    gives now, and the claims it lacks or has in excess. Nothing when there is no committed ledger."""
    if committed is None:
        return []
    old, out = dict(committed), []
    for e in entries:
        was = old.pop(e.claim.id, None)
        if was is None:
            out.append(f"stale: {e.claim.id} is not in the committed {name}")
            continue
        for what, then, now in (("lab", was["lab"], e.lab), ("verdict", was["verdict"], e.verdict)):
            if then != now:
                out.append(f"stale: {e.claim.id}: the committed {name} has {what} {then!r}, its evidence gives "
                           f"{now!r}")
    return out + [f"stale: {i} is in the committed {name} but no longer a claim" for i in old]


def failures(entries: list[Entry], committed: dict[str, dict] | None, studies: Path | None = None,
             causes: dict[str, dict[str, Cause]] = CAUSES, rebuilds: dict[str, Rebuild] | None = None,
             root: Path | None = None) -> list[str]:
    """Every failure above; `committed`: the ledger's rows as committed, before this run rewrote them; `studies`:
    the code to scan for typed verdicts (default: lab/studies and lab/claims/arithmetic); `rebuilds`: each notebook's
    `Rebuild`, for the evidence-level mutation test (skipped without them)."""
    scanned = literals.find(studies) if studies is not None else literals.find()
    return [*missing(entries), *stale(entries, committed), *disagreeing(entries), *undecided(entries),
            *(f"verdict literal: {hit}" for hit in scanned), *unexplained(entries, causes),
            *unscoped(entries), *off_class(entries), *ruleless(entries), *unnamed_assumptions(entries),
            *(by_construction(entries, rebuilds, root) if rebuilds else [])]
