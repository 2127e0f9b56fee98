"""`lab.workflow.compare`: a quick run's verdicts against its notebook's latest finished reference run, by claim."""

import json

from lab.claims.table import claim_row
from lab.workflow.compare import against_reference, compare_verdicts, latest_reference


def write_run(root, notebook, run_id, preset, verdicts=None, failed=False, **provenance):
    run = root / notebook / run_id
    run.mkdir(parents=True)
    (run / "params.json").write_text(json.dumps({"parameters": {"PRESET": preset}, **provenance}))
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


XEON = "Intel(R) Xeon(R) Processor"
AMX = {"family": "6", "model": "167", "matrix_flags": ["amx_bf16", "avx512_bf16"]}
NO_AMX = {"family": "6", "model": "207", "matrix_flags": ["avx512_bf16"]}


def test_a_run_on_another_model_or_cpu_says_so_before_its_verdicts(tmp_path):
    """Two Xeons this project ran on both call themselves "Intel(R) Xeon(R) Processor"; one has AMX, and its bf16
    matmuls are 9x the other's: where both runs record the CPU's signature, that tells them apart."""
    def quick(name, **provenance):
        return against_reference(write_run(tmp_path / name, "05_spec", "q", "quick", {"x": "holds"}, **provenance),
                                 tmp_path)

    write_run(tmp_path, "05_spec", "r", "reference", {"x": "holds"}, cpu=XEON, cpu_signature=NO_AMX)
    assert quick("same", cpu=XEON, cpu_signature=NO_AMX).splitlines() == ["verdicts: 1 of 1 agree with reference run r"]
    lines = quick("amx", cpu=XEON, cpu_signature=AMX).splitlines()
    assert lines[0].startswith("verdicts: 1 of 1 agree")
    assert lines[1] == (f"    on another CPU than the reference run's ({XEON} (family 6 model 167; amx_bf16 avx512_bf16), "
                        f"not {XEON} (family 6 model 207; avx512_bf16)): a verdict may differ for that reason alone")
    # a run without a signature (older than it) is compared by name alone
    assert quick("old", cpu=XEON).splitlines() == ["verdicts: 1 of 1 agree with reference run r"]
    assert quick("epyc", cpu="AMD EPYC").splitlines()[1].startswith(
        f"    on another CPU than the reference run's (AMD EPYC, not {XEON})")
    # a reference run older than the MODEL parameter ran the embedded model, but does not say so
    write_run(tmp_path, "06_ttft", "r", "reference", {"x": "holds"})
    run = write_run(tmp_path / "m", "06_ttft", "q", "quick", {"x": "holds"})
    (run / "params.json").write_text(json.dumps({"parameters": {"PRESET": "quick", "MODEL": "smollm2-135m"}}))
    assert against_reference(run, tmp_path).splitlines()[1] == (
        "    the reference run records no MODEL (it predates the parameter; this run's is smollm2-135m): a verdict may "
        "differ for that reason alone")

