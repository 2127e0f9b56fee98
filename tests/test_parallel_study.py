"""Notebook 08's logic without processes: the per-rank memory account, the bubble table, the projection, the
claims table's shape.
(The notebook itself runs at the smoke preset in tests/test_notebooks.py; the engine's shards are checked against
the same account in tests/test_tensor_parallel.py.)"""

import re

import pandas as pd
import pytest

from lab import memory as mem
from lab.claims.rules import Number, verdict
from lab.studies.parallelism import measure as study
from lab.studies.parallelism.claims import claims_table

from claims_shape import assert_links_find_one_row, assert_one_shape


def test_rank_memory_adds_up_to_the_whole_model():
    for name, tp in (("llama-3-70b", 8), ("smollm2-135m", 2), ("smollm2-135m", 3), ("llama-3-8b", 4)):
        shape = mem.ModelShape.preset(name)
        ranks = study.rank_memory(shape, tp)
        whole = mem.weight_bytes(shape, "bf16")
        norms = whole["router_and_norms"]  # replicated on every rank
        assert ranks["weight bytes"].sum() == pytest.approx(whole["total"] + (tp - 1) * norms)
        assert ranks["KV bytes per token"].sum() == pytest.approx(mem.kv_bytes_per_token(shape, "bf16"))
    smol = study.rank_memory(mem.ModelShape.preset("smollm2-135m"), 2)
    assert list(smol["KV bytes per token"]) == [2 * 30 * 2 * 64 * 2, 2 * 30 * 1 * 64 * 2]  # 2 of 3 KV heads on rank 0


def test_bubble_table_and_projection():
    table = study.bubble_model(2, (1, 2, 8))
    assert list(table["bubble (model)"]) == pytest.approx([1 / 2, 1 / 3, 1 / 9]) and list(table["m >= 4p"]) == [False, False, True]
    p = study.ParallelParams()
    proj = study.projection(p)
    assert set(proj["link"]) == {"nvlink-h100x8", "pcie5-h100x8"} and len(proj) == 2 * len(p.PROJECT_BATCHES)
    by = proj.set_index(["link", "batch"])
    assert by.loc[("pcie5-h100x8", 256), "comm share"] > by.loc[("nvlink-h100x8", 256), "comm share"]
    assert (proj["all-reduces"] == 2 * 80 + 1).all()


def test_params_refuse_bad_values_by_name():
    with pytest.raises(ValueError, match="unknown model 'llama-9'"):
        study.ParallelParams(PROJECT_MODEL="llama-9")
    with pytest.raises(ValueError, match="PP_BATCH=0"):
        study.ParallelParams(PP_BATCH=0)


def test_claims_have_one_shape_and_keep_the_rows_the_ledger_links():
    p = study.ParallelParams()
    tp = pd.DataFrame([{"phase": "decode", "tokens": 1, "TP=1 ms": 14.0, "TP=2 ms": 99.0,
                        "comm share (measured)": 0.72, "speedup": 14 / 99}])
    bubble = pd.DataFrame([{"phase": phase, "micro_batches": m, "m >= 4p": m >= 8, "wait share (measured)": w,
                            "bubble (p - 1) / (m + p - 1)": 1 / (m + 1), "PP=2 ms": ms}
                           for phase, rows in (("prefill", ((1, 0.5, 670.0), (8, 0.11, 505.0))),
                                               ("decode", ((1, 0.5, 58.0), (8, 0.4, 181.0))))
                           for m, w, ms in rows])
    per_rank = study.rank_memory(mem.ModelShape.preset(p.PROJECT_MODEL), p.PROJECT_TP)
    claims = claims_table(p, tp, study.projection(p), bubble, per_rank)
    assert_one_shape(claims)
    assert_links_find_one_row(claims, "08_parallelism")
    for match in ("with Replay on", "TP without fast links", "communication eats most of the compute",
                  "PP: micro-batches at least 4x",
                  "TP inside a node of at most 8 cards", "a 70B model in FP16 takes 140 GB",
                  "over 8 A100s with TP: 17.5 GB", "8-card TP across nodes"):
        assert claims["claim"].str.contains(match, regex=False).sum() == 1, match
    by = claims.set_index("claim")
    measured = by.loc["a 70B model in FP16 takes 140 GB", "measured here"]
    assert re.search(r"(?P<v>\d+(?:\.\d+)?) GB", measured).group("v") == "141.1"  # the ledger's lab_pattern
    card = by.loc["140 GB in FP16 over 8 A100s with TP: 17.5 GB per card"]
    assert re.search(r"(?P<v>\d+(?:\.\d+)?) GB \(", card["measured here"]).group("v") == "17.64"
    assert card["verdict"] == "holds" and "weights only" in card["note"]
    assert by.loc["8-card TP across nodes adds 10-15% to TTFT", "verdict"] == "not checkable here"
    replay = claims[claims["claim"].str.contains("with Replay on")].iloc[0]
    # the ledger reads "v [lo, hi]": the share on NVLink and the span to PCIe
    assert re.match(r"[\d.]+% \[[\d.]+, [\d.]+\], NVLink to PCIe", replay["measured here"])
    assert replay["verdict"] == verdict(Number("40", exact=False), *_span(replay["measured here"]))


def _span(cell):
    v, lo, hi = re.match(r"([\d.]+)% \[([\d.]+), ([\d.]+)\]", cell).groups()
    return v, (lo, hi)


def test_the_replay_share_grows_with_the_window_it_carries():
    """More replayed tokens put more bytes in each all-reduce while the weight-bound compute stays: the share
    with Replay on rises with the window, and exceeds the plain decode step's (window 0)."""
    from lab.studies.parallelism.claims import replay_step_shares

    p = study.ParallelParams()
    shares = [replay_step_shares(p, w)["pcie5-h100x8"] for w in (0, 16, 64, 256)]
    assert shares == sorted(shares) and shares[0] < shares[-1]


def test_tp_over_a_slow_link_is_judged_on_the_projection_and_comes_out_either_way():
    """Seeds/003 §4.3's "even slower than one card" and §7.1's "most of the compute", on the projection over a link
    without NVLink: PCIe Gen5's assumed latency leaves 8 cards ahead of one while the collectives take most of the
    step; a link with a network's latency puts TP behind one card. This machine's TP=2 (which cannot win on 2 cores)
    is shown and decides nothing."""
    from lab.parallel.comm_model import LINKS, Link

    p = study.ParallelParams()
    tp = pd.DataFrame([{"phase": "decode", "tokens": 1, "TP=1 ms": 14.0, "TP=2 ms": 99.0,
                        "comm share (measured)": 0.72, "speedup": 14 / 99}])

    def rows(link):
        proj = study.projection(p, {"nvlink-h100x8": LINKS["nvlink-h100x8"], "pcie5-h100x8": link})
        by = claims_table(p, tp, proj, _bubble(), study.rank_memory(mem.ModelShape.preset(p.PROJECT_MODEL),
                                                                      p.PROJECT_TP)).set_index("claim")
        slower = by[by.index.str.startswith("TP without fast links")].iloc[0]
        most = by[by.index.str.contains("communication eats most of the compute")].iloc[0]
        return slower, most

    slower, most = rows(LINKS["pcie5-h100x8"])
    assert slower["verdict"] == "wrong" and float(re.match(r"[\d.]+", slower["measured here"]).group()) > 1
    assert "gloo" in slower["measured here"] and "decides nothing" in slower["note"]
    assert most["verdict"] == "holds"
    slower, _ = rows(Link("a network link", 500e-6, 10e9))
    assert slower["verdict"] == "holds"


def _bubble():
    return pd.DataFrame([{"phase": phase, "micro_batches": m, "m >= 4p": m >= 8, "wait share (measured)": 0.1,
                          "bubble (p - 1) / (m + p - 1)": 1 / (m + 1), "PP=2 ms": 100.0}
                         for phase in ("prefill", "decode") for m in (1, 8)])
