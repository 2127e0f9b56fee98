"""The weight-quantization study's comparisons, each with its interval and significance word (notebook 02).

Every comparison is paired: two models are compared on the same held-out sequences (perplexity as a ratio,
KL as a difference, resampling sequences) or the same sensitive items (pass rate as a difference, resampling
items), with `lab.stats.intervals`' percentile bootstrap. A comparison is "distinguishable" when its interval
excludes no difference (1 for a ratio, 0 for a difference); the verdicts say "not distinguishable" otherwise.
With 16 sequences per domain, two perplexities within about 2% of each other are usually not distinguishable.

- `recovery_table`: GPTQ and AWQ against RTN per configuration and domain (the share of RTN's loss recovered);
- `sensitive_vs_perplexity`: each model against the unquantized one, perplexity rise per domain beside the
  sensitive pass-rate change per category;
- `mismatch_comparison`: short-Q&A calibration against the stratified mix on summarization prompts;
- `claims_table`: the deployment article's (seeds/003 section 2) claims judged from those intervals, where the
  model can decide them: every one is about quantizing a 16-bit model (the ledger's "weight-accuracy" scope,
  `lab.claims.rules.scoped`), so on an already-quantized baseline (`lab.quant.gguf_grids.already_quantized`: the
  embedded model is Q4_1) each verdict is "not checkable here", with the reason, what would decide it, and the
  verdict the intervals give in this setting in the note;
- `preservation_lines`: what such a model can say instead: which method best preserves it when re-quantized to
  each configuration, against the next best, paired over sequences.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from lab.claims.table import NOT_CHECKABLE, Bound, all_of, claim_row, verdict
from lab.eval.scores import SequenceScores, paired, recovered
from lab.eval.sensitive import CATEGORIES
from lab.stats.intervals import Interval, bootstrap, undecided, ratio_interval, significance
from lab.claims.rules import ON_CPU, ON_GPU, SCOPES, Evidence, scoped
from lab.quant.gguf_grids import QuantizedBaseline


def scores_of(scores: pd.DataFrame, model: str, domain: str) -> SequenceScores:
    rows = scores[(scores["model"] == model) & (scores["domain"] == domain)]
    if rows.empty:
        raise KeyError(f"no per-sequence scores for model {model!r} on domain {domain!r}")
    return SequenceScores.from_rows(rows)


def pass_difference(a: pd.DataFrame, b: pd.DataFrame, category: str = "all") -> Interval:
    """Pass rate of a minus b over the items both ran (long context left out of "all", as in `pass_all`),
    paired by item."""
    keep = (lambda df: df[df["category"] != "long_context"]) if category == "all" else \
        (lambda df: df[df["category"] == category])
    merged = keep(a).merge(keep(b), on="id", suffixes=("_a", "_b"))
    if merged.empty:
        raise ValueError(f"no sensitive items in common for category {category!r}")
    return bootstrap(lambda x, y: (x - y).mean(-1), merged["passed_a"].astype(float), merged["passed_b"].astype(float))


def domains(scores: pd.DataFrame) -> list[str]:
    return [d for d in dict.fromkeys(scores["domain"]) if d != "summarization"]


def recovery_table(grid: pd.DataFrame, scores: pd.DataFrame, outputs: dict) -> pd.DataFrame:
    """Per configuration, method (GPTQ, AWQ) and domain: perplexity over RTN's (paired ratio), KL minus RTN's,
    the share of RTN's perplexity and KL loss recovered, and the sensitive pass rate minus RTN's, each with
    its interval; the *_vs_rtn columns say whether the difference is distinguishable."""
    rows = []
    for config, g in grid[grid["method"] != grid["method"].iloc[0]].groupby("config", sort=False):
        if "rtn" not in set(g["method"]):
            continue
        for method in [m for m in g["method"] if m != "rtn"]:
            model, rtn = f"{method} {config}", f"rtn {config}"
            sens = pass_difference(outputs[model], outputs[rtn])
            for domain in domains(scores):
                m, r, u = (scores_of(scores, k, domain) for k in (model, rtn, "unquantized"))
                ratio, kl = paired(m, r, "perplexity"), paired(m, r, "kl_mean")
                rows.append({"config": config, "method": method, "domain": domain,
                             "rtn_perplexity_loss": significance(paired(r, u, "perplexity"), 1.0),
                             "rtn_kl_loss": significance(paired(r, u, "kl_mean")),
                             **ratio.columns("perplexity_over_rtn"), "perplexity_vs_rtn": significance(ratio, 1.0),
                             **kl.columns("kl_minus_rtn"), "kl_vs_rtn": significance(kl),
                             **recovered(m, r, u, "perplexity").columns("perplexity_recovered"),
                             **recovered(m, r, u, "kl_mean").columns("kl_mean_recovered"),
                             **sens.columns("sensitive_pass_minus_rtn"), "sensitive_vs_rtn": significance(sens)})
    return pd.DataFrame(rows)


def sensitive_vs_perplexity(grid: pd.DataFrame, scores: pd.DataFrame, outputs: dict) -> pd.DataFrame:
    """Each quantized model against the unquantized one: perplexity rise per domain (%, paired), and per
    sensitive category the pass-rate change (points, paired by item) and the share of outputs changed. The
    article's claim is that the second and third outrun the first."""
    rows = []
    for _, r in grid.iloc[1:].iterrows():
        row = {"model": r["model"]}
        for domain in domains(scores):
            rise = paired(scores_of(scores, r["model"], domain), scores_of(scores, "unquantized", domain), "perplexity")
            row.update(_scaled(rise, 100, -1).columns(f"{domain}_ppl_rise_%"))
            row[f"{domain}_ppl_rise"] = significance(rise, 1.0)
        for c in CATEGORIES + ("all",):
            if pd.notna(r.get(f"pass_{c}")):
                change = pass_difference(outputs[r["model"]], outputs["unquantized"], c)
                row.update(_scaled(change, 100).columns(f"{c}_pass_change_pts"))
                row[f"{c}_pass_change"] = significance(change)
                row[f"{c}_outputs_changed_%"] = 100 * (1 - r[f"same_output_{c}"])
        rows.append(row)
    return pd.DataFrame(rows)


def _scaled(i: Interval, factor: float, shift: float = 0.0) -> Interval:
    return Interval(factor * (i.value + shift), factor * (i.low + shift), factor * (i.high + shift))


def mismatch_comparison(mismatch: pd.DataFrame, scores: pd.DataFrame) -> Interval | None:
    """Summarization KL with short-Q&A calibration over KL with the stratified mix, paired over prompts (None
    when no summarization prompts ran)."""
    if scores.empty:  # Spec-Bench absent: no summarization prompts ran, and the table has no columns
        return None
    summ = scores[scores["domain"] == "summarization"]
    if summ.empty:
        return None
    label = {m: f"{r['method']} {r['config']} calibrated on {m}" for m, r in mismatch.set_index("calibration").iterrows()}
    a, b = (scores_of(summ, label[m], "summarization") for m in ("short_qa", "stratified"))
    return ratio_interval(a.kl, b.kl)


def _pct(i: Interval, unit: str = "%") -> str:
    return f"{i.value:+.1f}{unit} ({i.low:+.1f} to {i.high:+.1f})"


def _below(i: Interval, x: float) -> str:
    """Verdict on "the quantity is below x" (`lab.claims.rules.Bound` on its interval), strictly: an interval
    ending exactly at x does not hold."""
    return verdict(Bound(repr(float(x)), above=False), i.value, (i.low, i.high))


def _above(i: Interval, x: float) -> str:
    return verdict(Bound(repr(float(x))), i.value, (i.low, i.high))


def _floor(grid: pd.DataFrame) -> str:
    """Why a drop in the sensitive pass rate, or a difference between two methods' rates, cannot be measured (issue
    48: a comparison from a floor), or "": the unquantized baseline (the grid's first row) passes none of the
    sensitive items, so every quantized model's change is +0 or a gain whatever quantization did, and two methods
    compare at next to nothing."""
    if "pass_all" not in grid.columns or not len(grid):
        return ""
    base = float(grid["pass_all"].iloc[0])
    return ("the unquantized baseline passes none of the sensitive items (pass rate 0): from that floor neither a "
            "drop nor a difference between methods can be measured; a larger or instruction-tuned model that passes "
            "some would decide it") if base == 0 else ""


def best_at(sens: pd.DataFrame, config: str, domain: str) -> str:
    """The model of `sens` (`sensitive_vs_perplexity`'s table) at `config` whose `domain` perplexity rises least:
    the method the key claim, "perplexity barely moves", is judged on (the first of equals)."""
    at = sens[sens["model"].str.endswith(f" {config}")].set_index("model")
    return min(at.index, key=lambda m: at.loc[m, f"{domain}_ppl_rise_%"])


def rise(sens: pd.DataFrame, model: str, domain: str) -> Interval:
    """`model`'s `domain` perplexity rise over the unquantized model, in %, with its 95% interval, from
    `sensitive_vs_perplexity`'s table."""
    cols = [f"{domain}_ppl_rise_%", f"{domain}_ppl_rise_%_low", f"{domain}_ppl_rise_%_high"]
    return Interval(*sens.set_index("model").loc[model, cols])


def claims_table(sens: pd.DataFrame, recovery: pd.DataFrame, grid: pd.DataFrame, scores: pd.DataFrame, outputs: dict,
                 config: str, mismatch_ratio: Interval | None = None, baseline: QuantizedBaseline | None = None,
                 on_gpu: bool = False) -> pd.DataFrame:
    """Seeds/003 section 2's quantization claims at `config`, judged from the paired intervals above;
    `mismatch_ratio`: `mismatch_comparison`'s interval, when the mismatch study ran on summarization prompts.
    `baseline`: the detection of the unquantized model's grid; the intervals decide a claim only when it found
    none (16-bit weights), else the row says why it is not checkable here (`in_scope`)."""
    doms, rows = domains(scores), []
    at = sens[sens["model"].str.endswith(f" {config}")].set_index("model")
    best = best_at(sens, config, doms[0])
    rises = {d: rise(sens, best, d) for d in doms}
    rows.append(claim_row(
        f"perplexity barely moves under 4-bit weight quantization ({config}, best method: {best})", "+0.x% (under 1%)",
        "; ".join(f"{d} {_pct(i)}" for d, i in rises.items()),
        all_of(*(_below(i, 1.0) for i in rises.values()))))
    floor = _floor(grid)
    for model in at.index:
        drop = Interval(*at.loc[model, ["all_pass_change_pts", "all_pass_change_pts_low", "all_pass_change_pts_high"]])
        claim = f"task metrics drop under quantization: sensitive pass rate, {model}"
        if floor:  # a baseline that passes nothing cannot drop: no measurement here could have found a drop
            rows.append(claim_row(claim, "drops", _pct(drop, " pts"), NOT_CHECKABLE, floor))
            continue
        rows.append(claim_row(claim, "drops", _pct(drop, " pts"), _below(drop, 0.0)))
    if {"gptq", "awq"} <= set(grid["method"]) and not recovery[recovery["config"] == config].empty:
        for d in doms:
            g, a = (scores_of(scores, f"{m} {config}", d) for m in ("gptq", "awq"))
            ratio = paired(g, a, "perplexity")
            rows.append(claim_row(f"GPTQ is slightly better than AWQ in perplexity ({config}, {d})",
                                  "GPTQ below AWQ", f"GPTQ/AWQ perplexity {ratio}", _below(ratio, 1.0)))
        steadier = pass_difference(outputs[f"awq {config}"], outputs[f"gptq {config}"])
        claim, measured = (f"AWQ is steadier than GPTQ on instruction tasks ({config}, sensitive pass rate)",
                           f"AWQ - GPTQ {_scaled(steadier, 100)} pts")
        # from a baseline that passes nothing, both pass next to nothing: "steadier" is a comparison at the floor
        rows.append(claim_row(claim, "AWQ above GPTQ", measured, NOT_CHECKABLE, floor) if floor else
                    claim_row(claim, "AWQ above GPTQ", measured, _above(steadier, 0.0)))
    if mismatch_ratio is not None:
        rows.append(claim_row("a short-Q&A calibration set degrades long-document summarization (KL on held-out "
                              "summarization prompts)", "degrades", f"KL short-Q&A / stratified {mismatch_ratio}",
                              _above(mismatch_ratio, 1.0)))
    return pd.DataFrame([in_scope(r, baseline, on_gpu) for r in rows])


def in_scope(row: dict, baseline: QuantizedBaseline | None, on_gpu: bool = False) -> dict:
    """`row` as the ledger's "weight-accuracy" scope leaves it (`lab.claims.rules.scoped`): its verdict where the
    weights were 16-bit (`baseline` found no grid), else "not checkable here" with the reason, what would decide
    it and the verdict in this setting in the note."""
    evidence = Evidence(ON_GPU if on_gpu else ON_CPU, None if baseline is None else not baseline.detected)
    decided, in_setting = scoped("weight-accuracy", evidence, row["verdict"])
    if decided != NOT_CHECKABLE or not in_setting:
        return row
    reason = "the baseline's weights were not examined" if baseline is None else (
        f"the model is already {baseline.bits}-bit (at most {baseline.max_distinct} distinct values in every block of "
        f"32 columns of its {baseline.linears} decoder linears): re-quantizing it measures a grid mismatch, not the "
        f"cost of quantizing 16-bit weights")
    note = f"{reason}; what would decide it: {SCOPES['weight-accuracy'].wanting}; in this setting: {in_setting}"
    return claim_row(row["claim"], row["article"], row["measured here"], decided, note)


def preservation_lines(grid: pd.DataFrame, sens: pd.DataFrame, scores: pd.DataFrame) -> list[str]:
    """Per configuration, the model closest to the unquantized one (the lowest KL, averaged over the domains), its
    KL and perplexity change per domain, and its KL minus the next closest's, paired over sequences: on an
    already-quantized baseline, which method best preserves it when re-quantized to that grid."""
    doms, lines = domains(scores), []
    quant = grid.iloc[1:].assign(kl=lambda g: g[[f"{d}_kl_mean" for d in doms]].mean(axis=1))
    rises = sens.set_index("model")
    for config, at in quant.groupby("config", sort=False):
        ranked = at.sort_values("kl")["model"].tolist()
        best, r = at.set_index("model").loc[ranked[0]], rises.loc[ranked[0]]
        said = ", ".join(f"{d} KL {best[f'{d}_kl_mean']:.4f} ({best[f'{d}_kl_mean_low']:.4f}-"
                         f"{best[f'{d}_kl_mean_high']:.4f}), perplexity {r[f'{d}_ppl_rise_%']:+.1f}% "
                         f"({r[f'{d}_ppl_rise_%_low']:+.1f} to {r[f'{d}_ppl_rise_%_high']:+.1f})" for d in doms)
        line = f"{config}: {ranked[0]} preserves it best ({said})"
        if len(ranked) > 1:
            gaps = [(d, paired(*(scores_of(scores, m, d) for m in ranked[:2]), "kl_mean")) for d in doms]
            line += f"; KL minus {ranked[1]}'s: " + ", ".join(
                f"{d} {g.value:+.4f} ({g.low:+.4f} to {g.high:+.4f}, {significance(g)})" for d, g in gaps)
        lines.append(line)
    return lines


def _recovery_text(r, metric: str, loss: str) -> str:
    """The share of RTN's `loss` a method recovers, in words; where RTN's loss is not distinguishable from zero
    (the 8-bit grids) there is nothing to recover and the share, a ratio over a loss near zero, is not printed."""
    column = "perplexity_recovered" if metric == "perplexity" else "kl_mean_recovered"
    if undecided(str(r.get(f"rtn_{metric}_loss"))) or not np.isfinite(r[column]):
        return f"RTN's {loss} is not distinguishable from zero, so there is none to recover"
    return (f"recovers {100 * r[column]:.0f}% ({100 * r[f'{column}_low']:.0f} to "
            f"{100 * r[f'{column}_high']:.0f}%) of RTN's {loss}")


def verdict_lines(recovery: pd.DataFrame, sens: pd.DataFrame, mismatch_ratio: Interval | None) -> list[str]:
    """The study's findings in words, each with its interval and significance word."""
    lines = []
    for _, r in recovery.iterrows():
        lines.append(f"{r['method']} {r['config']} ({r['domain']}): perplexity {r['perplexity_over_rtn']:.3f}x RTN's "
                     f"({r['perplexity_over_rtn_low']:.3f}-{r['perplexity_over_rtn_high']:.3f}, {r['perplexity_vs_rtn']}),"
                     f" {_recovery_text(r, 'perplexity', 'perplexity loss')} and {_recovery_text(r, 'kl', 'KL')}")
    doms = [c[:-len("_ppl_rise_%")] for c in sens.columns if c.endswith("_ppl_rise_%")]
    for _, r in sens.iterrows():
        rises = ", ".join(f"{d} {r[f'{d}_ppl_rise_%']:+.1f}% ({r[f'{d}_ppl_rise_%_low']:+.1f} to "
                          f"{r[f'{d}_ppl_rise_%_high']:+.1f}, {r[f'{d}_ppl_rise']})" for d in doms)
        lines.append(f"{r['model']}: perplexity {rises}; sensitive pass {r['all_pass_change_pts']:+.1f} pts "
                     f"({r['all_pass_change_pts_low']:+.1f} to {r['all_pass_change_pts_high']:+.1f}, "
                     f"{r['all_pass_change']}), {r['all_outputs_changed_%']:.0f}% of outputs changed")
    if mismatch_ratio is not None:
        lines.append(f"summarization KL, short-Q&A calibration over stratified: {mismatch_ratio}x "
                     f"({significance(mismatch_ratio, 1.0)})")
    return lines
