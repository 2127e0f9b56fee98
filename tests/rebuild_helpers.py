"""What the evidence-rebuild tests share: each notebook's `Rebuild` (`lab.studies.evidence`), the latest reference
runs, and a table read back the way the ledger reads claims.csv."""

from __future__ import annotations

import io
from pathlib import Path

import pandas as pd

from lab.claims.gather import latest_reference_runs
from lab.claims.rebuild import Rebuild

RESULTS = Path(__file__).resolve().parents[1] / "results"


def rebuild_of(notebook: str) -> Rebuild:
    from lab.studies.evidence import rebuilds

    return rebuilds()[notebook]


def reference_runs() -> dict[str, Path]:
    return latest_reference_runs(RESULTS)


def as_saved(table: pd.DataFrame) -> pd.DataFrame:
    """`table` as claims.csv holds it, read back as text (what the ledger reads)."""
    buf = io.StringIO()
    table.to_csv(buf, index=False)
    buf.seek(0)
    return pd.read_csv(buf, dtype=str, keep_default_na=False)


def rebuilt_and_committed(notebook: str, run: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The notebook's claims table rebuilt from `run`'s inputs and the one the run saved, both as text, checked to
    have the same columns and rows."""
    rebuild = rebuild_of(notebook)
    assert rebuild.notebook == notebook
    got = as_saved(rebuild.table(rebuild.load(run)))
    want = pd.read_csv(run / rebuild.name, dtype=str, keep_default_na=False)
    assert list(got.columns) == list(want.columns)
    assert len(got) == len(want)
    return got, want
