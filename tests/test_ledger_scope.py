"""The ledger's scope rules (issue 40): a verdict says where it holds. One test per kind of claim, each checking
that the rule lets the evidence decide where it should and keeps the measured verdict apart where it should not,
and that the outcome can still go either way (a bound refutes a claim asking for more than it allows, and
allows one inside it)."""

from __future__ import annotations

import json

import pytest

from lab.claims.gather import resolve
from lab.claims.record import Claim, Link
from lab.claims.model_class import ModelClass
from lab.claims.rules import (ARITHMETIC, HOLDS, NOT_CHECKABLE, NOT_DISTINGUISHABLE, ON_CPU, ON_GPU, PHYSICS_BOUND,
                              PROJECTED, SCOPES, WRONG, Evidence, Range, beyond, scoped)
from lab.claims.setting import run_evidence, weights16


@pytest.mark.parametrize("measured", [HOLDS, WRONG, NOT_DISTINGUISHABLE])
def test_a_gpu_speed_claim_with_only_cpu_evidence_cannot_come_out_wrong(measured):
    assert scoped("gpu-speed", Evidence(ON_CPU), measured) == (NOT_CHECKABLE, measured)


@pytest.mark.parametrize("kind", [ON_GPU, PROJECTED])
@pytest.mark.parametrize("measured", [HOLDS, WRONG])
def test_a_gpu_speed_claim_is_decided_by_a_gpu_measurement_or_a_projection(kind, measured):
    assert scoped("gpu-speed", Evidence(kind), measured) == (measured, "")


def test_a_physics_bound_only_refutes_a_gpu_speed_claim():
    assert scoped("gpu-speed", Evidence(PHYSICS_BOUND), WRONG) == (WRONG, "")
    assert scoped("gpu-speed", Evidence(PHYSICS_BOUND), HOLDS) == (NOT_CHECKABLE, HOLDS)


def test_beyond_a_bound_both_ways():
    claim = Range("2", "2.5")
    assert not beyond(claim, "3.46")  # the bytes read allow 3.46x: 2-2.5x is possible
    assert beyond(claim, "1.8")       # at most 1.8x: 2-2.5x asks for more than physics allows
    assert not beyond(claim, "1.96")  # within half a unit of the claim's printed "2": not beyond it
    assert not beyond(Range(None, "3"), "1")  # a claim with no lower end asks for nothing a bound refuses


@pytest.mark.parametrize("w16, want", [(True, (WRONG, "")), (False, (NOT_CHECKABLE, WRONG)),
                                        (None, (NOT_CHECKABLE, WRONG))])
def test_a_weight_accuracy_claim_needs_16_bit_weights(w16, want):
    assert scoped("weight-accuracy", Evidence(ON_CPU, w16), WRONG) == want


@pytest.mark.parametrize("scope", ["arithmetic", "behaviour"])
@pytest.mark.parametrize("measured", [HOLDS, WRONG])
def test_arithmetic_and_behaviour_are_decided_here(scope, measured):
    assert scoped(scope, Evidence(ON_CPU), measured) == (measured, "")
    assert scoped(scope, Evidence(ARITHMETIC), measured) == (measured, "")


def test_undecided_verdicts_pass_through_every_scope():
    for scope in SCOPES:
        assert scoped(scope, Evidence(ON_CPU), NOT_CHECKABLE) == (NOT_CHECKABLE, "")


def test_the_embedded_model_is_not_16_bit_and_a_run_can_say_otherwise(tmp_path):
    assert weights16("smollm2-135m") is False
    assert weights16("random:smollm2-360m") is True
    assert weights16("/some/checkpoint") is None
    (tmp_path / "params.json").write_text(json.dumps({"gpu": None, "parameters": {"MODEL": "smollm2-135m"}}))
    assert run_evidence(tmp_path, ON_CPU) == Evidence(ON_CPU, False, ModelClass("under 1B", "dense"))
    (tmp_path / "metrics.json").write_text(json.dumps({"weights16": True}))  # notebook 02's detector said so
    assert run_evidence(tmp_path, ON_CPU) == Evidence(ON_CPU, True, ModelClass("under 1B", "dense"))
    (tmp_path / "params.json").write_text(json.dumps({"gpu": "H200", "parameters": {}}))
    assert run_evidence(tmp_path, ON_CPU).kind == ON_GPU


def _run(root, notebook, measured, gpu=None):
    run = root / notebook / "20260101T000000.000000Z-abcdef"
    run.mkdir(parents=True)
    (run / "params.json").write_text(json.dumps({"notebook": notebook, "run_id": run.name, "gpu": gpu,
                                                 "parameters": {"PRESET": "reference", "MODEL": "smollm2-135m"}}))
    (run / "claims.csv").write_text("claim,article,measured here,verdict,holds,note\n"
                                    f"int4 speedup,2-2.5x,\"{measured}\",wrong,False,\n")
    return {notebook: run}


@pytest.mark.parametrize("bound, verdict, in_setting", [("3.46", NOT_CHECKABLE, WRONG), ("1.80", WRONG, WRONG)])
def test_a_gathered_gpu_speed_row_says_what_its_bound_allows(tmp_path, bound, verdict, in_setting):
    runs = _run(tmp_path, "01_memory_accounting", f"1.70x measured; bytes read {bound}x")
    claim = Claim("003-99", "003", "§2.1", "INT4 decode is 2-2.5x faster", "2-2.5x",
                  link=Link("01_memory_accounting", "int4 speedup", bound=r"bytes read (?P<v>[\d.]+)x"),
                  rule=Range("2", "2.5"), about="an H100, 70B, batch 1", scope="gpu-speed")
    entry = resolve(claim, runs)
    assert (entry.verdict, entry.in_setting) == (verdict, in_setting)
    assert bound in entry.why
    assert entry.evidence == (PHYSICS_BOUND if verdict == WRONG else ON_CPU)
    assert "no GPU" in entry.lab_setting and "smollm2-135m (under 1B dense, weights already 4-bit)" in entry.lab_setting
    assert not entry.disagrees  # the notebook's own verdict is the one in this setting


def test_a_gathered_row_measured_on_a_gpu_stands(tmp_path):
    runs = _run(tmp_path, "01_memory_accounting", "1.70x measured; bytes read 3.46x", gpu="NVIDIA H200")
    claim = Claim("003-99", "003", "§2.1", "INT4 decode is 2-2.5x faster", "2-2.5x",
                  link=Link("01_memory_accounting", "int4 speedup"), rule=Range("2", "2.5"), about="a GPU",
                  scope="gpu-speed")
    entry = resolve(claim, runs)
    assert (entry.verdict, entry.in_setting, entry.evidence) == (WRONG, "", ON_GPU)
    assert "NVIDIA H200" in entry.lab_setting


def test_a_row_its_notebook_scoped_is_rescoped_by_the_ledger_not_taken_as_undecided(tmp_path):
    """Notebook 02 on an already-4-bit model writes "not checkable here" (and its measured verdict in the note);
    the ledger never reads a verdict from a note (issue 48): it recomputes the measured verdict by the claim's rule
    and applies its own scope rule, so the row agrees with its notebook and keeps "wrong" in this setting."""
    run = tmp_path / "02_quantization_accuracy" / "20260101T000000.000000Z-abcdef"
    run.mkdir(parents=True)
    (run / "params.json").write_text(json.dumps({"gpu": None, "parameters": {"MODEL": "smollm2-135m"}}))
    (run / "claims.csv").write_text("claim,article,measured here,verdict,holds,note\n"
                                    "ppl barely moves,+0.x,+14.5%,not checkable here,,"
                                    "the model is already 4-bit; in this setting: wrong\n")
    claim = Claim("003-98", "003", "§2.1", "perplexity barely moves", "+0.x",
                  link=Link("02_quantization_accuracy", "ppl barely moves"), rule=Range(None, "1"),
                  about="a 16-bit 70B quantized to 4 bits", scope="weight-accuracy")
    entry = resolve(claim, {"02_quantization_accuracy": run})
    assert (entry.verdict, entry.in_setting, entry.measured) == (NOT_CHECKABLE, WRONG, WRONG)
    assert not entry.disagrees and "the notebook says" not in entry.why
