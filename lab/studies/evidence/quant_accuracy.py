"""Notebook 02's claims table rebuilt from one of its runs (`lab.claims.rebuild.Rebuild`).

The notebook calls `quant_accuracy_stats.claims_table(sens, recovery, grid, scores, outputs, CHECKPOINT_CONFIG,
mismatch_ratio, baseline=baseline, on_gpu=...)`. What the run saved, and how each input is rebuilt:

- `scores`: the per-sequence scores of every model (sequence_scores.csv), as saved.
- `sens` (`sensitive_vs_perplexity(grid, scores, outputs)`, sensitive_vs_perplexity.csv): its perplexity rises
  are recomputed here from `scores` by the study's own function (given the grid without its pass-rate columns,
  it computes the perplexity part alone), so the perplexity row moves with the per-sequence scores; its
  pass-rate changes need the per-item outputs, which the run does not save, so they are taken as saved
  (`sens_pass`) and perturbed there.
- `outputs` (each model's per-item sensitive outputs: id, category, passed): NOT saved by the run (only the
  worst model's ten bad cases are). The claims read them for one row, "AWQ is steadier than GPTQ" (AWQ's pass
  rate minus GPTQ's, paired over items), which the ledger does not link. A stand-in is built from the grid's
  per-category pass rates over the run's sensitive items (`quant_accuracy.sensitive_items`, long context left
  out as "all" leaves it out): in each category the first round(pass rate x items) items pass. It gives that
  row's point value exactly (the difference of the two pass rates) but not its interval, which depends on which
  items each model passed; it is a fixed input, built once from the saved grid.
- `recovery` (recovery.csv): the claims only ask whether it has rows at CHECKPOINT_CONFIG, so only its labels
  are loaded. `grid` (grid.csv): the claims read its methods, `sensitive_vs_perplexity` its models; only the
  labels are loaded (its pass rates feed the fixed `outputs` stand-in at load).
- `mismatch_ratio` (`mismatch_comparison(mismatch, mismatch_scores)` when two calibration sets ran): recomputed
  from calibration_mismatch.csv's labels and mismatch_sequence_scores.csv.
- `baseline` (`already_quantized(model)`, a `QuantizedBaseline`): from metrics.json (`weights16`, `baseline_bits`,
  `baseline_max_distinct_per_block`, `baseline_mean_distinct_per_block`) without loading the model; its count of
  decoder linears, which metrics.json does not hold, from the line the run's notebook printed ("... of all 120
  decoder linears"), else 4 per decoder layer of the model's shape (the lab's layer: qkv, o, gate_up, down).
- `on_gpu` (`reference.embed_tokens.weight.is_cuda`): DEVICE cuda, or "auto" on a run that had a GPU.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd

from lab.eval.sensitive import CATEGORIES
from lab.claims.rebuild import Inputs, Rebuild, run_parameters
from lab.memory import ModelShape
from lab.quant.gguf_grids import QuantizedBaseline
from lab.studies.quant_accuracy import measure as study, stats

LABELS = ["model", "method", "config"]
PPL_RISE = re.compile(r"_ppl_rise")  # sens's columns computed from the per-sequence scores


def _params(run_dir: Path) -> study.QuantAccuracyParams:
    return run_parameters(run_dir, study.QuantAccuracyParams)


def _on_gpu(run_dir: Path) -> bool:
    record = json.loads((run_dir / "params.json").read_text())
    device = record["parameters"].get("DEVICE", "auto")
    return device.startswith("cuda") if device != "auto" else bool(record.get("gpu"))


def _linears(run_dir: Path, model: str) -> int:
    """The decoder linears `already_quantized` inspected: as the run printed them, else from the model's shape."""
    printed = run_dir / "02_quantization_accuracy.ipynb"
    if printed.exists():
        found = re.search(r"(?:of all|over) (\d+) decoder linears", printed.read_text(encoding="utf-8"))
        if found:
            return int(found.group(1))
    return 4 * ModelShape.load(model).num_layers


def baseline(run_dir: Path, model: str) -> QuantizedBaseline:
    """`already_quantized`'s finding, from what `quant_accuracy_ladder.baseline_metrics` wrote to metrics.json."""
    m = json.loads((run_dir / "metrics.json").read_text())
    return QuantizedBaseline(detected=not m["weights16"], bits=m["baseline_bits"], linears=_linears(run_dir, model),
                             max_distinct=m["baseline_max_distinct_per_block"],
                             mean_distinct=m["baseline_mean_distinct_per_block"])


def outputs_stand_in(p: study.QuantAccuracyParams, grid: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """Per model, its sensitive items (long context left out) with `passed` set on the first round(pass rate x
    items) of each category: the grid's pass rates exactly, the per-item pattern invented (the run saves none)."""
    items = [i for i in study.sensitive_items(p, long_context=False) if i.category != "long_context"]
    by_cat = {c: [i.id for i in items if i.category == c] for c in CATEGORIES}
    out = {}
    for r in grid.to_dict("records"):
        rows = []
        for c, ids in by_cat.items():
            rate = r.get(f"pass_{c}")
            if not ids or rate is None or pd.isna(rate):
                continue
            k = round(rate * len(ids))
            rows += [{"id": i, "category": c, "passed": n < k} for n, i in enumerate(ids)]
        out[r["model"]] = pd.DataFrame(rows, columns=["id", "category", "passed"])
    return out


def _table(path: Path) -> pd.DataFrame:
    """A saved table; an empty one (no columns: `to_csv` of an empty frame writes a blank line) as an empty frame."""
    try:
        return pd.read_csv(path)
    except pd.errors.EmptyDataError:
        return pd.DataFrame()


def load(run_dir: Path) -> Inputs:
    run_dir = Path(run_dir)
    p = _params(run_dir)
    grid = pd.read_csv(run_dir / "grid.csv")
    sens = pd.read_csv(run_dir / "sensitive_vs_perplexity.csv")
    mismatch = _table(run_dir / "calibration_mismatch.csv")
    mismatch_scores = _table(run_dir / "mismatch_sequence_scores.csv")  # no columns where Spec-Bench was absent
    return {"params": p, "baseline": baseline(run_dir, p.MODEL), "on_gpu": _on_gpu(run_dir),
            "outputs": outputs_stand_in(p, grid),
            "grid": grid[LABELS],
            "recovery": pd.read_csv(run_dir / "recovery.csv")[["config", "method", "domain"]],
            "scores": pd.read_csv(run_dir / "sequence_scores.csv"),
            "mismatch": mismatch[[c for c in ("calibration", "method", "config") if c in mismatch.columns]],
            "mismatch_scores": mismatch_scores,
            "sens_pass": sens[[c for c in sens.columns if not PPL_RISE.search(c)]]}


def sensitive_vs_perplexity(inputs: Inputs) -> pd.DataFrame:
    """The notebook's `sens`: the perplexity rises recomputed from the scores, the pass-rate changes as saved."""
    rises = stats.sensitive_vs_perplexity(inputs["grid"], inputs["scores"], {})
    return rises.merge(inputs["sens_pass"], on="model", how="left")


def table(inputs: Inputs) -> pd.DataFrame:
    mismatch, mismatch_scores = inputs["mismatch"], inputs["mismatch_scores"]
    ratio = stats.mismatch_comparison(mismatch, mismatch_scores) if len(mismatch) == 2 else None
    return stats.claims_table(sensitive_vs_perplexity(inputs), inputs["recovery"], inputs["grid"], inputs["scores"],
                              inputs["outputs"], inputs["params"].CHECKPOINT_CONFIG, ratio,
                              baseline=inputs["baseline"], on_gpu=inputs["on_gpu"])


REBUILD = Rebuild(
    notebook="02_quantization_accuracy",
    load=load,
    table=table,
    # Settings: a sequence's index, the tokens it predicts and the positions it has (set by HELDOUT_TOKENS and
    # the documents, the weights of every ratio of sums). Measured and perturbed: each sequence's summed NLL, KL
    # and top-1 agreements (scores, mismatch_scores), and each model's pass-rate changes against the unquantized
    # model and share of changed outputs (sens_pass).
    settings={"scores": ("sequence", "predicted", "positions"),
              "mismatch_scores": ("sequence", "predicted", "positions")},
    # Not evidence: the parameters (CHECKPOINT_CONFIG), the baseline's detection (it decides whether a verdict
    # is in scope, not a figure), the device, and the per-item outputs' stand-in (the run does not save them).
    fixed=("params", "baseline", "on_gpu", "outputs"),
)
