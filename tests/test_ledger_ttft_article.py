"""Seed 002's rows in the ledger (issues 34 and 40): each says the setting it is about and its scope, quotes the
article's own phrase, and the rows the audit named are fixed: no check that cannot fail is given a verdict, the
timing claims are judged on run-level intervals, and the rows once waiting on "issue 23 item 2" link a table row."""

import os
import re
from pathlib import Path

import pytest

from lab.claims.record import SEEDS
from lab.claims.rules import BY_ARGUMENT, NOT_CHECKABLE, NOT_YET, SCOPES
from lab.claims.ttft_article import CAUSES, CLAIMS, NB06, NB09

BY_ID = {c.id: c for c in CLAIMS}
# the article prints pinyin after some characters ("時(shí)"); a quote is the text without them
TONES = "āáǎàēéěèīíǐìōóǒòūúǔùǖǘǚǜ"
GLOSS = re.compile(rf"\((?=[a-zü{TONES}]*[{TONES}])[a-zü{TONES}]+\)")


def _seeds_dir() -> Path | None:
    here = Path(__file__).resolve().parents[1]
    for d in (os.environ.get("LAB_SEEDS_DIR"), here.parent / "shared" / "seeds", here / "seeds"):
        if d and (Path(d) / SEEDS["002"]).exists():
            return Path(d)
    return None


def test_every_row_says_what_it_is_about_and_its_scope_and_every_link_its_evidence_kind():
    for c in CLAIMS:
        assert c.about.strip() and c.scope in SCOPES, c.id
        assert c.link is None or c.link.evidence, c.id


@pytest.mark.skipif(_seeds_dir() is None, reason="the source articles are not beside the repository")
def test_every_quote_is_the_articles_own_text():
    seeds = _seeds_dir()
    article = GLOSS.sub("", (seeds / SEEDS["002"]).read_text())
    for c in CLAIMS:
        quotes = re.findall(r"「(.*?)」", c.claim + c.why)
        for q in quotes:
            assert q in article, (c.id, q)
    tables = Path(__file__).resolve().parents[1] / "lab" / "studies"
    other = (seeds / SEEDS["003"]).read_text()
    for name in ("ttft_claims/table.py", "serving/claims.py"):
        for q in re.findall(r"「(.*?)」", (tables / name).read_text()):
            assert q in article or q in other, (name, q)


def test_the_rows_issue_34_names_quote_the_article_and_are_decided_from_a_table_row():
    listed = ("002-02", "002-09", "002-12", "002-14", "002-18", "002-21", "002-30", "002-31", "002-33", "002-36",
              "002-37")
    for i in listed:
        assert "「" in BY_ID[i].claim, i
    # checks that could not have failed carry no rule: the notebook marks them "not checkable here", saying why
    assert BY_ID["002-02"].rule is None and BY_ID["002-12"].rule is None
    assert BY_ID["002-02"].link.notebook == NB09 and BY_ID["002-12"].link.notebook == NB09
    # once "issue 23 item 2", now rows of notebooks 09 and 06 judged by a rule
    for i in ("002-09", "002-21", "002-33", "002-36"):
        assert BY_ID[i].link.notebook == NB09 and BY_ID[i].rule is not None, i
    assert BY_ID["002-37"].link.notebook == NB06 and BY_ID["002-37"].rule is not None
    # the interval of a timing claim is the run-level spread the cell prints: "v [lo, hi] over n runs"
    for i in ("002-18", "002-31", "002-37"):
        assert "(?P<lo>" in BY_ID[i].link.lab_pattern, i
    assert BY_ID["002-30"].verdict == BY_ARGUMENT and BY_ID["002-14"].section == "§3.1"


def test_undecided_rows_say_why_and_at_most_a_handful_are_not_yet_checked():
    not_yet = [c for c in CLAIMS if c.verdict == NOT_YET]
    assert len(not_yet) <= 5 and all(c.decider for c in not_yet)
    assert all(c.why for c in CLAIMS if c.verdict == NOT_CHECKABLE)
    assert not any("issue 23" in c.why for c in CLAIMS)


def test_gpu_speed_rows_name_no_cause_unless_arithmetic_or_an_argument_can_refute_them():
    # a CPU measurement of a GPU speed is the verdict in this setting only: no mistake of the article to name
    for c in CLAIMS:
        if c.scope == "gpu-speed" and c.cause:
            assert c.link is not None and c.link.evidence == "arithmetic", c.id
    assert len({c.cause for c in CLAIMS if c.cause}) == len(CAUSES)
