"""Seed 000's arithmetic recomputed (lab.claims.arithmetic.replay_article): the rows build, each claim cell is unique and
found by exactly one ledger link, each verdict is what the rules give the printed figure, and a wrong input flips
the verdict it decides."""

import pytest

from lab import memory as mem
from lab.machine.hardware import GPUS
from lab.claims.rules import HOLDS, WRONG, Bound, Number, Range, verdict
from lab.claims.replay_article import CLAIMS
from lab.replay.cost import window_cost
from lab.claims.arithmetic import replay_article

ROWS = replay_article.rows()
S = replay_article.seventy_b()
LINKED = {c.link.match: c for c in CLAIMS if c.link is not None and c.link.notebook == "01_memory_accounting"}


def _claim(row):
    [claim] = [c for m, c in LINKED.items() if m in row["claim"]]
    return claim


def test_rows_build_with_unique_claim_cells_led_by_seed_and_section():
    cells = [r["claim"] for r in ROWS]
    assert len(cells) == len(set(cells)) and all(c.startswith("000 §") for c in cells)
    for a in cells:  # no cell contains another, so a link's substring finds one row
        assert not any(a != b and a in b for b in cells)


@pytest.mark.parametrize("row", ROWS, ids=[r["claim"][:40] for r in ROWS])
def test_each_row_is_linked_once_and_its_verdict_is_the_rules_on_its_printed_figure(row):
    claim = _claim(row)
    lab = claim.link.figure(row["measured here"])
    assert row["verdict"] == verdict(claim.rule, lab.text, lab.interval), claim.id
    assert row["holds"] == (row["verdict"] == HOLDS)


def test_the_articles_formulas_against_a_hand_computation():
    assert replay_article.formula_flops(S, 64) == 80 * 64 * (2 * 8192 * 128 + 64 * 128)
    assert replay_article.formula_flops(S, 32) == 5_379_194_880
    assert replay_article.formula_bytes(S, 64) == 80 * 64 * 512 == 2_621_440
    assert replay_article.formula_bytes(S, 131072) == 80 * 131072 * 512


def _verdict(match, value, interval=None):
    return verdict(next(c for m, c in LINKED.items() if match in m).rule, value, interval)


def test_a_wrong_input_flips_the_articles_own_arithmetic():
    assert _verdict("its 2.6 MB", replay_article.formula_bytes(S, 64)) == HOLDS
    assert _verdict("its 2.6 MB", 8 * replay_article.formula_bytes(S, 64)) == WRONG  # eight KV heads: not its product
    assert _verdict("its 128K read", replay_article.formula_bytes(S, 131072)) == HOLDS
    assert _verdict("its 128K read", replay_article.formula_bytes(S, 65536)) == WRONG
    assert _verdict("last 32 tokens (its formula", replay_article.formula_flops(S, 32)) == HOLDS
    assert _verdict("last 32 tokens (its formula", replay_article.formula_flops(S, 64)) == WRONG
    # its ratio: what it printed holds only for a quotient it did not compute
    assert _verdict("107", 10.7e9 / 2.62e6) == WRONG and _verdict("107", 4072.3) == HOLDS


def test_its_range_at_40_to_60_percent_holds_only_with_its_tenfold_flops():
    peak = GPUS["h100-sxm"].peak_flops
    ms = {e: 1e3 * replay_article.formula_flops(S, 32) / (e * peak) for e in (0.4, 0.5, 0.6)}
    assert _verdict("40-60%", ms[0.5], (ms[0.6], ms[0.4])) == WRONG
    assert _verdict("40-60%", 10 * ms[0.5]) == HOLDS  # with its 53.8e9 rather than 5.38e9


def test_a_wrong_input_flips_the_claims_its_example_settles():
    # a window of 64 is twice the thousandth of the context; 32 rounds to it
    ctx = window_cost(S, 32768, 0).recompute_flops
    assert _verdict("32-token window's recompute", window_cost(S, 32, 32768 - 32).recompute_flops / ctx) == HOLDS
    assert _verdict("32-token window's recompute", window_cost(S, 64, 32768 - 64).recompute_flops / ctx) == WRONG
    # the smaller model over the bigger one would be below 1: the order of the comparison is what it decides
    small = mem.ModelShape.preset("llama-3-8b")
    big, little = (window_cost(m, 32, 32768 - 32).flops_per_kv_byte for m in (S, small))
    assert _verdict("bigger models", big / little) == WRONG
    assert _verdict("bigger models", little / big) == HOLDS
    # ten requests at 8K would be tens of GB; at 32K they are over a hundred
    assert _verdict("the KV of 10 requests", 10 * mem.kv_cache_bytes(S, 8192, dtype="fp16") / 1e9) == HOLDS
    assert _verdict("the KV of 10 requests", 10 * mem.kv_cache_bytes(S, 32768, dtype="fp16") / 1e9) == WRONG
    # replay that left three quarters of each sequence uncached would quadruple the concurrency
    kv = mem.kv_cache_bytes(S, 32768, dtype="fp16")
    assert _verdict("one card's concurrency", 8 * kv / mem.kv_cache_bytes(S, 32768 // 4, dtype="fp16")) == HOLDS
    assert _verdict("one card's concurrency", 8 * kv / mem.kv_cache_bytes(S, round(0.6 * 32768), dtype="fp16")) \
        == WRONG
    # a window's recompute against its KV: above the ridge point (does not pay) unless FLOPs were a hundredth
    fpb64 = window_cost(S, 64, 0).flops_per_kv_byte
    assert _verdict("does not pay", fpb64) == HOLDS and _verdict("does not pay", fpb64 / 2000) == WRONG


def test_the_rules_are_the_ones_the_rows_print():
    kinds = {type(_claim(r).rule) for r in ROWS}
    assert kinds <= {Number, Range, Bound}
