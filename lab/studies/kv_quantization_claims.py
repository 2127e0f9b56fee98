"""Notebook 03's intervals and verdicts: how sure each figure is, and whether each compared pair differs.

The position study measures one long text, so there are no independent sequences to resample. Its intervals
are a block bootstrap (Kunsch, 1989): the text is cut into contiguous blocks of `BLOCK_TOKENS` positions
(neighbouring positions share context, so their errors are correlated; whole blocks keep that correlation
inside a resampled unit) and blocks are drawn with replacement (`lab.intervals.bootstrap`). A bucket's mean is
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

A verdict is "yes" or "no" when its interval excludes the claim's boundary (the null: 1 for a ratio, a stated
threshold for "hurts" or "safe"), and "not distinguishable" when it does not.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from lab.eval.scores import SequenceScores, paired
from lab.intervals import NOT_DISTINGUISHABLE, Interval, bootstrap, mean_interval, proportion, significance
from lab.studies.kv_quantization import UNIT_SCALE

NAN = Interval(math.nan, math.nan, math.nan)


# ---- the block bootstrap of the position study ---------------------------------------------------------


def _bucket_means(v: np.ndarray, n: np.ndarray, bucket: np.ndarray, k: int) -> np.ndarray:
    """Per bucket, the mean over positions pooled from the drawn blocks: (k, resamples)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.stack([(v * w).sum(-1) / w.sum(-1) for w in (n * (bucket == j) for j in range(k))])


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


# ---- verdicts --------------------------------------------------------------------------------------------


def _ci(iv: Interval, fmt: str = ".3g") -> str:
    return f"{iv.value:{fmt}} (95% CI [{iv.low:{fmt}}, {iv.high:{fmt}}])"


def decide(iv: Interval, null: float, claim_above: bool) -> tuple[str, str]:
    """(holds, significance): "yes" or "no" by which side of `null` the interval lies on (the claim says
    above when `claim_above`), "not distinguishable" when it holds `null`."""
    word = significance(iv, null)
    if word == NOT_DISTINGUISHABLE:
        return NOT_DISTINGUISHABLE, word
    return ("yes" if (iv.low > null) == claim_above else "no"), word


def _safety(p, r: pd.Series) -> tuple[bool | None, str]:
    """Safe: perplexity within SAFE_PPL_PCT of the exact cache (the whole interval) and no item lost; unsafe:
    the perplexity interval above it, or a pass rate distinguishably below the exact cache's; None: neither."""
    ppl = Interval(r["perplexity_change_pct"], r["perplexity_change_pct_low"], r["perplexity_change_pct_high"])
    drop = Interval(r["pass_change"], r["pass_change_low"], r["pass_change_high"])
    safe = False if ppl.low > p.SAFE_PPL_PCT or drop.high < 0 else \
        True if ppl.high <= p.SAFE_PPL_PCT and r["items_lost"] == 0 else None
    return safe, (f"{r['format']}: perplexity {_ci(ppl, '+.2f')}%; pass rate change {_ci(drop, '+.3f')} over "
                  f"{r['items']} items ({r['items_lost']} lost, {r['items_gained']} gained); "
                  f"{100 * (1 - r['same_output_all']):.0f}% of outputs changed (safe = perplexity within "
                  f"{p.SAFE_PPL_PCT}% and no item lost; unsafe = perplexity above it or a pass rate "
                  f"distinguishably lower)")


def verdicts(p, blocks: pd.DataFrame, roles: pd.DataFrame, e2e: pd.DataFrame) -> list[dict]:
    """Each claim of the article, a measured yes, no or "not distinguishable", the interval it rests on and
    the boundary it was compared with (only claims whose formats were run)."""
    out = []
    base = e2e.set_index("format", drop=False)

    def claim(text, iv, null, above, evidence, holds=None, word=None):
        if holds is None:
            holds, word = decide(iv, null, above)
        out.append({"claim": text, "holds": holds, "evidence": evidence, **iv.columns("value"), "null": null,
                    "significance": word})

    for name, text, want in (("fp8_e4m3/per-tensor", "FP8 (e4m3, calibrated per-tensor scale) is safe", True),
                             ("int8/per-token", "INT8 needs care (is not safe as is)", False),
                             ("int4/per-token", "INT4 is not safe for online serving", False)):
        if name in base.index:
            r = base.loc[name]
            safe, ev = _safety(p, r)
            iv = Interval(r["perplexity_change_pct"], r["perplexity_change_pct_low"], r["perplexity_change_pct_high"])
            holds = NOT_DISTINGUISHABLE if safe is None else ("yes" if safe == want else "no")
            claim(text, iv, p.SAFE_PPL_PCT, not want, ev, holds,
                  NOT_DISTINGUISHABLE if safe is None else "distinguishable")
    unit, cal = f"fp8_e4m3/per-tensor/{UNIT_SCALE}", "fp8_e4m3/per-tensor"
    iv = block_interval(blocks, "next_token_kl", [unit, cal], _ratio_over_buckets)
    if not math.isnan(iv.value):
        claim("vLLM's default scale of 1.0 hurts FP8 quality", iv, 1.5, True,
              f"mean KL with scale 1.0 / calibrated: {_ci(iv)}x, paired over blocks ('hurts' = over 1.5x)")
    for _, r in roles.iterrows():
        iv = Interval(*(r[f"next_token_kl_k_over_v{s}"] for s in ("", "_low", "_high")))
        if not math.isnan(iv.value):
            att = Interval(*(r[f"attention_rel_error_k_over_v{s}"] for s in ("", "_low", "_high")))
            claim(f"keys are more sensitive than values ({r['format']})", iv, 1.0, True,
                  f"KL keys-only / values-only {_ci(iv)}x; attention error keys / values {_ci(att)}x")
    iv = block_interval(blocks, "next_token_kl", ["int4/per-channel/group16/k-only", "int4/per-token/k-only"],
                        _ratio_over_buckets)
    if not math.isnan(iv.value):
        claim("keys want per-channel scales (KIVI): int4 keys per-channel beat per-token", iv, 1.0, False,
              f"KL keys-only per-channel / per-token {_ci(iv)}x")
    last = blocks["position_end"].max()
    for dyn, static in (("int8/per-token", "int8/per-tensor"), ("int4/per-token", "int4/per-tensor"),
                        ("fp8_e4m3/per-token", "fp8_e4m3/per-tensor")):
        iv = block_interval(blocks, "next_token_kl", [dyn, static], _ratio_over_buckets, last)
        if not math.isnan(iv.value):
            claim(f"per-token dynamic beats per-tensor static on long context ({dyn.split('/')[0]})", iv, 1.0,
                  False, f"KL in the last position bucket, per-token / per-tensor: {_ci(iv)}x")
    claim(*_growth_claim(blocks))
    return out


def _growth_claim(blocks: pd.DataFrame):
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
    return ("the error grows with context, so short prompts hide it", iv, 1.0, True,
            f"median over {len(names)} formats of KL x per doubling of context {_ci(iv)}; distinguishably "
            f"growing for {grows}, shrinking for {shrinks}, not distinguishable from flat for "
            f"{len(names) - grows - shrinks}")
