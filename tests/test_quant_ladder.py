"""Issue 39's control and loss decomposition: the GGUF grids as `lab.quant` methods, the ladder of quantizers from
Q4_1 to 2 bits (its weight errors on the embedded model are the issue's numbers), the detection written as metrics,
the decomposition of a model's perplexity change, and the claims that an already-4-bit model cannot decide."""

import copy

import numpy as np
import pandas as pd
import pytest
import torch

from lab.models import load_model
from lab.quant.gguf_grids import QuantizedBaseline, already_quantized, fake_quantize_gguf
from lab.quant.ladder import apply_rung, ladder, minmax_fake_quantize, quantizer_errors
from lab.quant.pipeline import QuantJob, checkpoint_format, gguf_spec, quantize_model
from lab.quant.rtn import QuantSpec, fake_quantize
from lab.studies.quant_accuracy import ladder as study

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    return load_model("random:tiny", dtype=torch.float32, device="cpu")[0]


def test_the_ladder_reproduces_the_issues_weight_errors_on_the_embedded_model(smollm):
    """Q4_1 and a float32 min-max grid at g32 give the weights back exactly; an integer zero point costs 8.23% of the
    weight norm (RTN w4g32 the same: every block already straddles 0, so widening changes nothing), g64 9.37%,
    g128 10.40%; a float offset over g64, two of the model's blocks, 8.02%."""
    model, _ = smollm
    errors = {r.name: study._pooled(*quantizer_errors(model, r.quantize)).value for r in ladder(bits=())}
    assert errors["q4_1"] == 0 and errors["float-offset w4g32"] == 0
    assert errors["int-zero w4g32"] == errors["rtn w4g32"] == pytest.approx(8.23, abs=0.005)
    assert errors["rtn w4g64"] == pytest.approx(9.37, abs=0.005)
    assert errors["rtn w4g128"] == pytest.approx(10.40, abs=0.005)
    variants = study.grid_variants(model, layers=(0, 1)).set_index(["zero point", "group_size"])
    assert variants.loc[("float offset", 32), "weight_error_%"] == 0
    float64 = study._pooled(*quantizer_errors(model, lambda w: minmax_fake_quantize(w, 4, 64, "float")))
    assert float64.value == pytest.approx(8.02, abs=0.005) and float64.low <= float64.value <= float64.high


def test_rungs_differ_one_change_at_a_time():
    w = torch.randn(4, 64, generator=torch.Generator().manual_seed(1))
    w[0] = w[0].abs() + 0.5  # a row all of one sign: RTN widens its range to include 0, the integer grid does not
    integer, widened = minmax_fake_quantize(w, 4, 32, "integer"), fake_quantize(w, QuantSpec(4, 32))
    assert torch.equal(integer[1:], widened[1:]) and not torch.equal(integer[0], widened[0])
    assert (integer[0] - w[0]).norm() < (widened[0] - w[0]).norm()
    on_grid = 0.01 * torch.randint(0, 16, (4, 64)).float() - 0.07  # every group holds codes 0 and 15
    on_grid[:, ::32], on_grid[:, 1::32] = -0.07, 0.08
    assert torch.allclose(minmax_fake_quantize(on_grid, 4, 32, "float"), on_grid, atol=1e-7)
    names = [r.name for r in ladder((64,), (3, 2))]
    assert names == ["q4_1", "float-offset w4g32", "int-zero w4g32", "rtn w4g32", "rtn w4g64", "rtn w3g64",
                     "rtn w2g64"]
    with pytest.raises(ValueError, match="zero="):
        minmax_fake_quantize(w, 4, 32, "half")


def test_gguf_grids_are_methods_of_the_pipeline(tiny):
    assert gguf_spec("gguf-q4_1") == QuantSpec(4, 32) and gguf_spec("gguf-q8_0") == QuantSpec(8, 32)
    assert gguf_spec("rtn") is None
    model = copy.deepcopy(tiny)
    job = QuantJob(model="random:tiny", method="gguf-q4_0", bits=4, group_size=32)
    codes, summary = quantize_model(job, model, None, progress=False)
    assert summary["calibration_tokens"] == 0 and len(codes) == 4 * len(model.layers)
    w = tiny.layers[0].mlp.down_proj.weight
    assert torch.equal(model.layers[0].mlp.down_proj.weight, fake_quantize_gguf(w, "q4_0"))
    with pytest.raises(ValueError, match="blocks of 32"):
        QuantJob(method="gguf-q4_1", bits=4, group_size=64)
    with pytest.raises(ValueError, match="cannot store a GGUF grid"):
        checkpoint_format(job)


def test_detection_becomes_metrics_both_ways(smollm, tiny):
    """The embedded model is found already 4-bit (weights16 False); random continuous weights are not (True)."""
    found = study.baseline_metrics(already_quantized(smollm[0]))
    assert found["weights16"] is False and found["baseline_bits"] == 4
    assert found["baseline_max_distinct_per_block"] <= 16
    fresh = study.baseline_metrics(already_quantized(tiny))
    assert fresh["weights16"] is True and fresh["baseline_bits"] is None
    assert fresh["baseline_max_distinct_per_block"] == 32


def test_weight_error_pools_over_layers_and_refuses_rescaled_models(tiny):
    model = copy.deepcopy(tiny)
    rung = ladder(bits=())[3]  # RTN w4g32
    apply_rung(model, rung, layers=(1,))
    err = study.weight_error(tiny, model, layers=(1,))
    want = study._pooled(*quantizer_errors(tiny, rung.quantize, layers=(1,)))
    assert err.value == pytest.approx(want.value) and err.value > 0
    assert study.weight_error(tiny, model, layers=(0,)).value == 0  # layer 0 left as it was
    with torch.no_grad():
        model.layers[0].input_layernorm.weight.mul_(2)  # as AWQ folds its scales into the norms
    assert study.weight_error(tiny, model) is None


def _scores(model: str, ppl: float, n: int = 8) -> list[dict]:
    difficulty = np.random.default_rng(0).normal(0, 0.3, n)
    nll = 63 * (np.log(ppl) + difficulty)
    return [{"model": model, "domain": "code", "sequence": i, "nll": nll[i], "predicted": 63.0, "kl": 0.0,
             "top1": 60.0, "positions": 64.0} for i in range(n)]


def test_decomposition_multiplies_to_the_whole_and_ladder_steps_chain():
    ppl = {"unquantized": 10.0, "rtn w4g64": 11.0, "rtn w3g64": 13.2, "awq w3g32": 12.0, "gguf-q4_1 w4g32": 10.0}
    scores = pd.DataFrame([row for m, p in ppl.items() for row in _scores(m, p)])
    grid = pd.DataFrame({"model": list(ppl), "method": ["unquantized", "rtn", "rtn", "awq", "gguf-q4_1"],
                         "bits": [32, 4, 3, 3, 4], "group_size": [None, 64, 64, 32, 32],
                         "weight_error_%": [0.0, 9.0, 20.0, np.nan, 0.0]})
    d = study.decomposition(grid, scores, ("code",)).set_index("model")
    assert d.loc["gguf-q4_1 w4g32", "code_total_%"] == 0 and d.loc["gguf-q4_1 w4g32", "code_grid_%"] == 0
    r = d.loc["rtn w3g64"]
    assert r["code_grid_%"] == pytest.approx(10) and r["code_levels_%"] == pytest.approx(20)
    assert (1 + r["code_grid_%"] / 100) * (1 + r["code_levels_%"] / 100) == pytest.approx(1 + r["code_total_%"] / 100)
    assert r["weight_error_%"] == 20 and r["weight_error_4bit_%"] == 9
    assert np.isnan(d.loc["awq w3g32", "code_levels_%"]) and "not split" in d.loc["awq w3g32", "split"]
    assert np.isnan(d.loc["rtn w4g64", "code_levels_%"])
    rungs = pd.DataFrame({"rung": ["rtn w4g64", "rtn w3g64"], "weight_error_%": [9.0, 20.0]})
    steps = study.ladder_table(rungs, scores, ("code",)).set_index("rung")
    assert steps.loc["rtn w4g64", "code_step_%"] == pytest.approx(10)  # the first rung's step: from unquantized
    assert steps.loc["rtn w3g64", "code_step_%"] == pytest.approx(20)
    assert steps.loc["rtn w3g64", "code_ppl_change_%"] == pytest.approx(32)


def test_ladder_and_decomposition_figures_draw(tmp_path):
    from lab.studies.quant_accuracy.plots import plot_decomposition, plot_ladder

    steps = pd.DataFrame({"rung": ["q4_1", "rtn w4g32"], "weight_error_%": [0.0, 8.2], "weight_error_%_low": [0.0, 8.0],
                          "weight_error_%_high": [0.0, 8.4], "code_ppl_change_%": [0.0, 25.0],
                          "code_ppl_change_%_low": [0.0, 20.0], "code_ppl_change_%_high": [0.0, 30.0]})
    plot_ladder(steps, ("code",)).savefig(tmp_path / "ladder.png")
    decomp = pd.DataFrame({"model": ["gguf-q4_1 w4g32", "rtn w3g64"], "code_grid_%": [0.0, 10.0],
                           "code_grid_%_low": [0.0, 8.0], "code_grid_%_high": [0.0, 12.0],
                           "code_levels_%": [np.nan, 20.0], "code_levels_%_low": [np.nan, 15.0],
                           "code_levels_%_high": [np.nan, 25.0]})
    plot_decomposition(decomp, ("code",)).savefig(tmp_path / "decomposition.png")


def test_claims_are_not_checkable_on_an_already_quantized_baseline():
    from lab.claims.table import claim_row
    from lab.studies.quant_accuracy.stats import in_scope

    row = claim_row("perplexity barely moves under 4-bit weight quantization (w4g64, best method: awq w4g64)",
                    "+0.x% (under 1%)", "code +14.5% (+12.1 to +17.6)", "wrong")
    four = QuantizedBaseline(True, 4, 120, 16, 12.5)
    sixteen = QuantizedBaseline(False, None, 120, 32, 31.9)
    assert in_scope(row, sixteen) == row  # 16-bit weights: the intervals decide, as before
    out = in_scope(row, four)
    assert out["claim"] == row["claim"] and out["measured here"] == row["measured here"]
    assert out["verdict"] == "not checkable here" and out["holds"] is None
    assert "already 4-bit" in out["note"] and "MODEL parameter" in out["note"]
    assert out["note"].endswith("in this setting: wrong")
    assert in_scope(row, None)["verdict"] == "not checkable here"  # weights not examined: not evidence about 16 bits


def test_the_ladder_scores_each_rung_and_reuses_only_identical_weights(smollm):
    """On the Q4_1 model the first two rungs are the reference itself (KL exactly 0) and RTN w4g32 lands on the
    integer-zero rung's weights (scores reused); the reused scores are what scoring RTN afresh gives."""
    from lab.eval.scores import score_sequences

    model, tok = smollm
    texts = {"code": [tok.encode("def add(a, b):\n    return a + b\n")]}
    rungs, scores = study.run_ladder(model, texts, groups=(), bits=(), layers=(0,), log=lambda _: None)
    assert list(rungs["rung"]) == ["q4_1", "float-offset w4g32", "int-zero w4g32", "rtn w4g32"]
    by = scores.set_index("model")
    assert by.loc["q4_1", "kl"] == by.loc["float-offset w4g32", "kl"] == 0
    assert by.loc["int-zero w4g32", "kl"] > 0 and by.loc["rtn w4g32", "nll"] == by.loc["int-zero w4g32", "nll"]
    fresh = copy.deepcopy(model)
    apply_rung(fresh, ladder(bits=())[3], layers=(0,))
    assert score_sequences(model, fresh, texts["code"]).nll[0] == by.loc["rtn w4g32", "nll"]


def test_the_grid_runs_the_control_as_the_reference_and_that_is_what_running_it_gives(smollm, monkeypatch):
    """On the Q4_1 model the gguf-q4_1 control lands on the reference's weights bit for bit, so `run_grid` neither
    generates its sensitive outputs again nor runs its forwards; what it reuses is what running the control gives."""
    from lab.eval import harness
    from lab.eval.scores import score_sequences
    from lab.studies.quant_accuracy import measure

    model, tok = smollm
    p = measure.QuantAccuracyParams(METHODS=("gguf-q4_1",), DOMAINS=("code",), HELDOUT_SEQUENCES=2, HELDOUT_TOKENS=24,
                                    MAX_TOKENS=4, ITEMS_PER_CATEGORY=1, LONG_CONTEXT_ITEMS=0, QUANT_LAYERS=(0,))
    generated = []
    run_sensitive = harness.run_sensitive
    monkeypatch.setattr(measure, "run_sensitive", lambda m, *a, **k: generated.append(m) or run_sensitive(m, *a, **k))
    grid = measure.run_grid(p, model, tok, log=lambda _: None)
    assert generated == [model]  # the reference's run only
    control, *_ = measure.quantize_copy(model, tok, measure.make_job(p, "gguf-q4_1", measure.parse_config("w4g32"),
                                                                       p.AWQ_CALIB))
    fresh = run_sensitive(control, tok, measure.sensitive_items(p, long_context=False), p.MAX_TOKENS)
    pd.testing.assert_frame_equal(grid.outputs["gguf-q4_1 w4g32"], fresh)
    seqs = measure.heldout(p, tok)["code"]
    kept = grid.scores[grid.scores["model"] == "gguf-q4_1 w4g32"]
    assert list(kept["nll"]) == list(score_sequences(model, control, seqs).nll) and (kept["kl"] == 0).all()
