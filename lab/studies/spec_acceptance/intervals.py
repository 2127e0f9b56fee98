"""95% intervals over prompts for notebook 05's figures, and the words its comparisons use (issue 23, item 3).

The prompts are the items of `lab.stats.intervals.bootstrap`: a resample draws a category's prompts with replacement
and recomputes each figure from the drawn prompts' pooled rounds and summed times, so every rate stays a ratio
of sums, as the point value is:

- a = sum accepted positions / sum verified positions; vLLM's accepted / drafted;
- mean accepted tokens per step = (sum accepted + sum rounds) / sum rounds (Spec-Bench's, the bonus included);
- measured speedup = sum plain decode s / sum speculative decode s; one resample draws the same prompts for
  both runs, so the ratio is paired and the prompts' own lengths and difficulty cancel;
- c_effective = (sum draft s / sum drafted) / (sum plain decode s / sum decode tokens);
- the acceptance at each draft position (accepted there / verified there).

The prediction errors (predicted / measured - 1) hold the prediction fixed and carry the measured speedup's
interval: the question they answer is whether this measurement is within 10% of what the model predicts.
Timing noise between repeats is not in these intervals; prompt-to-prompt variation is.
"""

from __future__ import annotations

from itertools import combinations

import numpy as np
import pandas as pd

from lab.stats.intervals import bootstrap, significance_word, ratio_interval, ratio_of_sums, significance
from lab.speculative.speculator import SpecStats

TOLERANCE = 0.10  # "within 10%" of a prediction
INTERVAL_METRICS = ("measured_speedup", "a", "accepted/drafted (vLLM)", "mean_accepted_tokens_per_step", "c_effective")
SINGLE = "single prompt"  # the word for a comparison that has no interval to decide it


def _stats(drafted: list, accepted: list) -> SpecStats:
    st = SpecStats()
    for d, a in zip(drafted, accepted):
        st.record(d, a)
    return st


def request_counts(spec: pd.DataFrame) -> dict[str, np.ndarray]:
    """Per request: accepted, verified and drafted positions, rounds, and per draft position the rounds that
    verified it and accepted it (arrays shaped (requests, positions))."""
    stats = [_stats(d, a) for d, a in zip(spec["drafted_per_round"], spec["accepted_per_round"])]
    width = max((len(s.reached) for s in stats), default=0)
    reached = np.array([s.reached + [0] * (width - len(s.reached)) for s in stats], float).reshape(len(stats), width)
    accepted_at = np.array([s.accepted_at + [0] * (width - len(s.accepted_at)) for s in stats],
                           float).reshape(len(stats), width)
    return {"accepted": np.array([s.accepted for s in stats], float), "verified": reached.sum(1),
            "drafted": np.array([s.drafted for s in stats], float),
            "rounds": np.array([s.rounds for s in stats], float),
            "reached": reached, "accepted_at": accepted_at}


def interval_columns(spec: pd.DataFrame, plain: pd.DataFrame) -> dict:
    """The `<metric>_low` / `<metric>_high` columns of one category's row (NaN where the run drafted nothing, or
    for a single prompt, where resampling prompts says nothing about their spread)."""
    n = request_counts(spec)
    if len(spec) < 2:
        blank = [float("nan")] * n["reached"].shape[1]
        return {f"{m}_{end}": float("nan") for m in INTERVAL_METRICS for end in ("low", "high")} | {
            "speedup_vs_plain": SINGLE, "acceptance_by_position_low": blank, "acceptance_by_position_high": blank}
    plain_s, spec_s = plain["decode_s"].to_numpy(float), spec["decode_s"].to_numpy(float)
    tokens, draft_s = spec["decode_tokens"].to_numpy(float), spec["draft_s"].to_numpy(float)
    speedup = ratio_interval(plain_s, spec_s)
    out = {"measured_speedup_low": speedup.low, "measured_speedup_high": speedup.high,
           "speedup_vs_plain": significance(speedup, 1.0)}
    names = INTERVAL_METRICS[1:]
    if n["drafted"].sum() == 0:
        return out | {f"{m}_{end}": float("nan") for m in names for end in ("low", "high")} | {
            "acceptance_by_position_low": [], "acceptance_by_position_high": []}
    figures = [ratio_interval(n["accepted"], n["verified"]), ratio_interval(n["accepted"], n["drafted"]),
               bootstrap(lambda a, r: 1 + ratio_of_sums(a, r), n["accepted"], n["rounds"]),
               bootstrap(lambda d, k, t, p: ratio_of_sums(d, k) / ratio_of_sums(p, t), draft_s, n["drafted"], tokens, plain_s)]
    for name, iv in zip(names, figures):
        out |= {f"{name}_low": iv.low, f"{name}_high": iv.high}
    by_pos = [ratio_interval(n["accepted_at"][:, i], n["reached"][:, i]) for i in range(n["reached"].shape[1])]
    out["acceptance_by_position_low"] = [round(iv.low, 4) for iv in by_pos]
    out["acceptance_by_position_high"] = [round(iv.high, 4) for iv in by_pos]
    return out


def error_columns(row: dict, name: str) -> dict:
    """`error_<name>`'s interval (predicted / measured - 1, the prediction held fixed) and whether it is within
    TOLERANCE: "within 10%", "outside 10%" or "not distinguishable" (the interval straddles +-10%), or "single
    prompt" where there is no interval."""
    predicted = row[f"predicted_{name}"]
    low, high = predicted / row["measured_speedup_high"] - 1, predicted / row["measured_speedup_low"] - 1
    word = (SINGLE if row["speedup_vs_plain"] == SINGLE else "within 10%" if -TOLERANCE <= low and high <= TOLERANCE
            else "outside 10%" if high < -TOLERANCE or low > TOLERANCE else significance_word(False))
    return {f"error_{name}_low": low, f"error_{name}_high": high, f"error_{name}_vs_10pct": word}


def beside(table: pd.DataFrame) -> pd.DataFrame:
    """`table` with each `<metric>_low`, `<metric>_high` pair moved next to its `<metric>`."""
    ends = {c for c in table.columns if c.endswith(("_low", "_high")) and c.rsplit("_", 1)[0] in table.columns}
    order = []
    for c in table.columns:
        if c not in ends:
            order += [c] + [f"{c}_{e}" for e in ("low", "high") if f"{c}_{e}" in ends]
    return table[order]


def drafter_comparison(requests: pd.DataFrame) -> pd.DataFrame:
    """Every pair of drafters at one k on the same prompts (paired: one resample draws the same prompts for
    both): the difference in a and the ratio of their speedups (= the ratio of their decode times), each with
    its interval and whether it excludes no difference (0 for a, 1 for the ratio)."""
    runs = {d: g.set_index("id") for d, g in requests[requests["drafter"] != "plain"].groupby("drafter", sort=False)}
    rows = []
    for x, y in combinations(runs, 2):
        gx, gy = runs[x], runs[y].loc[runs[x].index]
        nx, ny = request_counts(gx), request_counts(gy)
        da = bootstrap(lambda a1, v1, a2, v2: ratio_of_sums(a1, v1) - ratio_of_sums(a2, v2),
                       nx["accepted"], nx["verified"], ny["accepted"], ny["verified"])
        ratio = ratio_interval(gy["decode_s"].to_numpy(float), gx["decode_s"].to_numpy(float))
        rows.append({"drafter": x, "against": y, "prompts": len(gx), **da.columns("a_difference"),
                     "a_difference_vs_0": significance(da, 0.0), **ratio.columns("speedup_ratio"),
                     "speedup_ratio_vs_1": significance(ratio, 1.0)})
    return pd.DataFrame(rows)
