"""Gathering the ledger: each claim's row found in its notebook's latest reference run, judged, and written out.

The notebooks' claims tables grew different shapes (a "claim" or an "article (...)" column; "the lab computes",
"measured here" or "evidence"; a "verdict" text and/or a "holds" flag); `_columns` maps them onto one. A linked
row that the latest reference run no longer has is kept as "evidence missing", naming the notebook, so a
changed table cannot drop a claim from the ledger silently.

The notebooks compute their verdicts with the ledger's rules (`lab.ledger.rules.verdict`), so for a claim with a
rule the ledger's verdict on the row's printed figure and the notebook's agree; where they do not, the entry
shows the rules' verdict, says what the notebook said, and `lab claims --check` fails (`Entry.disagrees`): the
notebook judged by another rule, or printed too few digits for its verdict to be read back.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

from lab.ledger.record import Claim
from lab.ledger.rules import BY_ARGUMENT, MISSING, from_notebook, judge, parse_lab
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

    @property
    def disagrees(self) -> bool:
        """The rules give the row's printed figure another verdict than its notebook wrote."""
        return self.claim.rule is not None and self.verdict != MISSING and self.verdict != self.notebook_verdict


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
        return Entry(claim, "", claim.verdict, claim.why)
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
    verdict, why = said, claim.why
    if said == BY_ARGUMENT:  # the argument is the verdict's evidence: it travels with the row
        why = "; ".join(x for x in (row.get("note", ""), why) if x)
    if claim.rule is not None:
        number = parse_lab(lab, link.lab_pattern)
        if number is None:
            return Entry(claim, lab, MISSING, f"no number in {link.notebook}'s row {index} (notebook {link.notebook})",
                         run, link.table, index, said)
        verdict = judge(claim.rule, number)
    if verdict != said:
        why = f"the notebook says {said!r}; the rules give {verdict!r} from its figure" + (f": {why}" if why else "")
    return Entry(claim, lab, verdict, why, run, link.table, index, said)


def gather(claims: list[Claim], root: Path) -> list[Entry]:
    runs = latest_reference_runs(root)
    return [resolve(c, runs) for c in claims]
