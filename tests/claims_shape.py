"""The one shape of a notebook's claims table (`lab.claims.table.claim_row`), checked the same way for every study."""

import pandas as pd

from lab.claims.table import CLAIMS_COLUMNS, HOLDS, VERDICTS


def assert_one_shape(claims: pd.DataFrame) -> None:
    """Columns exactly `CLAIMS_COLUMNS`, every verdict a known word with its `holds` cell, every claim once, and a
    note wherever the verdict is not a plain "holds" (the reason the word alone does not give)."""
    assert tuple(claims.columns) == CLAIMS_COLUMNS, list(claims.columns)
    assert set(claims["verdict"]) <= set(VERDICTS), set(claims["verdict"]) - set(VERDICTS)
    assert [h for h in claims["holds"]] == [VERDICTS[v] for v in claims["verdict"]]
    assert claims["claim"].is_unique and claims["claim"].str.len().gt(0).all()
    unexplained = claims[(claims["verdict"] != HOLDS) & (claims["note"] == "")]
    assert unexplained.empty, unexplained["claim"].tolist()


def assert_links_find_one_row(claims: pd.DataFrame, notebook: str) -> None:
    """Every ledger link to `notebook` matches exactly one claim cell, and a linked rule can read its figure."""
    from lab.claims.ledger import CLAIMS

    for c in CLAIMS:
        if c.link is not None and c.link.notebook == notebook:
            [row] = claims[claims["claim"].str.contains(c.link.match, regex=False)].to_dict("records")
            if c.rule is not None:
                assert c.link.figure(row["measured here"]) is not None, c.id


def assert_ledger_reads_the_same(claims: pd.DataFrame, notebook: str, run_dir, tmp_path) -> None:
    """`claims`, rebuilt from the committed run `run_dir` with the current code and written as `Run.save_table`
    writes it, gives the ledger the same verdicts and figures as the committed table for every linked claim, and
    for a claim with a rule the verdict the notebook wrote is the one the rules give its printed figure."""
    from lab.claims.ledger import CLAIMS
    from lab.claims.gather import resolve
    from lab.claims.rules import MISSING

    claims.to_csv(tmp_path / "claims.csv", index=False)
    linked = [c for c in CLAIMS if c.link is not None and c.link.notebook == notebook]
    assert linked
    for c in linked:
        new, old = resolve(c, {notebook: tmp_path}), resolve(c, {notebook: run_dir})
        assert new.verdict != MISSING, new.why
        assert not new.disagrees, new.why  # one verdict system: the rules read back what the notebook wrote
        assert (new.verdict, new.notebook_verdict) == (old.verdict, old.notebook_verdict), c.id
        if c.rule is not None:
            assert c.link.figure(new.lab) == c.link.figure(old.lab), c.id
