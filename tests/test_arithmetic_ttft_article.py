"""Seed 002's arithmetic (`lab.claims.arithmetic.ttft_article`): its rows build, each claim cell is unique and found by its
ledger link, each verdict is what the ledger's rule gives the printed figure, and another model, prompt or load
time turns it (the comparisons are not true by construction)."""

import pytest

from lab.claims.rules import HOLDS, WRONG, verdict
from lab.claims.ttft_article import CLAIMS, MEM
from lab.claims.arithmetic import ttft_article

LINKED = [c for c in CLAIMS if c.link is not None and c.link.notebook == MEM]


@pytest.fixture(scope="module")
def rows():
    return ttft_article.rows()


def test_rows_build_with_unique_claims_each_found_by_one_ledger_link(rows):
    claims = [r["claim"] for r in rows]
    assert len(set(claims)) == len(claims) and all(c.startswith("002 §") for c in claims)
    assert {c.id for c in LINKED} == {"002-38", "002-39", "002-40"}
    for c in LINKED:
        assert sum(c.link.match in r["claim"] for r in rows) == 1, c.id


def test_each_verdict_is_the_ledger_rule_on_the_printed_figure(rows):
    for c in LINKED:
        [row] = [r for r in rows if c.link.match in r["claim"]]
        lab = c.link.figure(row["measured here"])
        assert row["verdict"] == verdict(c.rule, lab.text, lab.interval), c.id
        assert row["verdict"] == verdict(c.rule, float(lab.text)), c.id  # printed to the digits its verdict needs


def test_a_miss_is_compute_bound_at_the_articles_prompt_and_memory_bound_at_a_few_tokens():
    rule = next(c.rule for c in LINKED if c.id == "002-38")
    long, short = ttft_article.miss_bound(prompt=1024), ttft_article.miss_bound(prompt=16)
    assert verdict(rule, long["memory_s"] / long["compute_s"]) == WRONG
    assert verdict(rule, short["memory_s"] / short["compute_s"]) == HOLDS  # below the ridge a prefill reads more


def test_a_70b_in_fp16_overflows_one_card_and_an_8b_does_not():
    rule = next(c.rule for c in LINKED if c.id == "002-39")
    assert verdict(rule, ttft_article.fp16_over_card()) == HOLDS
    assert verdict(rule, ttft_article.fp16_over_card("llama-3-8b")) == WRONG
    assert verdict(rule, ttft_article.fp16_over_card(gpu="h200")) == WRONG  # 141 GiB holds a 70B's 131 GiB


def test_hbm_would_bound_a_load_only_if_the_load_took_about_as_long_as_writing_hbm():
    rule = next(c.rule for c in LINKED if c.id == "002-40")
    assert verdict(rule, ttft_article.hbm_share_of_load()) == WRONG
    write_s = ttft_article.hbm_share_of_load(load_s=1.0)  # seconds to write the 70B into A100 memory
    assert verdict(rule, ttft_article.hbm_share_of_load(load_s=write_s * 1.5)) == HOLDS
