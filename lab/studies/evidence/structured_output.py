"""Notebook 07's claims table rebuilt from one of its runs (`lab.claims.rebuild.Rebuild`).

The notebook calls `structured_output_claims.claims_table(params, validity, summary, components, depth,
compile_df, proj, vocab)`, its tables saved as validity.csv, mask_summary.csv, mask_components.csv,
nesting_depth.csv, compile_times.csv and projection.csv. Two of its inputs are rebuilt rather than read:

- `vocab` is the served model's `config.vocab_size`, taken from the model's config (`ModelShape.load(MODEL)`: the
  preset, or the checkpoint's config.json) without loading weights;
- `proj` is computed in the notebook from the measured mask costs: `projection(params, fill, naive, vocab)` on
  HARDWARE's datasheet, with `fill` the mean of `components.fill_s` and `naive` the median of
  `components.naive_s`, followed by the same projection on the ceilings measured on the run's device
  (`probe_inference`, not saved apart from these rows). The first part is recomputed here from `components`, so
  the projected row moves with the fill and naive-mask times it is scaled from (the roofline's step times in
  projection.csv are a model, not a measurement); the second part is taken as saved (`proj_here`): the claims
  read the first batch-1 and the first largest-batch rows, which are HARDWARE's, and never these.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from lab.machine.hardware import GPUS
from lab.claims.rebuild import Inputs, Rebuild, run_parameters
from lab.memory import ModelShape
from lab.studies.structured_output import measure as study, claims as claims_mod


def _params(run_dir: Path) -> study.StructuredParams:
    return run_parameters(run_dir, study.StructuredParams)


def load(run_dir: Path) -> Inputs:
    run_dir = Path(run_dir)
    p = _params(run_dir)
    proj = pd.read_csv(run_dir / "projection.csv")
    return {"params": p, "vocab": ModelShape.load(p.MODEL).vocab_size,
            "validity": pd.read_csv(run_dir / "validity.csv"),
            "summary": pd.read_csv(run_dir / "mask_summary.csv"),
            "components": pd.read_csv(run_dir / "mask_components.csv"),
            "depth": pd.read_csv(run_dir / "nesting_depth.csv"),
            "compile_df": pd.read_csv(run_dir / "compile_times.csv"),
            "proj_here": proj[proj["hardware"] != GPUS[p.HARDWARE].name].reset_index(drop=True)}


def projection(inputs: Inputs) -> pd.DataFrame:
    """The notebook's section 5: HARDWARE's projection from the measured fill and naive-mask times, then the
    run's device's rows as saved."""
    components = inputs["components"]
    fill_row = float(components["fill_s"].mean())
    naive_row = float(components["naive_s"].dropna().median())
    return pd.concat([claims_mod.projection(inputs["params"], fill_row, naive_row, inputs["vocab"]),
                      inputs["proj_here"]], ignore_index=True)


def table(inputs: Inputs) -> pd.DataFrame:
    return claims_mod.claims_table(inputs["params"], inputs["validity"], inputs["summary"], inputs["components"],
                                   inputs["depth"], inputs["compile_df"], projection(inputs), inputs["vocab"])


REBUILD = Rebuild(
    notebook="07_structured_output",
    load=load,
    table=table,
    # Settings: the sampling temperature and the outputs per setting (validity), the decode batch, timed rounds
    # and steps (summary), the tokens a grammar state allows (components: the state's, not a timing), and the
    # nesting depth and the tokens walked along its instance (depth). Measured and perturbed: validity and
    # accuracy rates, tokens and seconds per valid answer, step times and their ratios, mask fill / apply /
    # naive times, compile times.
    settings={"validity": ("temperature", "outputs"),
              "summary": ("batch", "rounds", "steps timed"),
              "components": ("allowed",),
              "depth": ("depth", "tokens walked")},
    # The parameters, the vocabulary size (the model's) and the projection on the run's own device (rows the
    # claims never read) are not evidence for any claim.
    fixed=("params", "vocab", "proj_here"),
)
