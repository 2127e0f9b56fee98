"""Gathering the ledger: each claim's row found in its notebook's latest reference run, judged, and written out.

The notebooks' claims tables grew different shapes (a "claim" or an "article (...)" column; "the lab computes",
"measured here" or "evidence"; a "verdict" text and/or a "holds" flag); `_columns` maps them onto one. A linked
row that the latest reference run no longer has is kept as "evidence missing", naming the notebook, so a
changed table cannot drop a claim from the ledger silently.

The notebooks compute their verdicts with the ledger's rules (`lab.ledger.rules.verdict`), so for a claim with a
rule the ledger's verdict on the row's printed figure and the notebook's agree; where they do not, the entry
shows the rules' verdict, says what the notebook said, and `lab claims --check` fails (`Entry.disagrees`): the
notebook judged by another rule, or printed too few digits for its verdict to be read back.

A verdict then says where it holds (issue 40): the evidence's kind and setting (`lab.ledger.setting`) go beside
the claim's, and `rules.scoped` keeps a verdict only where the claim's scope lets that evidence decide it; else
the row is "not checkable here" and the measured verdict is shown as the verdict in this setting. A physics
bound in the row (`Link.bound`) refutes a claim that asks for more than it allows, and otherwise says what it
allows. The notebook's note on its row (a caveat: "on this machine", "for every output that finished") travels
into the row's why.
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass
from pathlib import Path

from lab.ledger.record import Claim
from lab.ledger.rules import (ARGUMENT, BY_ARGUMENT, MEASURED, MISSING, NO_EVIDENCE, PHYSICS_BOUND, WRONG, Evidence, beyond,
                              from_notebook, judge, parse_lab, scoped)
from lab.ledger.setting import describe, run_evidence
from lab.results_index import list_runs

CLAIM_COLUMNS = ("claim",)
LAB_COLUMNS = ("the lab computes", "recomputed or measured", "measured here", "measured or computed here", "evidence")


@dataclass(frozen=True)
class Entry:
    """A claim with what its latest evidence says: the lab's figure, the verdict, and where it came from."""
    claim: Claim
    lab: str
    verdict: str
    why: str
    run_dir: Path | None = None
    table: str = ""
    row: int | None = None  # 1-based data row of the table
    notebook_verdict: str = ""
    evidence: str = NO_EVIDENCE
    lab_setting: str = ""
    in_setting: str = ""  # the measured verdict where the claim's scope does not let this evidence decide

    notebook_in_setting: str = ""  # the notebook's own verdict in its setting, where it scoped the row itself

    @property
    def disagrees(self) -> bool:
        """The rules give the row's printed figure another verdict than its notebook wrote (each before the scope
        rule moved it: a notebook that scoped its row says its measured verdict as "in this setting: ...")."""
        measured = self.in_setting or self.verdict
        said = self.notebook_in_setting or self.notebook_verdict
        return self.claim.rule is not None and measured != MISSING and measured != said


_IN_SETTING = re.compile(r"in this setting: (" + "|".join(sorted(MEASURED, key=len, reverse=True)) + ")")


def latest_reference_runs(root: Path) -> dict[str, Path]:
    """Each notebook's latest run at the reference preset under `root`."""
    return {r["notebook"]: r["dir"] for r in list_runs(root) if r["preset"] == "reference"}


def _columns(header: list[str]) -> tuple[str, str, str | None, str | None]:
    """(claim, lab, verdict, holds) column names of a claims table, whichever shape it has."""
    claim = next((h for h in header if h in CLAIM_COLUMNS or h.startswith("article")), None)
    lab = next((h for h in LAB_COLUMNS if h in header), None)
    if claim is None or lab is None:
        raise ValueError(f"a claims table without a claim or a measured column: {header}")
    return claim, lab, "verdict" if "verdict" in header else None, "holds" if "holds" in header else None


def find_rows(table: Path, match: str) -> list[tuple[int, dict, tuple]]:
    """The rows of `table` whose claim cell contains `match`, with their 1-based index and column names."""
    with table.open(newline="") as f:
        reader = csv.DictReader(f)
        cols = _columns(reader.fieldnames or [])
        return [(i, row, cols) for i, row in enumerate(reader, start=1) if match in row[cols[0]]]


def resolve(claim: Claim, runs: dict[str, Path]) -> Entry:
    """`claim` against its notebook's latest reference run (unlinked claims pass through)."""
    if claim.link is None:
        return Entry(claim, "", claim.verdict, claim.why, evidence=ARGUMENT if claim.verdict == BY_ARGUMENT
                     else NO_EVIDENCE)
    link = claim.link
    run = runs.get(link.notebook)
    table = run / link.table if run else None
    if table is None or not table.exists():
        where = f"no reference run of {link.notebook}" if run is None else f"{link.table} is not in {run.name}"
        return Entry(claim, "", MISSING, f"{where} (notebook {link.notebook})", run, link.table)
    rows = find_rows(table, link.match)
    if len(rows) != 1:
        what = "no row" if not rows else f"{len(rows)} rows"
        return Entry(claim, "", MISSING, f"{what} of {link.notebook}'s {link.table} matches {link.match!r} "
                                         f"(notebook {link.notebook})", run, link.table)
    index, row, (_, lab_col, verdict_col, holds_col) = rows[0]
    said = from_notebook(row.get(verdict_col) if verdict_col else None, row.get(holds_col) if holds_col else None)
    lab = row[lab_col]
    # a notebook that scoped its own row (notebook 02 on an already-4-bit model) writes "not checkable here" and
    # its measured verdict as "in this setting: ..." in the note: the ledger scopes that verdict by its own rule
    noted = _IN_SETTING.search(row.get("note", ""))
    noted = noted.group(1) if noted else ""
    verdict = noted or said
    # the notebook's note (its caveat, or the argument of a verdict by argument) travels with the row
    why = "; ".join(x for x in (row.get("note", ""), claim.why) if x)
    if claim.rule is not None:
        number = parse_lab(lab, link.lab_pattern)
        if number is None:
            return Entry(claim, lab, MISSING, f"no number in {link.notebook}'s row {index} (notebook {link.notebook})",
                         run, link.table, index, said)
        verdict = judge(claim.rule, number)
    if verdict != (noted or said):
        why = (f"the notebook says {noted or said!r}; the rules give {verdict!r} from its figure"
               + (f": {why}" if why else ""))
    return _scoped(Entry(claim, lab, verdict, why, run, link.table, index, said, notebook_in_setting=noted))


def _scoped(entry: Entry) -> Entry:
    """`entry` with its evidence and setting, and its verdict kept only where the claim's scope lets this evidence
    decide it (`rules.scoped`), after a physics bound in the row (`Link.bound`) has had its say."""
    claim, link = entry.claim, entry.claim.link
    evidence = run_evidence(entry.run_dir, link.evidence)
    setting = describe(entry.run_dir, evidence, link.setting)
    verdict, why = entry.verdict, entry.why
    in_setting = ""
    if claim.scope:  # a row not yet scoped keeps its verdict (`lab claims --check` fails on it)
        verdict, in_setting = scoped(claim.scope, evidence, entry.verdict)
    bound = parse_lab(entry.lab, link.bound) if link.bound and claim.rule is not None else None
    if bound is not None and in_setting:
        if beyond(claim.rule, bound.text):
            verdict, evidence = WRONG, Evidence(PHYSICS_BOUND)
            why = "; ".join(x for x in (f"more than the physics bound ({bound.text}) allows", why) if x)
        else:
            why = "; ".join(x for x in (f"the physics bound allows {bound.text}; measured in this setting: "
                                        f"{in_setting}", why) if x)
    return Entry(claim, entry.lab, verdict, why, entry.run_dir, entry.table, entry.row, entry.notebook_verdict,
                 evidence.kind, setting, in_setting, entry.notebook_in_setting)


def gather(claims: list[Claim], root: Path) -> list[Entry]:
    runs = latest_reference_runs(root)
    return [resolve(c, runs) for c in claims]
