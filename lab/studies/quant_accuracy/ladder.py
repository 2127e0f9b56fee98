"""Notebook 02's control and loss decomposition (issue 39): what the baseline already is, and where a
re-quantized model's loss comes from.

The embedded SmolLM2 is a Q4_1 GGUF dequantized: its decoder linears sit exactly on a 4-bit grid with blocks of 32
columns (`lab.quant.gguf_grids.already_quantized` detects it from the distinct values per block). On such a model
a 4-bit quantizer on the model's own grid loses nothing (`gguf-q4_1`, the control, at exactly 0), and any other
4-bit quantizer measures a grid mismatch, not the cost of 4 bits. This module measures:

- `baseline_metrics`: the detection as metrics.json's fields (`weights16`, which the ledger reads to decide whether
  a run's accuracy figures are evidence about quantizing 16-bit weights);
- `weight_error`: the relative weight error of a quantized model's decoder linears, ||W_q - W|| / ||W|| pooled over
  them, with a bootstrap interval over decoder layers (None after AWQ, whose linears hold rescaled weights);
- `grid_variants`: that error for the three zero-point rules (float offset, integer zero point, range widened to
  include 0) at groups of 32, 64 and 128, weights only;
- `run_ladder` and `ladder_table`: `lab.quant.ladder`'s rungs, each one change from the one before, with the weight
  error and the perplexity change against the unquantized model and against the rung before (paired over the
  held-out sequences, each from its own document);
- `decomposition`: each model of the grid, its perplexity change split into the part at 4 bits with its group size
  (the same method's w4g<group> model: on an already-4-bit model, the grid) and the part from fewer levels (its
  change over that model), multiplying to the whole.
"""

from __future__ import annotations

import copy

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from lab.eval.scores import SequenceScores, paired, score_sequences
from lab.stats.intervals import Interval, bootstrap
from lab.quant.gguf_grids import QuantizedBaseline
from lab.quant.ladder import apply_rung, ladder, layer_errors, minmax_fake_quantize, quantizer_errors
from lab.quant.rtn import QuantSpec, fake_quantize

ZERO_RULES = ("float offset", "integer zero point", "widened to include 0 (RTN)")


def baseline_metrics(baseline: QuantizedBaseline) -> dict:
    """The detection of an already-quantized baseline as metrics: `weights16` (not detected: the run's accuracy
    figures are about quantizing 16-bit weights), the grid's bits and the distinct values per block of 32."""
    return {"weights16": not baseline.detected, "baseline_bits": baseline.bits,
            "baseline_max_distinct_per_block": baseline.max_distinct,
            "baseline_mean_distinct_per_block": round(baseline.mean_distinct, 3)}


def _pooled(err: np.ndarray, norm: np.ndarray) -> Interval:
    """100 sqrt(sum err / sum norm), with its bootstrap interval over layers."""
    i = bootstrap(lambda e, n: np.sqrt(e.sum(-1) / n.sum(-1)), err, norm)
    return Interval(100 * i.value, 100 * i.low, 100 * i.high)


def weight_error(reference, model, layers: tuple[int, ...] | None = None) -> Interval | None:
    """Relative weight error of `model`'s decoder linears against `reference`'s, %, pooled, with its interval over
    decoder layers; None when the models differ outside those weights (AWQ's scales folded into the norms)."""
    pair = layer_errors(reference, model, layers)
    return None if pair is None else _pooled(*pair)


def grid_variants(model, layers: tuple[int, ...] | None = None, bits: int = 4) -> pd.DataFrame:
    """Relative weight error (%, interval over layers) of `bits`-bit min-max grids by zero-point rule and group."""
    rows = []
    for rule in ZERO_RULES:
        for group in (32, 64, 128):
            fn = (lambda w, g=group: fake_quantize(w, QuantSpec(bits, g))) if rule == ZERO_RULES[2] else \
                (lambda w, g=group, z=rule.split()[0]: minmax_fake_quantize(w, bits, g, z))
            err = _pooled(*quantizer_errors(model, fn, layers))
            rows.append({"zero point": rule, "group_size": group, "bits": bits, **err.columns("weight_error_%")})
    return pd.DataFrame(rows)


def run_ladder(reference, texts: dict[str, list[list[int]]], groups: tuple[int, ...], bits: tuple[int, ...],
               layers: tuple[int, ...] | None = None, log=print, cache=None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Every rung of `lab.quant.ladder.ladder(groups, bits)` applied to a copy of `reference` (the decoder linears of
    `layers`, None: all): (one row per rung with its weight error, per-sequence scores per domain). `cache`: the
    reference's forwards (`lab.eval.scores.ReferenceLogProbs`) from the grid, on the same sequences."""
    rows, score_rows, scores = [], [], {}
    model = copy.deepcopy(reference)  # one working copy: each rung rewrites its linears from the reference's
    for rung in tqdm(ladder(groups, bits), desc="ladder"):
        changed = apply_rung(model, rung, layers, source=reference)
        err = weight_error(reference, model, layers)
        rows.append({"rung": rung.name, "change": rung.change, "bits": rung.bits, "group_size": rung.group,
                     **err.columns("weight_error_%")})
        # The same weights score the same: a rung equal to the reference runs one forward, one equal to the rung
        # before reuses its scores (exactly what scoring it again would give).
        if changed or not scores:
            scores = {d: score_sequences(reference, reference if err.value == 0 else model, seqs, cache=cache)
                      for d, seqs in texts.items()}
        for domain, s in scores.items():
            score_rows += s.rows(model=rung.name, domain=domain)
        log(f"{rung.name:20s} weight error {err.value:6.2f}%  ({rung.change}{'' if changed else '; same weights'})")
    return pd.DataFrame(rows), pd.DataFrame(score_rows)


def _of(scores: pd.DataFrame, model: str, domain: str) -> SequenceScores:
    rows = scores[(scores["model"] == model) & (scores["domain"] == domain)]
    if rows.empty:
        raise KeyError(f"no per-sequence scores for {model!r} on {domain!r}")
    return SequenceScores.from_rows(rows)


def change(scores: pd.DataFrame, model: str, base: str, domain: str) -> Interval:
    """Perplexity of `model` over `base`'s on the same sequences, as a change in %, paired over sequences."""
    r = paired(_of(scores, model, domain), _of(scores, base, domain), "perplexity")
    return Interval(100 * (r.value - 1), 100 * (r.low - 1), 100 * (r.high - 1))


def ladder_table(rungs: pd.DataFrame, scores: pd.DataFrame, domains: tuple[str, ...]) -> pd.DataFrame:
    """`run_ladder`'s rows with, per domain, the perplexity change against the unquantized model and against the
    rung before (`scores` holds the rungs' and the unquantized model's per-sequence scores)."""
    out = rungs.copy()
    for d in domains:
        total, step = [], []
        for i, name in enumerate(rungs["rung"]):
            total.append(change(scores, name, "unquantized", d).columns(f"{d}_ppl_change_%"))
            before = rungs["rung"].iloc[i - 1] if i else "unquantized"
            step.append(change(scores, name, before, d).columns(f"{d}_step_%"))
        out = pd.concat([out, pd.DataFrame(total), pd.DataFrame(step)], axis=1)
    return out


def decomposition(grid: pd.DataFrame, scores: pd.DataFrame, domains: tuple[str, ...]) -> pd.DataFrame:
    """Per quantized model of the grid and domain, its perplexity change (%) and the two factors it is made of:
    `grid` the same method at 4 bits and the same group size against the unquantized model (all of it at 4 bits
    or more), `levels` the model against that one (NaN at 4 bits or more, and where no such 4-bit model ran)."""
    models = set(grid["model"])
    errors = dict(zip(grid["model"], grid["weight_error_%"])) if "weight_error_%" in grid else {}
    nan = Interval(np.nan, np.nan, np.nan)
    rows = []
    for _, r in grid.iloc[1:].iterrows():
        g = None if pd.isna(r["group_size"]) else int(r["group_size"])
        four = f"{r['method']} w4g{g}" if r["bits"] < 4 and g else None
        if r["bits"] >= 4:
            split = "4 bits or more: all of it from the grid"
        elif four in models:
            split = f"grid: {four}; levels: {r['model']} over {four}"
        else:
            split = f"no 4-bit {r['method']} model at this group size ran: not split"
        row = {"model": r["model"], "split": split, "weight_error_%": errors.get(r["model"], np.nan),
               "weight_error_4bit_%": errors.get(four, np.nan)}
        for d in domains:
            row.update(change(scores, r["model"], "unquantized", d).columns(f"{d}_total_%"))
            at4 = change(scores, r["model"], "unquantized", d) if r["bits"] >= 4 else \
                change(scores, four, "unquantized", d) if four in models else nan
            fewer = change(scores, r["model"], four, d) if r["bits"] < 4 and four in models else nan
            row.update(at4.columns(f"{d}_grid_%"))
            row.update(fewer.columns(f"{d}_levels_%"))
        rows.append(row)
    return pd.DataFrame(rows)
