"""Notebook 05's claims table rebuilt from one of its runs (`lab.claims.rebuild.Rebuild`).

The notebook calls `spec_acceptance.claims.claims_table(main, costs, params, model, bench)`:

- `main` is the per-category table (by_category.csv). Its comparison words `error_article_vs_10pct` and
  `error_measured_costs_vs_10pct`, which the "acceptance decides everything" row counts, are computed by the study
  from the same row's prediction and measured-speedup interval (`spec_acceptance.intervals.error_columns`); they
  are recomputed here the same way, so a perturbation of the speedups or the predictions reaches that row as it
  would in a run (a saved word would hold it still).
- `costs` (drafter -> `lab.speculative.measure.StepCosts`) is rebuilt from step_costs.csv: the target step, the
  draft step and each (k+1)-token verification (its "v(k) forward only" times the target step). The claims read
  its drafters' order and `c` (draft step / target step). step_costs' roofline columns (the floor on this
  device's ceilings, a model) and `c_forward` (the ratio, recomputed from the two step times) are not loaded.
- `model` is read only by `quantized_c_bound` (`lab.speculative.drafters.weight_bytes_ratio`): its decoder
  linears' and other parameters' counts and `config.vocab_size` / `config.hidden_size`. No weights are loaded:
  `ShapeModel` gives those counts from the target's config (`spec_acceptance.target_config(MODEL)`, read from the
  preset or the checkpoint's config.json) through `lab.memory.shape.param_counts`.
- `bench` is Spec-Bench's per-category table (spec_bench.csv; None when the run skipped it).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pandas as pd

from lab.claims.rebuild import Inputs, Rebuild, run_parameters
from lab.memory import ModelShape
from lab.memory.shape import param_counts
from lab.speculative.measure import StepCosts
from lab.studies import spec_acceptance as study
from lab.studies.spec_acceptance import claims as claims_mod
from lab.studies.spec_acceptance.intervals import error_columns

# The comparison words claims_table counts, recomputed from each row's numbers (`error_columns`).
WORDS = ("article", "measured_costs")


def _params(run_dir: Path) -> study.SpecParams:
    return run_parameters(run_dir, study.SpecParams)


class _Count:
    """A parameter tensor as `weight_bytes_ratio` reads it: its element count and its number of dimensions."""

    def __init__(self, n: int, dim: int):
        self.n, self.ndim = n, dim

    def numel(self) -> int:
        return self.n

    def dim(self) -> int:
        return self.ndim


@dataclass(frozen=True)
class ShapeModel:
    """A stand-in for the target model in `quantized_c_bound`: the decoder's 2-D weights under "layers." (the
    linears: attention projections, MLP or experts, routers), the rest (embedding, an untied LM head, norms,
    biases) elsewhere, and the config's vocabulary and hidden sizes; counted by `param_counts` from the shape.
    A dataclass of its shape, so the rebuild's inputs are read by content (`lab.claims.rebuild`)."""

    shape: ModelShape

    @property
    def config(self) -> SimpleNamespace:
        return SimpleNamespace(vocab_size=self.shape.vocab_size, hidden_size=self.shape.hidden_size)

    def named_parameters(self):
        shape = self.shape
        counts = param_counts(shape)
        q, kv = shape.num_heads * shape.head_dim, shape.num_kv_heads * shape.head_dim
        bias = shape.num_layers * (q + 2 * kv) if shape.qkv_bias and not shape.is_mla else 0
        linear = counts["attention"] - bias + counts["dense_mlp"] + counts["experts"] + counts["router"]
        return iter([("layers.linears", _Count(linear, 2)), ("rest", _Count(counts["total"] - linear, 1))])

    def parameters(self):
        return iter(p for _, p in self.named_parameters())


def shape_model(p: study.SpecParams) -> ShapeModel:
    return ShapeModel(ModelShape.from_hf_config(study.target_config(p.MODEL).to_hf_dict(), p.MODEL))


def load(run_dir: Path) -> Inputs:
    run_dir = Path(run_dir)
    p = _params(run_dir)
    costs = pd.read_csv(run_dir / "step_costs.csv")
    costs = costs[["drafter", "context", "target step ms", "draft step ms"]
                  + [c for c in costs.columns if c.startswith("v(") and c.endswith(" forward only")]]
    bench = pd.read_csv(run_dir / "spec_bench.csv") if (run_dir / "spec_bench.csv").exists() else None
    return {"params": p, "model": shape_model(p), "main": pd.read_csv(run_dir / "by_category.csv"),
            "step_costs": costs, "bench": bench}


def step_costs(frame: pd.DataFrame) -> dict[str, StepCosts]:
    """Each drafter's `StepCosts` from its step_costs.csv row (times in ms there, seconds here)."""
    out = {}
    for r in frame.to_dict("records"):
        target = r["target step ms"] / 1e3
        verify = {int(c[2:c.index(")")]): v * target for c, v in r.items() if c.startswith("v(")}
        draft = None if pd.isna(r["draft step ms"]) else r["draft step ms"] / 1e3
        out[r["drafter"]] = StepCosts(int(r["context"]), target, verify, draft)
    return out


def with_words(main: pd.DataFrame) -> pd.DataFrame:
    """`main` with its within-10% words recomputed from each row's prediction and measured-speedup interval."""
    words = pd.DataFrame([{k: v for name in WORDS for k, v in error_columns(r, name).items()
                           if k.endswith("_vs_10pct")} for r in main.to_dict("records")], index=main.index)
    return main.assign(**{c: words[c] for c in words.columns})


def table(inputs: Inputs) -> pd.DataFrame:
    return claims_mod.claims_table(with_words(inputs["main"]), step_costs(inputs["step_costs"]), inputs["params"],
                                   inputs["model"], inputs["bench"])


REBUILD = Rebuild(
    notebook="05_speculative_acceptance",
    load=load,
    table=table,
    # Settings: the drafts per round (k), a category's prompt count (requests: it also picks Spec-Bench's rows
    # over the lab set's for a task) and the context the step costs were timed at. Measured and perturbed: the
    # tokens, rounds and plain steps, acceptance (a, its intervals, accepted/drafted, accepted per step), c and
    # v(k), the measured speedups, the predictions and their errors (computed from the measurements in the run),
    # and the step times (target, draft, each verification).
    settings={"main": ("k", "requests"),
              "bench": ("k", "requests"),
              "step_costs": ("context",)},
    # The parameters and the model's stand-in (parameter counts of its shape) are not evidence.
    fixed=("params", "model"),
)
