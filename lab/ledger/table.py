"""How the ledger reads a notebook's claims table: which column holds the claim and which the lab's figure,
whatever shape the table has (the notebooks grew them apart: "claim" or "article ...", "measured here",
"evidence", ...). The gathering, the rebuilds and the assumption sweeps all read rows through here."""

from __future__ import annotations

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
