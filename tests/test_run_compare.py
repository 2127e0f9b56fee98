"""`lab.workflow.compare`: a quick run's verdicts against its notebook's latest finished reference run, by claim."""

import json

from lab.claims.table import claim_row
from lab.workflow.compare import against_reference, compare_verdicts, latest_reference


def write_run(root, notebook, run_id, preset, verdicts=None, failed=False):
    run = root / notebook / run_id
    run.mkdir(parents=True)
    (run / "params.json").write_text(json.dumps({"parameters": {"PRESET": preset}}))
    (run / "metrics.json").write_text(json.dumps({"status": "failed"} if failed else {"duration_s": 1.0}))
    if verdicts is not None:
        import pandas as pd

        pd.DataFrame([claim_row(c, "1", "1", v) for c, v in verdicts.items()]).to_csv(run / "claims.csv", index=False)
    return run


def test_verdicts_are_paired_by_claim(tmp_path):
    ref = write_run(tmp_path, "03_kv", "b", "reference", {"fp8 is safe": "not distinguishable", "int4 is not safe": "holds",
                                                         "error grows with context": "not distinguishable"})
    quick = write_run(tmp_path / "q", "03_kv", "c", "quick", {"fp8 is safe": "not distinguishable",
                                                              "error grows with context": "holds", "new": "wrong"})
    a = compare_verdicts(quick, ref)
    assert (a.agree, a.compared) == (1, 2) and a.differ == [("error grows with context", "holds", "not distinguishable")]
    assert a.only_here == ["new"] and a.only_reference == ["int4 is not safe"]
    text = a.summary()
    assert text.startswith("verdicts: 1 of 2 agree with reference run b") and "'error grows with context'" in text


def test_the_latest_finished_reference_run_is_the_one_compared(tmp_path):
    write_run(tmp_path, "01_mem", "a", "reference", {"x": "holds"})
    write_run(tmp_path, "01_mem", "b", "reference", {"x": "wrong"})
    write_run(tmp_path, "01_mem", "c", "reference", {"x": "holds"}, failed=True)
    write_run(tmp_path, "01_mem", "d", "quick", {"x": "holds"})
    assert latest_reference("01_mem", tmp_path).name == "b"
    quick = write_run(tmp_path / "q", "01_mem", "e", "quick", {"x": "holds"})
    assert against_reference(quick, tmp_path).startswith("verdicts: 0 of 1 agree with reference run b")
    assert against_reference(write_run(tmp_path / "q", "09_new", "e", "quick"), tmp_path) == \
        "verdicts: no reference run to compare with"
    write_run(tmp_path, "00_tour", "a", "reference")
    assert against_reference(write_run(tmp_path / "q", "00_tour", "e", "quick"), tmp_path) == \
        "verdicts: this notebook writes no claims table"
