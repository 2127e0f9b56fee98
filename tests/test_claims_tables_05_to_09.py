"""Notebooks 05, 06, 07, 08 and 09's claims tables in the one shape (`lab.claims.table.claim_row`), rebuilt from the tables
their latest reference runs saved: every ledger link finds exactly one row, and the ledger reads the same number
(and interval) and reaches the same verdicts from the rebuilt table as from the committed one, so a change of
shape or wording cannot move a claim unnoticed. (tests/test_claims_tables.py does the same for 01 and 04.)"""

import json
from types import SimpleNamespace

import pandas as pd
import pytest

from claims_shape import assert_ledger_reads_the_same, assert_one_shape

from lab.claims.gather import latest_reference_runs
from lab.workflow.run import params_from_namespace, results_root


def _params(cls, run_dir):
    return params_from_namespace(cls, json.loads((run_dir / "params.json").read_text())["parameters"])


def _table(run_dir, name):
    return pd.read_csv(run_dir / f"{name}.csv")


def spec_claims(run_dir, monkeypatch):
    from lab.studies.spec_acceptance import claims, SpecParams

    # the quantized copy's bandwidth bound counts the model's weights; the ledger reads none of it
    monkeypatch.setattr(claims, "quantized_c_bound", lambda p, model: 0.0)
    costs = {r.drafter: SimpleNamespace(c=None if pd.isna(r.c_forward) else r.c_forward)  # all the table reads
             for r in _table(run_dir, "step_costs").itertuples()}
    bench = _table(run_dir, "spec_bench") if (run_dir / "spec_bench.csv").exists() else None
    return claims.claims_table(_table(run_dir, "by_category"), costs, _params(SpecParams, run_dir), None, bench)


def structured_claims(run_dir, monkeypatch):
    from lab.memory import ModelShape
    from lab.studies.structured_output.measure import StructuredParams
    from lab.studies.structured_output.claims import claims_table

    p = _params(StructuredParams, run_dir)
    return claims_table(p, _table(run_dir, "validity"),
                        _table(run_dir, "mask_summary"), _table(run_dir, "mask_components"),
                        _table(run_dir, "nesting_depth"), _table(run_dir, "compile_times"),
                        _table(run_dir, "projection"), ModelShape.preset(p.MODEL).vocab_size)


def parallel_claims(run_dir, monkeypatch):
    from lab.studies.parallelism.measure import ParallelParams
    from lab.studies.parallelism.claims import claims_table

    return claims_table(_params(ParallelParams, run_dir), _table(run_dir, "tp_summary"), _table(run_dir, "projection"),
                        _table(run_dir, "bubble"), _table(run_dir, "projected_memory"))


def ttft_claims(run_dir, monkeypatch):
    from lab.studies.ttft_claims.measure import TTFTParams
    from lab.studies.ttft_claims.table import claims_table

    weights = json.loads((run_dir / "metrics.json").read_text())["weights_bytes"]
    return claims_table(_params(TTFTParams, run_dir), _table(run_dir, "prefill_flops"),
                        _table(run_dir, "first_token_ttft"), _table(run_dir, "int8_memory"),
                        _table(run_dir, "hit_rate_sweep"), _table(run_dir, "cold_start"),
                        _table(run_dir, "cold_start_raw"), weights)


def serving_claims(run_dir, monkeypatch):
    from lab.studies.serving.measure import ServingParams
    from lab.studies.serving.claims import claims_table

    p = _params(ServingParams, run_dir)
    op = json.loads((run_dir / "metrics.json").read_text())["operating_concurrency"]
    device = json.loads((run_dir / "params.json").read_text())["gpu"] or "cpu"
    from lab.studies.serving.claims import serving_rows, timestamp_row

    chunked, ramp = _table(run_dir, "chunked_prefill"), _table(run_dir, "ramp")
    rows = serving_rows(chunked, ramp[ramp["repeat"].notna()], p.KNEE_GAIN, f"{p.MODEL} on {device}", op,
                        (p.CHUNK_TOKENS, p.MAX_MODEL_LEN))
    return claims_table(_table(run_dir, "prefix_caching"), _table(run_dir, "length_shapes"), p.SYSTEM_PROMPT,
                        f"{p.MODEL} on {device}, {op} in flight", [timestamp_row(_table(run_dir, "dynamic_prefix"))] + rows)


@pytest.mark.parametrize("notebook, build", [("05_speculative_acceptance", spec_claims),
                                             ("06_serving_ttft", serving_claims),
                                             ("07_structured_output", structured_claims),
                                             ("08_parallelism", parallel_claims),
                                             ("09_ttft_claims", ttft_claims)])
def test_the_rebuilt_table_has_the_one_shape_and_gives_the_ledger_the_same_claims(notebook, build, tmp_path,
                                                                                  monkeypatch):
    run_dir = latest_reference_runs(results_root())[notebook]
    claims = build(run_dir, monkeypatch)
    assert_one_shape(claims)
    assert_ledger_reads_the_same(claims, notebook, run_dir, tmp_path)
