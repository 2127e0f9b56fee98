"""Notebook 01's claims table rebuilt from one of its runs (`lab.claims.rebuild.Rebuild`).

The notebook saves `pd.concat([study.claims_table(params), int4_claims])`, where `int4_claims` is what
`lab.studies.memory_accounting.int4_decode.run` returns: `claim_rows(int4_table)` (the INT4 speedup rows, §2.1) followed by
`batching_rows(int4_measured)` (the batching rows, §1.2). Those two are saved as int4_speedup.csv (`int4_table`)
and int4_decode.csv (`int4_measured`, without its raw per-step `times`). The `times` column is not saved, so
`int4_decode.speedups` (which bootstraps one run's steps from it) cannot be rerun: the speedup table is taken as
saved, and its measured columns (the speedups, their spans, the step-time medians) are perturbed directly.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from lab.claims.rebuild import Inputs, Rebuild, run_parameters
from lab.studies.memory_accounting import int4_decode, measure as study


def _params(run_dir: Path) -> study.MemoryParams:
    return run_parameters(run_dir, study.MemoryParams)


def load(run_dir: Path) -> Inputs:
    run_dir = Path(run_dir)
    return {"params": _params(run_dir),
            "int4_table": pd.read_csv(run_dir / "int4_speedup.csv"),
            "int4_measured": pd.read_csv(run_dir / "int4_decode.csv")}


def table(inputs: Inputs) -> pd.DataFrame:
    """As the notebook's section 8: the articles' arithmetic, then the INT4 rows and the batching rows."""
    int4_claims = pd.concat([int4_decode.claim_rows(inputs["int4_table"]),
                             int4_decode.batching_rows(inputs["int4_measured"])], ignore_index=True)
    return pd.concat([study.claims_table(inputs["params"]), int4_claims], ignore_index=True)


REBUILD = Rebuild(
    notebook="01_memory_accounting",
    load=load,
    table=table,
    # What the run chose: the batch of each row, how many interleaved runs (rounds), each round's index and the
    # context. Everything else is what the run measured (step times, the speedups and their spans) or computed
    # at each point (bytes per step and the bytes-read ratio, the bandwidth-bound prediction printed beside the
    # measured speedup), and is perturbed.
    settings={"int4_table": ("batch", "runs"),
              "int4_measured": ("round", "batch", "context")},
    # The parameters are not evidence. Their only inputs to the claims table are the paging rows' request lengths
    # (LENGTH_P50/P90/P99) and SEQ_LEN: settings of that arithmetic, which the claim cells themselves state
    # ("log-normal lengths P50/P90/P99 600/2000/6000, at most 8192 tokens"), so moving them would change the claim,
    # not the evidence for it (and they are ints, which `perturbations` leaves alone anyway). The one float field,
    # PROBE_SECONDS, is a probe's duration no claim reads. So `params` is fixed: every row of
    # `study.claims_table` is the articles' arithmetic on stated inputs, fixed by them by design.
    fixed=("params",),
)
