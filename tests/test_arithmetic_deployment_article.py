"""Seed 003's arithmetic recomputed (`lab.claims.arithmetic.deployment_article`): the rows build in the one shape, every claim cell
is unique in notebook 01's table (so a ledger link finds one row), each verdict is the rules' on the printed figure,
and a wrong input moves the figure across the claim, so no row holds by construction."""

import re

import pandas as pd
import pytest

from claims_shape import assert_one_shape

from lab import memory as mem
from lab.claims.ledger import CLAIMS
from lab.claims.rules import ARITHMETIC, HOLDS, ROUNDING, WRONG, verdict
from lab.studies.memory_accounting import measure as memory_accounting
from lab.claims.arithmetic import Paging, deployment_article

ROWS = pd.DataFrame(deployment_article.rows(Paging(600, 2000, 6000, 8192)))  # notebook 01's defaults
# Each row's rule is its ledger claim's: the row an arithmetic link in notebook 01 finds.
LINKED = {c.link.match: c for c in CLAIMS if c.seed == "003" and c.link is not None
          and c.link.notebook == "01_memory_accounting" and c.link.evidence == ARITHMETIC}


def _row(match: str) -> pd.Series:
    [row] = ROWS[ROWS["claim"].str.contains(match, regex=False)].to_dict("records")
    return pd.Series(row)


def test_the_rows_have_the_one_shape_and_unique_claims_in_notebook_01s_table():
    assert_one_shape(ROWS)
    assert ROWS["claim"].is_unique and ROWS["claim"].str.startswith("003 §").all()
    table = memory_accounting.claims_table()
    for match in LINKED:
        assert table["claim"].str.contains(match, regex=False).sum() == 1, match


def test_every_verdict_is_the_rules_on_the_printed_figure():
    for match, claim in LINKED.items():
        rows = ROWS[ROWS["claim"].str.contains(match, regex=False)]
        if rows.empty:  # one of notebook 01's own rows (lab.studies.memory_accounting)
            continue
        row = rows.iloc[0]
        lab = claim.link.figure(row["measured here"])
        assert row["verdict"] == verdict(claim.rule, lab.text, lab.interval), claim.id


def test_the_article_s_own_rounding_and_its_example_shape_come_out_wrong():
    assert _row("a 4096-token reservation")["verdict"] == ROUNDING  # 0.878 printed as eight tenths
    assert _row("the example for a real 70B")["verdict"] == WRONG  # 80 layers: 119 GiB
    assert _row("the example's total")["verdict"] == HOLDS  # its own 32 layers: 70.9 GiB


@pytest.mark.parametrize("match, rule_of, wrong_input", [
    # a 3-layer model would make the example's 32 requests fit in 80 GB: the claim is not true whatever the shape
    ("the example for a real 70B", "76", lambda: deployment_article._total(mem.ModelShape("3L", 1, 1, 1, 3, 8, 8, 128), 32, "fp16")),
    # 48 layers instead of 32 push the article's own example out of "seventy-some GB"
    ("the example's total", "60", lambda: deployment_article._total(mem.ModelShape("48L", 1, 1, 1, 48, 8, 8, 128), 32, "fp16")),
    # a 1000-token request in the reservation would waste 76%, which rounds to eight tenths
    ("a 4096-token reservation", "27", lambda: mem.paging_waste([1000], 4096, 4096)["contiguous_waste_fraction"]),
    # with MHA's 32 KV heads the same FP8 cache is 64 GiB, not 16
    ("an FP8 KV cache for 32 requests", "68", lambda: mem.kv_cache_bytes(deployment_article.MHA, 8192, 32, dtype="fp8") / mem.GIB),
    # at 200 TFLOP/s (not 300+), the prefill takes over 7 s
    ("prefill of 5.73e14 FLOPs at 40%", "11", lambda: 5.734e14 / (0.4 * 200e12)),
])
def test_a_wrong_input_moves_the_figure_across_the_claim(match, rule_of, wrong_input):
    claim = next(c for c in CLAIMS if c.id == f"003-{rule_of}")
    computed = verdict(claim.rule, _row(match)["measured here"].split()[0])
    assert verdict(claim.rule, wrong_input()) != computed, match


def test_the_paging_rows_read_notebook_01s_lengths():
    p = memory_accounting.MemoryParams()
    waste = pd.DataFrame(memory_accounting.paging_table(p)).set_index("block_size")
    printed = float(re.match(r"[\d.]+", _row("paged KV waste at block 16")["measured here"]).group())
    assert printed == pytest.approx(100 * waste.loc[16, "paged_waste_fraction"], rel=1e-3)
