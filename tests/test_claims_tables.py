"""Notebooks 01, 03 and 04's claims tables in the one shape (`lab.claims.claim_row`), rebuilt from their latest
reference runs' inputs: every ledger link finds exactly one row, and the ledger reads the same figure and
reaches the same verdict from the rebuilt table as from the committed one, so a change of shape or wording
cannot move a claim unnoticed."""

import pandas as pd
import pytest

from claims_shape import assert_ledger_reads_the_same, assert_one_shape

from lab.ledger.gather import latest_reference_runs
from lab.runs import results_root


def memory_claims(run_dir):
    from lab.studies import int4_decode, memory_accounting

    int4 = int4_decode.claim_rows(pd.read_csv(run_dir / "int4_speedup.csv"))
    batching = int4_decode.batching_rows(pd.read_csv(run_dir / "int4_decode.csv"))
    return pd.concat([memory_accounting.claims_table(), int4, batching], ignore_index=True)


def replay_claims(run_dir):
    from lab.studies.replay_break_even import ReplayParams, claims_table

    return claims_table(ReplayParams(), pd.read_csv(run_dir / "measured.csv"))


def kv_claims(run_dir):
    from lab.studies.kv_quantization import KVStudyParams
    from lab.studies.kv_quantization_claims import claims_table, role_table

    blocks = pd.read_csv(run_dir / "error_by_block.csv")
    roles = role_table(blocks[blocks["format"].str.endswith(("k-only", "v-only"))])
    return claims_table(KVStudyParams(), blocks, roles, pd.read_csv(run_dir / "end_to_end.csv"))[0]


@pytest.mark.parametrize("notebook, build", [("01_memory_accounting", memory_claims),
                                             ("03_kv_quantization", kv_claims),
                                             ("04_replay_break_even", replay_claims)])
def test_the_rebuilt_table_has_the_one_shape_and_gives_the_ledger_the_same_claims(notebook, build, tmp_path):
    run_dir = latest_reference_runs(results_root())[notebook]
    claims = build(run_dir)
    assert_one_shape(claims)
    assert_ledger_reads_the_same(claims, notebook, run_dir, tmp_path)
