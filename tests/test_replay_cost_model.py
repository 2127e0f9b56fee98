"""The engine's recompute cost model (lab.replay.engine_cost, issue 34 item 7): each term's formula against a hand
computation, the prediction as the sum of its terms, the terms' work against what the engine's step actually
does (where the roofline before them counted other work), the microbenchmarks that give their ceilings, and the
notebook's tables built on them (errors, break-even verdicts measured and predicted side by side, the growth with
the prefix that decides two of the article's claims)."""

import math

import numpy as np
import pandas as pd
import pytest
import torch

import lab.models.attention as attention_math
from lab.engine import LLM
from lab.memory import ModelShape
from lab.models import load_model
from lab.replay.cost import window_cost
from lab.replay.engine_cost import Ceilings, Terms, attention_flops, gather_bytes
from lab.replay.measure import RecomputeBench
from lab.replay.microbench import measure_ceilings, reference_keys
from lab.studies.replay_break_even import judge_predictions, summarize, terms_table
from lab.studies.replay_break_even.claims import measured_rows, prefix_growth


def test_gather_bytes_is_whole_blocks_of_k_and_v():
    # 17 positions in blocks of 16 are 2 blocks; K and V; 3 KV heads of 64; bf16
    assert gather_bytes(17, 16, 3, 64, 2) == 2 * 2 * 16 * 3 * 64 * 2 == 24576
    assert gather_bytes(32, 16, 3, 64, 2) == gather_bytes(17, 16, 3, 64, 2)
    assert gather_bytes(0, 16, 3, 64, 2) == 0
    with pytest.raises(ValueError):
        gather_bytes(-1, 16, 3, 64, 2)


def test_attention_flops_count_every_score_of_every_head():
    # QK^T: 2 d per (head, query, key); PV as much again
    assert attention_flops(9, 64, 16, 1040) == 2 * 2 * 64 * 9 * 16 * 1040


CEIL = Ceilings(layers=30, heads=9, kv_heads=3, head_dim=64, block_size=16, dtype_bytes=2, fixed_s=0.01,
                forward_s={16: 0.05, 64: 0.12}, gather_Bps=10e9, attention_Fps={16: 50e9, 64: 100e9},
                attention_keys=2816)


def test_each_term_against_a_hand_computation_and_the_prediction_is_their_sum():
    t = CEIL.predict(1024, 64)
    blocks = math.ceil((1024 + 64) / 16)  # 68
    assert t.fixed == 0.01 and t.forward == 0.12
    assert t.gather == pytest.approx(30 * 2 * blocks * 16 * 3 * 64 * 2 / 10e9)
    assert t.attention == pytest.approx(30 * 4 * 9 * 64 * 64 * (1024 + 64) / 100e9)
    assert t.total == pytest.approx(t.fixed + t.forward + t.gather + t.attention)
    assert t.largest() == "forward"
    assert Terms(1, 2, 3, 4).total == 10 and Terms(1, 2, 3, 4).largest() == "attention"


def test_the_prefix_reaches_the_prediction_through_gather_and_attention_only():
    near, far = CEIL.predict(1024, 16), CEIL.predict(7680, 16)
    assert (near.fixed, near.forward) == (far.fixed, far.forward)
    assert far.gather - near.gather == pytest.approx(30 * 2 * (7696 - 1040) * 3 * 64 * 2 / 10e9)
    assert far.attention / near.attention == pytest.approx(7696 / 1040)
    with pytest.raises(KeyError):
        CEIL.predict(1024, 32)  # no ceiling measured for that window


def test_the_attention_rate_is_measured_between_the_prefixes_in_whole_blocks():
    assert reference_keys((1024, 2048, 4096, 7680), 16) == 2800
    assert reference_keys((64, 128), 16) == 96
    assert reference_keys((1,), 16) == 16


@pytest.fixture(scope="module")
def tiny_bench(one_thread):
    model, _ = load_model("random:tiny", dtype=torch.float32, device="cpu", max_positions=256)
    total = 160
    ids = torch.randint(0, model.config.vocab_size, (total,), generator=torch.Generator().manual_seed(0)).tolist()
    llm = LLM(model, num_kv_blocks=-(-(total + 2) // 16), max_model_len=total + 16, max_num_batched_tokens=256)
    return RecomputeBench(llm, ids)


def test_the_terms_count_the_work_the_engines_step_does_which_the_roofline_did_not(tiny_bench, monkeypatch):
    """A recompute step gathers whole blocks of the M + W positions' K and V per layer and scores each of its W
    queries against all M + W keys: what the gather and attention terms count. The roofline before them counted
    the prefix's KV read once (M positions, no blocks, no copy) and half the window's scores (causal), so this
    test fails on its terms."""
    c = tiny_bench.llm.runner.model.config
    store = tiny_bench.llm.runner.kv
    gathered, scored = [], []
    gather = store.gather
    monkeypatch.setattr(store, "gather", lambda layer, blocks, *a: gathered.append(blocks.numel()) or
                        gather(layer, blocks, *a))
    causal = attention_math.causal_attention
    monkeypatch.setattr(attention_math, "causal_attention",  # *layout: a window and a soft cap, None here
                        lambda q, k, v, *layout: scored.append((q.shape[0], k.shape[0])) or causal(q, k, v))
    prefix, window = 100, 24
    tiny_bench.seconds(prefix, window, 1)  # a warm-up call and one timed: two steps
    steps, layers = 2, c.num_hidden_layers
    element = store.k_cache[0].element_size()
    per_block = 16 * c.num_key_value_heads * c.head_dim * element
    copied = 2 * sum(gathered) * per_block / steps  # K and V
    assert copied == layers * gather_bytes(prefix + window, 16, c.num_key_value_heads, c.head_dim, element)
    assert scored == [(window, prefix + window)] * (steps * layers)
    counted = layers * attention_flops(c.num_attention_heads, c.head_dim, *scored[0])
    shape = ModelShape.from_hf_config(c.to_hf_dict(), "tiny")
    old = window_cost(shape, window, prefix, dtype_bytes=element)
    assert old.prefix_read_bytes != copied and old.attention_flops != counted  # what the roofline lacked


def test_the_microbenchmarks_give_every_ceiling_and_the_model_predicts_each_point(tiny_bench):
    ceil = measure_ceilings(tiny_bench, (16, 32), (64, 128), 1)
    assert set(ceil.forward_s) == set(ceil.attention_Fps) == {16, 32}
    assert ceil.fixed_s >= 0 and ceil.gather_Bps > 0 and all(v > 0 for v in ceil.forward_s.values())
    assert ceil.attention_keys == 96 and ceil.layers == tiny_bench.llm.runner.model.config.num_hidden_layers
    t = ceil.predict(128, 32)
    assert t.total > 0 and np.isfinite(t.total)


def _measured() -> pd.DataFrame:
    rows = []
    for model, k in (("a", 1.0), ("b", 2.0)):
        for m in (1024, 2048, 4096):
            for w in (16, 64):
                t = k * 1e-3 * w * (m / 1024) ** 0.7
                rows.append({"model": model, "prefix": m, "window": w, "recompute_s": t,
                             "predicted_s": t * (1.1 if m < 4096 else 1.5), "predicted_roofline_s": t / 4,
                             "predicted_article_s": t / 10, "achieved_GFLOPs": 100.0, "hcache_restore_s": t / 20,
                             "fixed_s": 0.0, "forward_s": t / 2, "gather_s": 0.0, "attention_s": t / 2,
                             "largest_term": "forward", "load host memory s": 0.02, "load disk file s": 1.0})
    return judge_predictions(pd.DataFrame(rows))


def test_the_break_even_verdicts_measured_and_predicted_stand_side_by_side():
    df = _measured()
    assert df["model_error"].tolist()[:3] == pytest.approx([0.1, 0.1, 0.1])
    off = df[df["model_error"].abs() > 0.2]
    assert (off["unexplained_s"] == off["recompute_s"] - off["predicted_s"]).all()
    assert (df.loc[df["model_error"].abs() <= 0.2, "unexplained_s"] == 0).all()
    tier = "host memory"
    assert (df[f"measured: recompute beats {tier}"] == (df["recompute_s"] < 0.02)).all()
    assert (df[f"model: recompute beats {tier}"] == (df["predicted_s"] < 0.02)).all()
    s = summarize(df).set_index("model")
    assert s.loc["a", "model_within_20pct"] == 4 and s.loc["a", "roofline_within_20pct"] == 0
    assert s.loc["a", f"recompute_beats_{tier}"] == int(df[df.model == "a"][f"measured: recompute beats {tier}"].sum())
    assert s.loc["a", "verdict_agrees_disk file"] == 6  # every recompute beats a 1 s disk read, as predicted
    assert list(terms_table(df).columns[:6]) == ["model", "prefix", "window", "recompute_s", "predicted_s",
                                                 "model_error"]


def test_the_growth_with_the_prefix_decides_the_articles_claims_and_can_come_out_either_way():
    df = _measured()
    growth = prefix_growth(df)
    assert growth.tolist() == pytest.approx([0.7] * 4)
    rows = {r["claim"][:4]: r for r in measured_rows(df)}
    assert rows["§2.2"]["verdict"] == "wrong" and "0.7" in rows["§2.2"]["measured here"]
    assert rows["§4.1"]["verdict"] == "wrong" and "0.7" in rows["§4.1"]["measured here"]
    flat = df.assign(recompute_s=1e-3 * df["window"])  # a recompute that did not grow with M
    rows = {r["claim"][:4]: r for r in measured_rows(flat)}
    assert rows["§2.2"]["verdict"] == "holds"
    shrinking = df.assign(recompute_s=1e-3 * df["window"] * (1024 / df["prefix"]))
    assert {r["claim"][:4]: r for r in measured_rows(shrinking)}["§4.1"]["verdict"] == "holds"
