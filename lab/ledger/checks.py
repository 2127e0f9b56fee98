"""What `lab claims --check` fails on: every way the ledger can stop telling the truth about its evidence.

- **evidence missing**: a linked row is absent from its notebook's latest reference run.
- **stale**: the committed CLAIMS.csv gives a row another lab figure or verdict than its evidence run gives now
  (a run was replaced and the ledger not rewritten).
- **disagrees**: the rules give a row's printed figure another verdict than its notebook wrote (one verdict system:
  the notebook judged by another rule, or printed too few digits for its verdict to be read back).
- **undecided without a decider**: a "not yet checked" row that does not name the measurement that would decide
  it, or a "wrong by argument" row without its argument.
- **verdict literal**: study code that types a decided verdict instead of computing it (`lab.ledger.literals`).
- **causes**: a wrong verdict (wrong, wrong by rounding, wrong by argument) that names no cause, a cause its seed
  does not define, a cause named by a row that is not wrong, and a defined cause that explains no wrong verdict:
  the grouping of CLAIMS.md by the article's mistakes counts every wrong row once and no mistake without a row.

- **unscoped**: a claim without the setting it is about or without its scope (issue 40), so its verdict could
  not say where it holds.

Each failure is one line naming the claim (or the file and line), so the check's output says what to fix.
"""

from __future__ import annotations

import csv
from pathlib import Path

from lab.ledger import CAUSES, literals
from lab.ledger.gather import Entry
from lab.ledger.record import Cause
from lab.ledger.rules import BY_ARGUMENT, MISSING, NOT_YET, WRONGS


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


def failures(entries: list[Entry], committed: dict[str, dict] | None, studies: Path = literals.STUDIES,
             causes: dict[str, dict[str, Cause]] = CAUSES) -> list[str]:
    """Every failure above; `committed`: the ledger's rows as committed, before this run rewrote them."""
    return [*missing(entries), *stale(entries, committed), *disagreeing(entries), *undecided(entries),
            *(f"verdict literal: {hit}" for hit in literals.find(studies)), *unexplained(entries, causes),
            *unscoped(entries)]
