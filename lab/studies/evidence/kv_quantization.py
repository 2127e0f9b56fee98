"""Notebook 03's claims table rebuilt from one of its runs (`lab.claims.rebuild.Rebuild`).

The notebook calls `kv_quantization.claims.claims_table(params, blocks, roles, e2e)` and saves the first of the
two tables it returns (the claims; the second, its intervals, is verdict_intervals.csv). `blocks` is the position
study's per-block errors (error_by_block.csv); `roles` is computed from it in the notebook
(`role_table(blocks[K-only and V-only formats])`, saved as k_vs_v.csv), so it is recomputed here from `blocks`
the same way, and a perturbation of the per-block errors reaches the keys-against-values rows as it would in a
run; `e2e` is the end-to-end table (end_to_end.csv), of which only the columns the claims code reads are loaded
(the safety rows read the perplexity change, the pass-rate change, the item counts and the unchanged outputs:
the rest, perplexity, KL, per-category pass rates, is not read, and perturbing it would only cost time).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from lab.claims.rebuild import Inputs, Rebuild, run_parameters
from lab.studies import kv_quantization as study
from lab.studies.kv_quantization import claims as claims_mod

# The end-to-end columns `claims_table` reads (`_safety`): the format, the perplexity change against the exact
# cache and the pass-rate change with their intervals, items lost, gained and run, and the unchanged outputs.
E2E_COLUMNS = ("format", "perplexity_change_pct", "perplexity_change_pct_low", "perplexity_change_pct_high",
               "pass_change", "pass_change_low", "pass_change_high", "items_lost", "items_gained", "items",
               "same_output_all")
ROLE_SUFFIXES = ("k-only", "v-only")


def _params(run_dir: Path) -> study.KVStudyParams:
    return run_parameters(run_dir, study.KVStudyParams)


def load(run_dir: Path) -> Inputs:
    run_dir = Path(run_dir)
    return {"params": _params(run_dir),
            "blocks": pd.read_csv(run_dir / "error_by_block.csv"),
            "e2e": pd.read_csv(run_dir / "end_to_end.csv")[list(E2E_COLUMNS)]}


def table(inputs: Inputs) -> pd.DataFrame:
    """As the notebook's sections 4 and 6: K-only against V-only from the per-block errors, then the claims."""
    blocks = inputs["blocks"]
    roles = claims_mod.role_table(blocks[blocks["format"].str.endswith(ROLE_SUFFIXES)])
    claim_table, _intervals = claims_mod.claims_table(inputs["params"], blocks, roles, inputs["e2e"])
    return claim_table


REBUILD = Rebuild(
    notebook="03_kv_quantization",
    load=load,
    table=table,
    # Settings: a block's place on the long text (its first position, its position bucket's end) and how many of
    # its positions were measured (set by ATTENTION_STRIDE and BLOCK_TOKENS: the bootstrap's weights), and the
    # sensitive items an end-to-end format ran. Measured and perturbed: each block's error (attention error or
    # next-token KL), and end to end the perplexity change, the pass-rate change, items lost and gained and the
    # share of unchanged outputs.
    settings={"blocks": ("position_end", "block_start", "measured"),
              "e2e": ("items",)},
    # The parameters (formats, context, the SAFE_PPL_PCT threshold the safety rule is stated with) are not evidence.
    fixed=("params",),
)
