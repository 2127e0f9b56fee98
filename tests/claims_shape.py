"""The one shape of a notebook's claims table (`lab.claims.claim_row`), checked the same way for every study."""

import pandas as pd

from lab.claims import CLAIMS_COLUMNS, HOLDS, VERDICTS


def assert_one_shape(claims: pd.DataFrame) -> None:
    """Columns exactly `CLAIMS_COLUMNS`, every verdict a known word with its `holds` cell, every claim once, and a
    note wherever the verdict is not a plain "holds" (the reason the word alone does not give)."""
    assert tuple(claims.columns) == CLAIMS_COLUMNS, list(claims.columns)
    assert set(claims["verdict"]) <= set(VERDICTS), set(claims["verdict"]) - set(VERDICTS)
    assert [h for h in claims["holds"]] == [VERDICTS[v] for v in claims["verdict"]]
    assert claims["claim"].is_unique and claims["claim"].str.len().gt(0).all()
    unexplained = claims[(claims["verdict"] != HOLDS) & (claims["note"] == "")]
    assert unexplained.empty, unexplained["claim"].tolist()
