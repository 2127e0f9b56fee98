"""What `lab claims --check` fails on: every way the ledger can stop telling the truth about its evidence.

- **evidence missing**: a linked row is absent from its notebook's latest reference run.
- **stale**: the committed CLAIMS.csv gives a row another lab figure or verdict than its evidence run gives now
  (a run was replaced and the ledger not rewritten).
- **disagrees**: the rules give a row's printed figure another verdict than its notebook wrote (one verdict system:
  the notebook judged by another rule, or printed too few digits for its verdict to be read back).
- **undecided without a decider**: a "not yet checked" row that does not name the measurement that would decide
  it, or a "wrong by argument" row without its argument.
- **verdict literal**: study code that types a decided verdict instead of computing it (`lab.ledger.literals`).

Each failure is one line naming the claim (or the file and line), so the check's output says what to fix.
"""

from __future__ import annotations

import csv
from pathlib import Path

from lab.ledger import literals
from lab.ledger.gather import Entry
from lab.ledger.rules import BY_ARGUMENT, MISSING, NOT_YET


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


def failures(entries: list[Entry], committed: dict[str, dict] | None, studies: Path = literals.STUDIES) -> list[str]:
    """Every failure above; `committed`: the ledger's rows as committed, before this run rewrote them."""
    return [*missing(entries), *stale(entries, committed), *disagreeing(entries), *undecided(entries),
            *(f"verdict literal: {hit}" for hit in literals.find(studies))]
