"""Notebook 08's claims table rebuilt from one of its runs (`lab.claims.rebuild.Rebuild`): the notebook calls
`parallelism_claims.claims_table(params, tp, proj, bubble, per_rank)`, saved as tp_summary.csv, projection.csv,
bubble.csv and projected_memory.csv."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from lab.claims.rebuild import Inputs, Rebuild, run_parameters
from lab.studies.parallelism import measure as study, claims as claims_mod


def _params(run_dir: Path) -> study.ParallelParams:
    return run_parameters(run_dir, study.ParallelParams)


def load(run_dir: Path) -> Inputs:
    run_dir = Path(run_dir)
    return {"params": _params(run_dir),
            "tp": pd.read_csv(run_dir / "tp_summary.csv"),
            "proj": pd.read_csv(run_dir / "projection.csv"),
            "bubble": pd.read_csv(run_dir / "bubble.csv"),
            "per_rank": pd.read_csv(run_dir / "projected_memory.csv")}


def table(inputs: Inputs) -> pd.DataFrame:
    return claims_mod.claims_table(inputs["params"], inputs["tp"], inputs["proj"], inputs["bubble"],
                                   inputs["per_rank"])


REBUILD = Rebuild(
    notebook="08_parallelism",
    load=load,
    table=table,
    # Settings: what the run chose. tp: the tokens of each step (the decode batch or the prefill prompt).
    # proj: the batch, and the link's assumed latency and bandwidth (alpha_us, bus_GBps: the projection's
    # assumptions, printed as "alpha 30 us assumed"). bubble: the micro-batch count. per_rank: the rank's index.
    # Everything else is measured (step times, collective times, wait shares) or computed by the run at the
    # point (the projection's compute and comm times and shares, a rank's weight and KV bytes, the collectives'
    # counts, the bubble formula's value) and is perturbed, so a claim that does not read it shows up.
    settings={"tp": ("tokens",),
              "proj": ("batch", "alpha_us", "bus_GBps"),
              "bubble": ("micro_batches",),
              "per_rank": ("rank",)},
    # The parameters (the projected model, TP degree, context, hardware) are not evidence.
    fixed=("params",),
)
