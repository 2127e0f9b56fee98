"""The KV-quantization study's measurements on a tiny random model: shapes, buckets, and the orderings that
must hold whatever the model (fewer bits, more error; exact formats, zero error)."""

from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch

from claims_shape import assert_one_shape

from lab.claims.table import HOLDS, WRONG
from lab.kv.calibration import calibrate_kv_absmax
from lab.kv.format import parse_format
from lab.stats.intervals import NOT_DISTINGUISHABLE, Interval
from lab.studies.kv_quantization import (attention_error_by_position, error_growth, kl_by_position,
                                         position_buckets, record)
from lab.studies.kv_quantization.claims import (bucket_table, claims_table, decide, growth_slope, item_intervals,
                                                role_table)

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def tiny():
    from lab.models import load_model

    model, _ = load_model("random:tiny", dtype=torch.float32, device="cpu")
    ids = torch.randint(0, model.config.vocab_size, (96,), generator=torch.Generator().manual_seed(1)).tolist()
    return model, ids


def test_parse_format():
    fmt, roles = parse_format("int2/per-channel/window=8/k-only")
    assert (fmt.dtype, fmt.granularity, fmt.window, roles) == ("int2", "per-channel", 8, "k")
    assert parse_format("fp8_e4m3/pre-rope")[0].pre_rope and parse_format("int8")[1] == "kv"
    for bad in ("int3", "int4/per-block", "int4/window=x", ""):
        with pytest.raises(ValueError):
            parse_format(bad)


def test_position_buckets_cover_every_position_once():
    b = position_buckets(1000, 256)
    assert b == [(0, 256), (256, 512), (512, 1000)]
    assert position_buckets(100, 256) == [(0, 100)]


def test_errors_by_position(tiny):
    model, ids = tiny
    rec = record(model, ids)
    exact = rec.hidden
    err = {d: attention_error_by_position(model, rec, parse_format(f"{d}/per-token")[0]) for d in ("int8", "int4", "int2")}
    assert all(e.shape == (len(ids),) for e in err.values())
    assert err["int8"].mean() < err["int4"].mean() < err["int2"].mean()
    window = parse_format(f"int2/per-token/window={len(ids)}")[0]
    assert attention_error_by_position(model, rec, window).abs().max() < 1e-5
    # A window applies per query: the first `w` positions see only recent keys, so no error there.
    w8 = attention_error_by_position(model, rec, parse_format("int2/per-token/window=8")[0])
    assert w8[:8].abs().max() < 1e-5 and w8[8:].mean() > 0 and w8.mean() < err["int2"].mean()
    assert kl_by_position(model, ids, exact, window, chunk=40).abs().max() < 1e-6
    from lab.models.attention import causal_attention, partly_exact_attention

    q, k, v = rec.q[0], rec.k[0], rec.v[0]
    none = torch.zeros(len(ids), len(ids), dtype=torch.bool)
    assert torch.allclose(partly_exact_attention(q, k * 0.5, v * 0.5, k, v, None, None),
                          causal_attention(q, k * 0.5, v * 0.5), atol=1e-5)
    assert torch.allclose(partly_exact_attention(q, k * 0.5, v * 0.5, k, v, ~none, ~none),
                          causal_attention(q, k, v), atol=1e-5)
    assert torch.allclose(partly_exact_attention(q, k * 0.5, v, k, v, none, ~none),
                          causal_attention(q, k * 0.5, v), atol=1e-5)
    kl = kl_by_position(model, ids, exact, parse_format("int4/per-token")[0], chunk=40)
    assert kl.shape == (len(ids),) and (kl >= 0).all() and kl.mean() > 0
    k_only = attention_error_by_position(model, rec, parse_format("int2")[0], "k")
    v_only = attention_error_by_position(model, rec, parse_format("int2")[0], "v")
    assert k_only.mean() > 0 and v_only.mean() > 0


def test_formats_measured_together_read_the_exact_logits_once(tiny, monkeypatch):
    """`kl_by_position_of` (what `error_growth` calls): the LM head runs once a chunk on the exact hidden states for
    every format together (once per format before: 2 F chunks' heads where F + 1 do), with each format's KL as
    measured alone, bit for bit."""
    from lab.eval.kv_error import kl_by_position_of

    model, ids = tiny
    rec = record(model, ids)
    names = ("int4/per-token", "int8/per-token", "int4/per-token/k-only")
    formats = {n: (*parse_format(n), None) for n in names}
    alone = {n: kl_by_position(model, ids, rec.hidden, *formats[n], chunk=40) for n in names}
    heads, real = [], model.compute_logits
    monkeypatch.setattr(model, "compute_logits", lambda h: (heads.append(len(h)), real(h))[1])
    together = kl_by_position_of(model, ids, rec.hidden, formats, chunk=40)
    assert len(heads) == (len(names) + 1) * 3  # 96 positions: chunks of 40, 40 and 16
    assert all(torch.equal(together[n], alone[n]) for n in names)
    heads.clear()
    error_growth(model, ids, list(names), None, first_bucket=16, log=lambda *_: None)
    assert len(heads) == len(names) + 1  # one chunk of 512 rows holds the 96 positions


def test_error_growth_table(tiny):
    model, ids = tiny
    scales = calibrate_kv_absmax(model, [ids[:40]])
    names = ["int4/per-token", "fp8_e4m3/per-tensor", "int4/per-token/k-only", "int4/per-token/v-only"]
    blocks = error_growth(model, ids, names, scales, first_bucket=16, stride=2, block=4, log=lambda *_: None)
    assert set(blocks["metric"]) == {"attention_rel_error", "next_token_kl"}
    assert len(blocks) == 4 * 2 * len(ids) // 4
    assert (blocks.loc[blocks["metric"] == "attention_rel_error", "measured"] == 2).all()
    df = bucket_table(blocks)
    assert len(df) == 4 * 2 * len(position_buckets(len(ids), 16))
    # The pooled blocks give the bucket's mean over positions, inside its interval.
    rec = record(model, ids)
    kl = kl_by_position(model, ids, rec.hidden, parse_format("int4/per-token")[0])
    got = df[(df["format"] == "int4/per-token") & (df["metric"] == "next_token_kl")]
    assert got["value"].iloc[0] == pytest.approx(float(kl[:16].mean()), rel=1e-5)
    assert (df["value_low"] <= df["value"]).all() and (df["value"] <= df["value_high"]).all()
    assert (df["value_low"] < df["value_high"]).any()
    slope = growth_slope(blocks[~blocks["format"].str.contains("only")], "next_token_kl")
    assert list(slope["format"]) == ["int4/per-token", "fp8_e4m3/per-tensor"] and (slope["x_per_doubling"] > 0).all()
    for col in ("x_per_doubling", "first_bucket", "last_over_first"):
        assert (slope[f"{col}_low"] <= slope[col]).all() and (slope[col] <= slope[f"{col}_high"]).all()
    assert set(slope["growth"]) <= {"distinguishable", NOT_DISTINGUISHABLE}
    roles = role_table(blocks)
    r = roles.iloc[0]
    assert r["format"] == "int4/per-token" and r["next_token_kl_k_over_v_low"] <= r["next_token_kl_k_over_v"] <= \
        r["next_token_kl_k_over_v_high"]
    assert r["next_token_kl_k_over_v"] == pytest.approx(r["next_token_kl_k_only"] / r["next_token_kl_v_only"])


def test_a_verdict_is_not_distinguishable_when_its_interval_holds_the_boundary():
    assert decide(Interval(1.3, 0.9, 1.8), 1.0, True) == NOT_DISTINGUISHABLE
    assert decide(Interval(1.3, 1.1, 1.8), 1.0, True) == HOLDS
    assert decide(Interval(1.3, 1.1, 1.8), 1.0, False) == WRONG
    assert decide(Interval(0.5, 0.4, 0.6), 1.0, False) == HOLDS
    assert decide(Interval(1.0, 1.0, 1.0), 1.0, True) == WRONG  # identical formats: neither wins (the rules' Bound)
    assert decide(Interval(1.1, 1.0, 1.2), 1.0, True) == NOT_DISTINGUISHABLE  # from the threshold into the claim
    assert decide(Interval(float("nan"), float("nan"), float("nan")), 1.0, True) == NOT_DISTINGUISHABLE


def _synthetic_blocks(length: int = 512) -> pd.DataFrame:
    """Blocks of every format the claims compare, at levels that decide each claim: per-tensor 10x per-token,
    scale 1.0 as good as calibrated, keys 10x values, per-channel keys 10x better, FP8 10x INT8 per token and half
    of it per tensor; every error doubling per doubling of position."""
    rng = np.random.default_rng(0)
    levels = {"fp8_e4m3/per-tensor": 1.0, "fp8_e4m3/per-tensor/unit-scale": 1.0, "fp8_e4m3/per-token": 0.1,
              "int8/per-tensor": 2.0, "int8/per-token": 0.01, "int4/per-tensor": 10.0, "int4/per-token": 1.0,
              "int4/per-token/k-only": 1.0, "int4/per-token/v-only": 0.1, "int4/per-channel/group16/k-only": 0.1}
    rows = []
    for name, level in levels.items():
        for metric in ("attention_rel_error", "next_token_kl"):
            for a, b in position_buckets(length, 64):
                rows += [{"format": name, "metric": metric, "positions": f"{a}-{b}", "position_end": b,
                          "block_start": s, "measured": 16, "value": level * b * rng.uniform(0.8, 1.2)}
                         for s in range(a, b, 16)]
    return pd.DataFrame(rows)


def _e2e_row(name, ppl, lost, pass_change):
    return {"format": name, "perplexity_change_pct": ppl[0], "perplexity_change_pct_low": ppl[1],
            "perplexity_change_pct_high": ppl[2], "pass_change": pass_change[0], "pass_change_low": pass_change[1],
            "pass_change_high": pass_change[2], "items": 100, "items_lost": lost, "items_gained": 0,
            "same_output_all": 0.5}


def test_growth_is_judged_only_on_contexts_of_a_few_thousand_tokens():
    blocks = _synthetic_blocks(4096)
    claims, _ = claims_table(SimpleNamespace(SAFE_PPL_PCT=1.0), blocks, role_table(blocks[blocks["format"].str.endswith(
        ("k-only", "v-only"))]), pd.DataFrame([_e2e_row("int4/per-token", (17.0, 15.0, 19.0), 30, (-0.3, -0.4, -0.2))]))
    verdicts = dict(zip(claims["claim"], claims["verdict"]))
    assert verdicts["the error grows with context, so short prompts hide it"] == HOLDS  # doubling per doubling


def test_the_claims_table_has_the_one_shape_and_every_ledger_link_reads_one_row(tmp_path):
    """Synthetic measurements that decide every claim: the table in the one shape, its measured cells led by
    "v [low, high]" (the intervals table's figures), and each of the ledger's links to notebook 03 finding
    exactly one row whose verdict the ledger reads back as written."""
    from lab.claims.ledger import CLAIMS
    from lab.claims.gather import find_rows
    from lab.claims.rules import from_notebook, parse_lab

    blocks = _synthetic_blocks()
    roles = role_table(blocks[blocks["format"].str.endswith(("k-only", "v-only"))])
    e2e = pd.DataFrame([_e2e_row("fp8_e4m3/per-tensor", (0.5, 0.2, 0.8), 0, (0.0, -0.02, 0.02)),
                        _e2e_row("int8/per-token", (0.5, 0.2, 1.5), 2, (-0.02, -0.05, 0.01)),
                        _e2e_row("int4/per-token", (17.0, 15.0, 19.0), 30, (-0.3, -0.4, -0.2))])
    claims, intervals = claims_table(SimpleNamespace(SAFE_PPL_PCT=1.0), blocks, roles, e2e)
    assert_one_shape(claims)
    assert list(intervals.columns) == ["claim", "value", "value_low", "value_high", "null", "significance"]
    assert list(intervals["claim"]) == list(claims["claim"])
    verdicts = dict(zip(claims["claim"], claims["verdict"]))
    assert verdicts["FP8 (e4m3, calibrated per-tensor scale) is safe"] == HOLDS
    assert verdicts["INT8 needs care (is not safe as is)"] == NOT_DISTINGUISHABLE  # within 1% is not sure, 2 lost
    assert verdicts["INT4 is not safe for online serving"] == HOLDS
    assert verdicts["vLLM's default scale of 1.0 hurts FP8 quality"] == WRONG
    # 512 tokens of context cannot show what the claim says happens after a few thousand: not checkable here
    growth = claims.set_index("claim").loc["the error grows with context, so short prompts hide it"]
    assert growth["verdict"] == "not checkable here" and "reach 512 tokens" in growth["note"]
    assert all(verdicts[c] == HOLDS for c in claims["claim"] if c.startswith(("keys", "per-token")))
    finer = "for the KV cache FP8 is a finer format than INT8"
    assert verdicts[f"{finer} (per-token scales)"] == WRONG and verdicts[f"{finer} (per-tensor scales)"] == HOLDS
    for (_, row), (_, iv) in zip(claims.iterrows(), intervals.iterrows()):
        got = parse_lab(row["measured here"])
        assert (float(got.text), float(got.lo), float(got.hi)) == pytest.approx(
            (iv["value"], iv["value_low"], iv["value_high"]), rel=5e-3, abs=5e-3), row["measured here"]
    claims.to_csv(tmp_path / "claims.csv", index=False)  # as `Run.save_table` writes it
    links = [c.link for c in CLAIMS if c.link is not None and c.link.notebook == "03_kv_quantization"]
    assert len(links) == 8  # seven of seed 003, and seed 002's FP8-against-INT8 row (002-51)
    for link in links:
        (_, row, _), = find_rows(tmp_path / "claims.csv", link.match)
        assert from_notebook(row["verdict"], row["holds"]) == row["verdict"]


def test_growth_slope_interval_brackets_a_known_slope():
    """Blocks whose error doubles per doubling of position, with noise: x per doubling near 2 and its interval
    excluding 1; flat blocks: an interval holding 1, "not distinguishable"."""
    rng = np.random.default_rng(0)
    rows = []
    for name, growth in (("grows", 2.0), ("flat", 1.0)):
        for a, b in position_buckets(512, 64):
            for s in range(a, b, 16):
                rows += [{"format": name, "metric": "next_token_kl", "positions": f"{a}-{b}", "position_end": b,
                          "block_start": s, "measured": 16, "value": growth ** np.log2(b) * rng.uniform(0.5, 1.5)}]
    slope = growth_slope(pd.DataFrame(rows), "next_token_kl").set_index("format")
    assert slope.loc["grows", "x_per_doubling_low"] > 1.5 and slope.loc["grows", "growth"] == "distinguishable"
    assert slope.loc["flat", "x_per_doubling_low"] < 1 < slope.loc["flat", "x_per_doubling_high"]
    assert slope.loc["flat", "growth"] == NOT_DISTINGUISHABLE


def test_attention_error_sampled_positions_equal_the_full_measure(tiny):
    model, ids = tiny
    rec = record(model, ids)
    for name in ("int4/per-token", "int2/per-channel/group8/window12", "int4/per-channel/group8/k-only"):
        fmt, roles = parse_format(name)
        full = attention_error_by_position(model, rec, fmt, roles)
        sampled = attention_error_by_position(model, rec, fmt, roles, stride=5)
        assert torch.allclose(sampled[::5], full[::5], atol=1e-5) and sampled[1::5].isnan().all()


def test_study_formats_and_parameters():
    from lab.studies.kv_quantization import KVStudyParams, study_format

    fmt, roles, unit = study_format("fp8_e4m3/per-tensor/unit-scale")
    assert (fmt.dtype, fmt.granularity, roles, unit) == ("fp8_e4m3", "per-tensor", "kv", True)
    assert parse_format("int2/per-channel/group32/window128")[0] == parse_format("int2/per-channel/group=32/window=128")[0]
    with pytest.raises(ValueError, match="unit-scale"):
        study_format("int8/per-token/unit-scale")
    with pytest.raises(ValueError, match="together"):
        KVStudyParams(E2E_FORMATS=("int4/per-token/k-only",))
    with pytest.raises(ValueError, match="CONTEXT"):
        KVStudyParams(CONTEXT=16384)
    with pytest.raises(ValueError, match="block size"):
        KVStudyParams(E2E_FORMATS=("int4/per-channel/group32",))
    with pytest.raises(ValueError, match="int5"):
        KVStudyParams(GROWTH_FORMATS=("int5/per-token",))


def test_engine_concurrency_is_what_the_memory_account_predicts(smollm):
    """The engine, given a pool of so many MiB, runs as many sequences at once as lab.memory's bytes per token
    say fit, for the model's dtype and for quantized formats (a window's lanes reported beside the pool)."""
    from lab.studies.kv_quantization import max_concurrency

    model, tok = smollm
    scales = calibrate_kv_absmax(model, [list(range(100, 140))])
    df = max_concurrency(model, tok, ["auto", "fp8_e4m3/per-tensor", "int4/per-token", "int2/per-channel/window16"],
                         scales, pool_mib=2.0, seq_len=32, shape_name="smollm2-135m")
    assert (df["measured_sequences"] == df["predicted_sequences"]).all(), df
    assert (df["bytes_per_token"] == df["bytes_per_token_account"]).all(), df
    assert list(df["measured_sequences"]) == sorted(df["measured_sequences"]) and df["measured_sequences"].iloc[0] > 0
    assert df["staging_MiB"].iloc[-1] > 0 and (df["staging_MiB"].iloc[:-1] == 0).all()


def test_perplexity_change_is_paired_over_sequences(tiny):
    """The change against the exact cache brackets the pooled perplexities' ratio; the exact cache against
    itself changes nothing, "not distinguishable"."""
    from lab.eval.scores import perplexity, score_sequences
    from lab.studies.kv_quantization.claims import perplexity_change

    model, ids = tiny
    seqs = [ids[i:i + 24] for i in range(0, 96, 24)]
    kv = (parse_format("int2/per-token")[0], None)
    exact, quant = score_sequences(model, model, seqs), score_sequences(model, model, seqs, kv)
    got = perplexity_change(quant, exact)
    want = 100 * (perplexity(model, seqs, kv) / perplexity(model, seqs) - 1)
    assert got["perplexity_change_pct"] == pytest.approx(want, rel=1e-9)
    assert got["perplexity_change_pct_low"] <= want <= got["perplexity_change_pct_high"]
    same = perplexity_change(exact, exact)
    assert same["perplexity_change_pct_low"] == same["perplexity_change_pct_high"] == 0
    assert same["perplexity_change_significance"] == NOT_DISTINGUISHABLE


def test_item_intervals_are_wilson_and_the_pass_change_is_paired():
    ref = pd.DataFrame({"id": range(8), "category": ["code"] * 8, "passed": [True] * 4 + [False] * 4,
                        "output": list("abcdefgh")})
    q = ref.assign(passed=[True] * 3 + [False] * 4 + [True], output=list("abcdXfgY"))
    got = item_intervals(q, ref, ("code",))
    assert (got["items_lost"], got["items_gained"], got["pass_change"]) == (1, 1, 0.0)
    assert got["pass_change_low"] < 0 < got["pass_change_high"]
    assert got["pass_change_significance"] == NOT_DISTINGUISHABLE
    assert 0 < got["lost_all_low"] < 1 < got["lost_all_high"]
    assert got["same_output_all_low"] < 0.75 < got["same_output_all_high"] <= 1
