"""Notebook 04's claims table rebuilt from one of its runs (`lab.claims.rebuild.Rebuild`): the notebook calls
`study.claims_table(params, measured)`, `measured` saved whole as measured.csv (the engine's recompute times, the
tiers' load times and the cost models' predictions per model, prefix and window)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from lab.claims.rebuild import Inputs, Rebuild, run_parameters
from lab.studies import replay_break_even as study


def _params(run_dir: Path) -> study.ReplayParams:
    return run_parameters(run_dir, study.ReplayParams)


def load(run_dir: Path) -> Inputs:
    run_dir = Path(run_dir)
    return {"params": _params(run_dir), "measured": pd.read_csv(run_dir / "measured.csv")}


def table(inputs: Inputs) -> pd.DataFrame:
    return study.claims_table(inputs["params"], inputs["measured"])


REBUILD = Rebuild(
    notebook="04_replay_break_even",
    load=load,
    table=table,
    # The sweep's axes (prefix M, window W) are settings; every other numeric column is what the run measured
    # (recompute and load times, probed ceilings, microbenchmarked rates) or computed from those at the point
    # (predictions, errors, the window's KV bytes, the attention microbenchmark's key count), and is perturbed.
    settings={"measured": ("prefix", "window")},
    # The parameters (the article's EFFICIENCY, the sweep's lists, the hardware name) are not evidence: the rows
    # that read them are the article's arithmetic on its own 70B-on-an-H100 example.
    fixed=("params",),
)
