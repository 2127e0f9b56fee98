"""Notebooks 01, 03 and 04's claims tables in the one shape (`lab.claims.table.claim_row`), rebuilt from their latest
reference runs' inputs: every ledger link finds exactly one row, and the ledger reads the same figure and
reaches the same verdict from the rebuilt table as from the committed one, so a change of shape or wording
cannot move a claim unnoticed."""

import pandas as pd
import pytest

from claims_shape import assert_ledger_reads_the_same, assert_one_shape

from lab.claims.gather import latest_reference_runs
from lab.workflow.run import results_root


def _rebuilt(notebook: str):
    """The notebook's claims table rebuilt from a run's inputs by its `Rebuild` (`lab.studies.evidence`), the same
    code the evidence-level mutation test perturbs."""
    from lab.studies.evidence import rebuilds

    def build(run_dir):
        rebuild = rebuilds()[notebook]
        return rebuild.table(rebuild.load(run_dir))
    return build


memory_claims, kv_claims, replay_claims = (_rebuilt(nb) for nb in ("01_memory_accounting", "03_kv_quantization",
                                                                     "04_replay_break_even"))


@pytest.mark.parametrize("notebook, build", [("01_memory_accounting", memory_claims),
                                             ("03_kv_quantization", kv_claims),
                                             ("04_replay_break_even", replay_claims)])
def test_the_rebuilt_table_has_the_one_shape_and_gives_the_ledger_the_same_claims(notebook, build, tmp_path):
    run_dir = latest_reference_runs(results_root())[notebook]
    claims = build(run_dir)
    assert_one_shape(claims)
    assert_ledger_reads_the_same(claims, notebook, run_dir, tmp_path)
