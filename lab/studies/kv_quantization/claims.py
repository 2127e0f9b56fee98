"""Notebook 03's intervals and claims table: how sure each figure is, and whether each compared pair differs.

The position study measures one long text, so there are no independent sequences to resample. Its intervals
are a block bootstrap (Kunsch, 1989): the text is cut into contiguous blocks of `BLOCK_TOKENS` positions
(neighbouring positions share context, so their errors are correlated; whole blocks keep that correlation
inside a resampled unit) and blocks are drawn with replacement (`lab.stats.intervals.bootstrap`). A bucket's mean is
pooled from the blocks drawn into it (measured positions as weights, so the point value is the bucket's
mean over positions). Every comparison of two formats draws the same blocks for both sides: a paired
comparison, so the text's own hard stretches cancel. The draws are over all blocks, not within each bucket,
so a resample's count of early blocks varies: the first bucket's interval is somewhat wider than a
stratified bootstrap's would be. The interval says how much the figure moves with which stretches of this
text are measured, not with which text: another text would move all buckets together.

End to end, perplexity, KL and top-1 resample held-out sequences and pass rates carry Wilson intervals
(`lab.eval.harness.evaluate_model`); here the perplexity change against the exact cache, paired over the same
sequences (`lab.eval.scores.paired`), Wilson intervals of lost items and unchanged outputs, and the change
in pass rate, paired over the same items.

The claims table is the one shape of every notebook's (`lab.claims.table.claim_row`): the claim, the article's
statement (seeds/003 §2.3, or vLLM's documentation for its scale of 1.0), what was measured as "v [low, high]"
first (the form the claims ledger reads) with the rest of the evidence after it, the verdict and a note. A
verdict is holds or wrong when its interval excludes the claim's boundary (the null: 1 for a ratio, a stated
threshold for "hurts" or "safe"), and "not distinguishable" when it does not; each claim's interval, null and
significance word stay numeric in a second table beside it.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from lab.claims.table import CLAIMS_COLUMNS, NOT_CHECKABLE, Bound, claim_row, from_flag, holds_cell
from lab.claims.table import verdict as rules_verdict
from lab.eval.scores import SequenceScores, paired
from lab.stats.intervals import (Interval, significance_word, undecided, bootstrap, mean_interval, proportion,
                           significance)
from lab.studies.kv_quantization.params import UNIT_SCALE

NAN = Interval(math.nan, math.nan, math.nan)


# the deployment article's "degrades after a few thousand tokens": contexts shorter than this cannot show it
FEW_THOUSAND = 4096


# ---- the block bootstrap of the position study ---------------------------------------------------------


def _bucket_means(v: np.ndarray, n: np.ndarray, bucket: np.ndarray, k: int) -> np.ndarray:
    """Per bucket, the mean over positions pooled from the drawn blocks: (k, resamples). One weighted count over
    (resample, bucket) pairs, where a pass per bucket over the whole draw took 3x as long (it was a sixth of
    `lab claims --check`)."""
    resamples = v.shape[0]
    pair = (bucket.astype(np.int64) + k * np.arange(resamples)[:, None]).ravel()
    sums = np.bincount(pair, weights=(v * n).ravel(), minlength=resamples * k).reshape(resamples, k)
    weights = np.bincount(pair, weights=n.ravel(), minlength=resamples * k).reshape(resamples, k)
    with np.errstate(invalid="ignore", divide="ignore"):
        return (sums / weights).T


def block_interval(blocks: pd.DataFrame, metric: str, formats: list[str], reduce, bucket_end: int | None = None,
                   ) -> Interval:
    """`reduce` of the formats' bucket means ((buckets, resamples) arrays, one per format) with its block
    bootstrap interval, the same blocks drawn for every format; `bucket_end`: that bucket's blocks only.
    NaN when a format was not run."""
    sub = blocks[blocks["metric"] == metric]
    if bucket_end is not None:
        sub = sub[sub["position_end"] == bucket_end]
    if not set(formats) <= set(sub["format"]):
        return NAN
    wide = sub.pivot(index="block_start", columns="format", values="value").fillna(0.0)
    meta = sub.drop_duplicates("block_start").set_index("block_start").loc[wide.index]
    ends = sorted(meta["position_end"].unique())
    bucket = meta["position_end"].map({e: j for j, e in enumerate(ends)}).to_numpy(float)

    def stat(*cols):
        *values, n, b = cols
        return reduce([_bucket_means(v, n, b, len(ends)) for v in values])

    return bootstrap(stat, *(wide[f].to_numpy() for f in formats), meta["measured"].to_numpy(float), bucket)


def _over_buckets(m):
    return m[0].mean(0)


def _ratio_over_buckets(m):
    return m[0].mean(0) / m[1].mean(0)


def bucket_table(blocks: pd.DataFrame) -> pd.DataFrame:
    """The mean of each format and metric per position bucket, with its block-bootstrap interval."""
    rows = []
    for (name, metric, end), g in blocks.groupby(["format", "metric", "position_end"], sort=False):
        iv = block_interval(blocks[blocks["format"] == name], metric, [name], _over_buckets, end)
        rows.append({"format": name, "metric": metric, "positions": g["positions"].iloc[0], "position_end": end,
                     **iv.columns("value")})
    return pd.DataFrame(rows)


def _log_slope(m, x):
    """Least-squares slope of log(bucket mean) against x, per resample."""
    y = np.log(np.maximum(m, 1e-30))
    dx = x - x.mean()
    return (dx[:, None] * (y - y.mean(0))).sum(0) / (dx ** 2).sum()


def growth_slope(blocks: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Per format: the metric in the first and last position bucket, their ratio, and exp of the least-squares
    slope of log(metric) against log2(bucket end), i.e. how many times larger the error gets per doubling,
    each with its block-bootstrap interval; `growth`: whether x per doubling is distinguishable from 1."""
    sub = blocks[blocks["metric"] == metric]
    x = np.log2(sorted(sub["position_end"].unique())).astype(float)
    rows = []
    for name in sub["format"].unique():
        one = sub[sub["format"] == name]
        first, last = (block_interval(one, metric, [name], lambda m, j=j: m[0][j]) for j in (0, -1))
        ratio = block_interval(one, metric, [name], lambda m: m[0][-1] / m[0][0])
        slope = block_interval(one, metric, [name], lambda m: np.exp(_log_slope(m[0], x)))
        rows.append({"format": name, **first.columns("first_bucket"), **last.columns("last_bucket"),
                     **ratio.columns("last_over_first"), **slope.columns("x_per_doubling"),
                     "growth": significance(slope, 1.0)})
    return pd.DataFrame(rows)


def role_table(blocks: pd.DataFrame) -> pd.DataFrame:
    """K-only beside V-only at the same format: the mean over position buckets of attention error and KL, and
    K / V, each with its block-bootstrap interval (K / V paired: the same blocks for both)."""
    rows = []
    formats = set(blocks["format"])
    for name in sorted({f.rsplit("/", 1)[0] for f in formats if f.endswith(("/k-only", "/v-only"))}):
        row = {"format": name}
        k, v = f"{name}/k-only", f"{name}/v-only"
        for metric in ("attention_rel_error", "next_token_kl"):
            ratio = block_interval(blocks, metric, [k, v], _ratio_over_buckets)
            row.update({**block_interval(blocks, metric, [k], _over_buckets).columns(f"{metric}_k_only"),
                        **block_interval(blocks, metric, [v], _over_buckets).columns(f"{metric}_v_only"),
                        **ratio.columns(f"{metric}_k_over_v"),
                        f"{metric}_k_over_v_significance": significance(ratio, 1.0)})
        rows.append(row)
    return pd.DataFrame(rows)


# ---- end to end ------------------------------------------------------------------------------------------


def perplexity_change(scores: SequenceScores, exact: SequenceScores) -> dict:
    """The perplexity change against the exact cache in percent, paired over the same held-out sequences."""
    ratio = paired(scores, exact, "perplexity")
    change = Interval(*(100 * (x - 1) for x in (ratio.value, ratio.low, ratio.high)))
    return {**change.columns("perplexity_change_pct"), "perplexity_change_significance": significance(change, 0.0)}


def item_intervals(df: pd.DataFrame, ref: pd.DataFrame, categories) -> dict:
    """Wilson intervals of each category's lost items (in items) and share of unchanged outputs ("all" leaving
    long context out, as `evaluate_model` does), and the change in pass rate against the exact cache over every
    item run, paired over the same items."""
    m = ref.merge(df, on=["id", "category"], suffixes=("_ref", "_q"))
    short = m[m["category"] != "long_context"]
    out = {}
    for c in (*categories, "all"):
        g = short if c == "all" else m[m["category"] == c]
        n = len(g)
        if not n:
            continue
        lost = proportion(int((g["passed_ref"] & ~g["passed_q"]).sum()), n)
        same = proportion(int((g["output_ref"] == g["output_q"]).sum()), n)
        out.update({f"lost_{c}_low": n * lost.low, f"lost_{c}_high": n * lost.high,
                    f"same_output_{c}_low": same.low, f"same_output_{c}_high": same.high})
    change = mean_interval(m["passed_q"].astype(float) - m["passed_ref"].astype(float))
    return {**out, **change.columns("pass_change"), "pass_change_significance": significance(change, 0.0),
            "items_lost": int((m["passed_ref"] & ~m["passed_q"]).sum()),
            "items_gained": int((~m["passed_ref"] & m["passed_q"]).sum()), "items": len(m)}


# ---- the claims table -----------------------------------------------------------------------------------

SECTION = "seeds/003 §2.3"


def _bracketed(iv: Interval, fmt: str = ".3g") -> str:
    """"v [low, high]": the form `lab.claims.rules.parse_lab` reads a number and its interval from."""
    return f"{iv.value:{fmt}} [{iv.low:{fmt}}, {iv.high:{fmt}}]"


def decide(iv: Interval, null: float, claim_above: bool) -> str:
    """The verdict on "the quantity lies above `null`" (below, when not `claim_above`): `lab.claims.rules`'
    `Bound` on the interval: holds or wrong by which side of `null` the interval lies on, not distinguishable
    when it reaches across `null` (or is NaN). Strict: two identical formats give a ratio of exactly 1 [1, 1],
    which says neither is better, so a claim that one is better is wrong."""
    return rules_verdict(Bound(repr(float(null)), above=claim_above), iv.value, (iv.low, iv.high))


def _why(verdict: str, null: float, claim_above: bool) -> str:
    """The note of an interval claim: where its interval lies when the verdict is not a plain "holds"."""
    if holds_cell(verdict):
        return ""
    if undecided(verdict):
        return f"the interval holds {null:g}"
    return f"the interval lies {'below' if claim_above else 'above'} {null:g}"


# (format, claim, the article's statement, whether the claim calls the format safe)
SAFETY_CLAIMS = (("fp8_e4m3/per-tensor", "FP8 (e4m3, calibrated per-tensor scale) is safe",
                  "an FP8 KV cache is usually safe", True),
                 ("int8/per-token", "INT8 needs care (is not safe as is)", "INT8 needs care", False),
                 ("int4/per-token", "INT4 is not safe for online serving", "INT4 is not advised for online serving",
                  False))


def _safety(p, r: pd.Series) -> tuple[bool | None, Interval, str, str]:
    """(safe, perplexity change, measured, why) for one end-to-end format. Safe: perplexity within SAFE_PPL_PCT
    of the exact cache (the whole interval) and no item lost; unsafe: the perplexity interval above it, or a pass
    rate distinguishably below the exact cache's; None: neither."""
    ppl = Interval(r["perplexity_change_pct"], r["perplexity_change_pct_low"], r["perplexity_change_pct_high"])
    drop = Interval(r["pass_change"], r["pass_change_low"], r["pass_change_high"])
    limit = p.SAFE_PPL_PCT
    unsafe = [w for w, bad in ((f"perplexity above {limit}%", ppl.low > limit),
                               ("a pass rate distinguishably lower", drop.high < 0)) if bad]
    short = [w for w, bad in ((f"the perplexity interval reaches above {limit}%", ppl.high > limit),
                              (f"{r['items_lost']} items lost", r["items_lost"] > 0)) if bad]
    safe = False if unsafe else None if short else True
    measured = (f"{_bracketed(ppl, '+.2f')}% perplexity against the exact cache ({r['format']}); pass rate change "
                f"{_bracketed(drop, '+.3f')} over {r['items']} items ({r['items_lost']} lost, {r['items_gained']} "
                f"gained); {100 * (1 - r['same_output_all']):.0f}% of outputs changed")
    state = {True: "safe", False: "unsafe: " + " and ".join(unsafe),
             None: "neither safe nor unsafe: " + " and ".join(short)}[safe]
    return safe, ppl, measured, (f"{state}; the rule: safe = perplexity within {limit}% and no item lost, "
                                 f"unsafe = perplexity above it or a pass rate distinguishably lower")


def _safety_rows(p, e2e: pd.DataFrame, add) -> None:
    """FP8 safe, INT8 needs care, INT4 not for online serving: each run format's end-to-end safety."""
    base = e2e.set_index("format", drop=False)
    for name, text, article, want in SAFETY_CLAIMS:
        if name in base.index:
            safe, ppl, measured, note = _safety(p, base.loc[name])
            # the safety rule decides, not the perplexity interval alone, so the significance word is the rule's
            add(text, f"{article} ({SECTION})", ppl, p.SAFE_PPL_PCT, measured,
                from_flag(None if safe is None else safe == want), note,
                significance_word(safe is not None))


def _ratio_rows(blocks: pd.DataFrame, roles: pd.DataFrame, add) -> None:
    """The paired ratios of the position study: vLLM's scale of 1.0, keys against values, per-channel keys,
    per-token dynamic against per-tensor static scales."""
    unit, cal = f"fp8_e4m3/per-tensor/{UNIT_SCALE}", "fp8_e4m3/per-tensor"
    iv = block_interval(blocks, "next_token_kl", [unit, cal], _ratio_over_buckets)
    if not math.isnan(iv.value):
        verdict = decide(iv, 1.5, True)
        add("vLLM's default scale of 1.0 hurts FP8 quality",
            "the default k_scale / v_scale of 1.0 can degrade quality (vLLM's FP8 KV cache documentation)", iv, 1.5,
            f"{_bracketed(iv)}x mean KL with scale 1.0 / calibrated, paired over blocks", verdict,
            "; ".join(x for x in ("'hurts' = over 1.5x", _why(verdict, 1.5, True)) if x))
    for _, r in roles.iterrows():
        iv = Interval(*(r[f"next_token_kl_k_over_v{s}"] for s in ("", "_low", "_high")))
        if not math.isnan(iv.value):
            att = Interval(*(r[f"attention_rel_error_k_over_v{s}"] for s in ("", "_low", "_high")))
            verdict = decide(iv, 1.0, True)
            add(f"keys are more sensitive than values ({r['format']})",
                f"K is more sensitive to quantization than V ({SECTION})", iv, 1.0,
                f"{_bracketed(iv)}x KL keys-only / values-only; attention error keys / values {_bracketed(att)}x",
                verdict, _why(verdict, 1.0, True))
    iv = block_interval(blocks, "next_token_kl", ["int4/per-channel/group16/k-only", "int4/per-token/k-only"],
                        _ratio_over_buckets)
    if not math.isnan(iv.value):
        verdict = decide(iv, 1.0, False)
        add("keys want per-channel scales (KIVI): int4 keys per-channel beat per-token",
            f"K gets finer scales (per-channel or per-head), V per-token ({SECTION}; KIVI, arXiv:2402.02750)", iv,
            1.0, f"{_bracketed(iv)}x KL keys-only per-channel / per-token", verdict, _why(verdict, 1.0, False))
    for gran in ("per-token", "per-tensor"):  # seeds/002 §5.2: FP8 the finer KV format, at equal scale granularity
        iv = block_interval(blocks, "next_token_kl", [f"fp8_e4m3/{gran}", f"int8/{gran}"], _ratio_over_buckets)
        if not math.isnan(iv.value):
            verdict = decide(iv, 1.0, False)
            add(f"for the KV cache FP8 is a finer format than INT8 ({gran} scales)",
                "FP8 finer than INT8 for the KV cache (「對KV Cache則保留FP16或采用更精細的FP8」, seeds/002 §5.2)", iv,
                1.0, f"{_bracketed(iv)}x mean KL fp8_e4m3 / int8, both {gran}, paired over blocks", verdict,
                _why(verdict, 1.0, False))
    last = blocks["position_end"].max()
    for dyn, static in (("int8/per-token", "int8/per-tensor"), ("int4/per-token", "int4/per-tensor"),
                        ("fp8_e4m3/per-token", "fp8_e4m3/per-tensor")):
        iv = block_interval(blocks, "next_token_kl", [dyn, static], _ratio_over_buckets, last)
        if not math.isnan(iv.value):
            verdict = decide(iv, 1.0, False)
            add(f"per-token dynamic beats per-tensor static on long context ({dyn.split('/')[0]})",
                f"per-tensor static scales lose much, per-token dynamic ones are more accurate: per-token for long "
                f"context ({SECTION})", iv, 1.0,
                f"{_bracketed(iv)}x KL in the last position bucket, per-token / per-tensor", verdict,
                _why(verdict, 1.0, False))


def _growth_row(blocks: pd.DataFrame, add) -> None:
    """The median over formats (K and V quantized) of KL x per doubling of context, every format's slope fitted
    on the same resampled blocks."""
    both = blocks[~blocks["format"].str.endswith(("k-only", "v-only"))]
    names = list(both["format"].unique())
    x = np.log2(sorted(both["position_end"].unique())).astype(float)
    iv = block_interval(both, "next_token_kl", names,
                        lambda ms: np.median(np.stack([np.exp(_log_slope(m, x)) for m in ms]), axis=0))
    slopes = growth_slope(both, "next_token_kl")
    grows = int((slopes["x_per_doubling_low"] > 1).sum())
    shrinks = int((slopes["x_per_doubling_high"] < 1).sum())
    verdict, why = decide(iv, 1.0, True), _why(decide(iv, 1.0, True), 1.0, True)
    reach = int(both["position_end"].max())
    if reach < FEW_THOUSAND:  # a quick run's short contexts cannot show what happens after a few thousand tokens
        verdict, why = NOT_CHECKABLE, (f"the contexts reach {reach} tokens, short of the few thousand the claim is "
                                       f"about ({FEW_THOUSAND}+; the reference preset reaches 8K): this run cannot "
                                       f"decide it, whichever way its slope points")
    add("the error grows with context, so short prompts hide it",
        f"KV quantization error accumulates with context: short prompts do not show it, it degrades after a few "
        f"thousand tokens ({SECTION})", iv, 1.0,
        f"{_bracketed(iv)}x KL per doubling of context, the median over {len(names)} formats; distinguishably "
        f"growing for {grows}, shrinking for {shrinks}, not distinguishable from flat for "
        f"{len(names) - grows - shrinks}", verdict, why)


def claims_table(p, blocks: pd.DataFrame, roles: pd.DataFrame, e2e: pd.DataFrame,
                 ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The article's claims in the one shape (`lab.claims.table.CLAIMS_COLUMNS`, only claims whose formats were run),
    and beside it each claim's interval (`value`, `value_low`, `value_high`), the boundary it was compared with
    (`null`) and whether the interval excludes it (`significance`)."""
    rows, intervals = [], []

    def add(claim, article, iv, null, measured, verdict, note, word=None):
        rows.append(claim_row(claim, article, measured, verdict, note))
        intervals.append({"claim": claim, **iv.columns("value"), "null": null,
                          "significance": word or significance(iv, null)})

    _safety_rows(p, e2e, add)
    _ratio_rows(blocks, roles, add)
    _growth_row(blocks, add)
    return pd.DataFrame(rows, columns=list(CLAIMS_COLUMNS)), pd.DataFrame(intervals)
