"""Notebook 09's claims table rebuilt from one of its runs (`lab.claims.rebuild.Rebuild`): the notebook calls
`ttft_claims_table.claims_table(params, flops, first, int8, sweep, cold, cold_raw, cold_info["weights_bytes"])`;
the tables are saved as prefill_flops.csv, first_token_ttft.csv, int8_memory.csv, hit_rate_sweep.csv,
cold_start.csv and cold_start_raw.csv, and the weights file's size in bytes as metrics.json's weights_bytes.
`cold` is `ttft_claims.cold_summary(cold_raw)`; both are passed, as saved, as the notebook passes both."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from lab.claims.rebuild import Inputs, Rebuild, run_parameters
from lab.studies.ttft_claims import measure as study, table as claims_mod


def _params(run_dir: Path) -> study.TTFTParams:
    return run_parameters(run_dir, study.TTFTParams)


def load(run_dir: Path) -> Inputs:
    run_dir = Path(run_dir)
    metrics = json.loads((run_dir / "metrics.json").read_text())
    return {"params": _params(run_dir),
            "flops": pd.read_csv(run_dir / "prefill_flops.csv"),
            "first": pd.read_csv(run_dir / "first_token_ttft.csv"),
            "int8": pd.read_csv(run_dir / "int8_memory.csv"),
            "sweep": pd.read_csv(run_dir / "hit_rate_sweep.csv"),
            "cold": pd.read_csv(run_dir / "cold_start.csv"),
            "cold_raw": pd.read_csv(run_dir / "cold_start_raw.csv"),
            # saved as an int (a file's size); a float here, as claims_table types it, so it is perturbed: the
            # disk's and the page cache's rates are these bytes over the measured read times
            "weights_bytes": float(metrics["weights_bytes"])}


def table(inputs: Inputs) -> pd.DataFrame:
    return claims_mod.claims_table(inputs["params"], inputs["flops"], inputs["first"], inputs["int8"],
                                   inputs["sweep"], inputs["cold"], inputs["cold_raw"], inputs["weights_bytes"])


REBUILD = Rebuild(
    notebook="09_ttft_claims",
    load=load,
    table=table,
    # Settings: what the run chose, the prompt's token counts, the cached tokens asked for, the sweep's hit rate,
    # the repeats, a raw row's repeat index, and whether the weights file was resident in the page cache before a
    # case (the case's condition, 0 or 1). Everything else is measured (TTFTs, read, load and import times, the
    # tokens the cache actually hit) or computed by the run (FLOP counts and their shares, INT8's bytes and
    # savings) and is perturbed: the FLOP counts are what the by-construction rows are computed from (a new
    # prompt's with-cache figure set to its no-cache figure), so holding them would hide what the test is for.
    settings={"flops": ("prompt tokens", "cached tokens"),
              "first": ("prompt tokens", "cached asked", "repeats"),
              "sweep": ("hit rate %", "prompt tokens", "cached asked", "repeats"),
              "cold_raw": ("repeat", "resident_before")},
    # The parameters (model, shapes, token counts, HIGH_HIT) are not evidence.
    fixed=("params",),
)
