"""Notebook 02's comparisons: paired intervals and the verdicts they give, on synthetic per-sequence scores."""

import numpy as np
import pandas as pd
import pytest

from lab.eval.scores import SequenceScores
from lab.quant.gguf_grids import QuantizedBaseline
from lab.studies.quant_accuracy import stats

N = 16


def _scores(model, domain, ppl, noise, seed):
    rng = np.random.default_rng(seed)
    predicted = np.full(N, 511.0)
    # Every sequence has its own difficulty (shared by all models); a model adds its own per-sequence noise.
    difficulty = np.random.default_rng(0).normal(0, 0.3, N)
    nll = predicted * (np.log(ppl) + difficulty + rng.normal(0, noise, N))
    kl = predicted * max(np.log(ppl / 8.0), 0) * (1 + rng.normal(0, 0.05, N))
    s = SequenceScores(nll, predicted, np.abs(kl), predicted * 0.8, predicted + 1)
    return s.rows(model=model, domain=domain)


def _outputs(passed):
    return pd.DataFrame({"category": ["numbers"] * len(passed), "id": [str(i) for i in range(len(passed))],
                         "passed": passed, "output": ["x"] * len(passed)})


@pytest.fixture
def study():
    # gptq 2% above awq with small noise (distinguishable), rtn far above; prose: gptq and awq equal.
    ppl = {"unquantized": 8.0, "rtn w4g64": 10.0, "gptq w4g64": 9.18, "awq w4g64": 9.0}
    rows = []
    for i, (model, p) in enumerate(ppl.items()):
        rows += _scores(model, "code", p, 0.002, i)
        rows += _scores(model, "prose", 9.0 if model in ("gptq w4g64", "awq w4g64") else p, 0.05, 10 + i)
    scores = pd.DataFrame(rows)
    grid = pd.DataFrame({"model": list(ppl), "method": ["unquantized", "rtn", "gptq", "awq"],
                         "config": ["fp32"] + ["w4g64"] * 3, "pass_all": [0.5] * 4, "pass_numbers": [0.5] * 4,
                         "same_output_all": [1.0, 0.1, 0.1, 0.1], "same_output_numbers": [1.0, 0.1, 0.1, 0.1]})
    n = 60
    ref = [i < 30 for i in range(n)]
    outputs = {"unquantized": _outputs(ref), "rtn w4g64": _outputs([i < 10 for i in range(n)]),
               "gptq w4g64": _outputs([i < 29 for i in range(n)]), "awq w4g64": _outputs([i < 30 for i in range(n)])}
    return grid, scores, outputs


def test_recovery_is_paired_and_says_whether_distinguishable(study):
    grid, scores, outputs = study
    rec = stats.recovery_table(grid, scores, outputs).set_index(["method", "domain"])
    assert rec.loc[("gptq", "code"), "perplexity_vs_rtn"] == "distinguishable"
    assert rec.loc[("gptq", "code"), "perplexity_over_rtn"] == pytest.approx(0.918, rel=1e-3)
    r = rec.loc[("awq", "code")]
    assert r["perplexity_recovered_low"] <= r["perplexity_recovered"] <= r["perplexity_recovered_high"]
    assert r["perplexity_recovered"] == pytest.approx(0.5, abs=0.01)
    assert rec.loc[("awq", "code"), "sensitive_vs_rtn"] == "distinguishable"  # 30 of 60 against 10 of 60


def test_claims_hold_fail_or_cannot_tell(study):
    grid, scores, outputs = study
    sens = stats.sensitive_vs_perplexity(grid, scores, outputs)
    rec = stats.recovery_table(grid, scores, outputs)
    weights16 = QuantizedBaseline(False, None, 120, 32, 31.9)  # continuous weights: the intervals decide
    claims = stats.claims_table(sens, rec, grid, scores, outputs, "w4g64", baseline=weights16).set_index("claim")
    verdict = {c.split(" (")[0].split(":")[0] + (" prose" if "prose" in c else ""): v
               for c, v in claims["verdict"].items() if "task metrics" not in c}
    assert verdict["perplexity barely moves under 4-bit weight quantization"] == "wrong"  # +12.5%
    assert verdict["GPTQ is slightly better than AWQ in perplexity"] == "wrong"  # 2% above, tight
    assert verdict["GPTQ is slightly better than AWQ in perplexity prose"] == "not distinguishable"  # equal
    drops = claims[claims.index.str.startswith("task metrics drop")]["verdict"].to_dict()
    assert drops["task metrics drop under quantization: sensitive pass rate, rtn w4g64"] == "holds"  # 30 -> 10
    assert drops["task metrics drop under quantization: sensitive pass rate, gptq w4g64"] == "not distinguishable"
    assert drops["task metrics drop under quantization: sensitive pass rate, awq w4g64"] == "wrong"  # identical
    assert set(claims["holds"].map(repr)) <= {"True", "False", "None"}
    already = QuantizedBaseline(True, 4, 120, 16, 12.5)
    four_bit = stats.claims_table(sens, rec, grid, scores, outputs, "w4g64", baseline=already)
    assert list(four_bit["claim"]) == list(claims.index)  # the claim cells stay as they were: the ledger links by them
    assert set(four_bit["verdict"]) == {"not checkable here"} and four_bit["holds"].isna().all()
    in_setting = four_bit.set_index("claim")["note"].str.rsplit("in this setting: ", n=1).str[1]
    assert in_setting.to_dict() == claims["verdict"].to_dict()  # each keeps the verdict the intervals gave


def test_preservation_names_the_closest_method_per_configuration(study):
    grid, scores, outputs = study
    sens = stats.sensitive_vs_perplexity(grid, scores, outputs)
    grid = grid.assign(code_kl_mean=[0.0, 0.2, 0.1, 0.05], prose_kl_mean=[0.0, 0.2, 0.1, 0.05])
    for col in ("code_kl_mean", "prose_kl_mean"):
        grid = grid.assign(**{f"{col}_low": grid[col] * 0.9, f"{col}_high": grid[col] * 1.1})
    line, = stats.preservation_lines(grid, sens, scores)
    assert line.startswith("w4g64: awq w4g64 preserves it best (code KL 0.0500 (0.0450-0.0550), perplexity +12.5%")
    assert "KL minus gptq w4g64's: code" in line and "distinguishable" in line


def test_calibration_composition_counts_the_tokens_calibrated_on(smollm):
    from lab.quant.pipeline import QuantJob, _calibration
    from lab.studies.quant_accuracy.measure import calibration_domains

    _, tok = smollm
    packed = QuantJob(model="smollm2-135m", method="gptq", bits=4, group_size=64, calib_samples=4, calib_tokens=64,
                      calib_packed=True)
    ids, tasks = _calibration(tok, packed)
    assert sum(tasks.values()) == sum(map(len, ids)) == 4 * 64
    # Short questions are those within an eighth of calib_tokens: 64 tokens fits the lab's own chat prompts, so
    # the pool is not empty when Spec-Bench is absent.
    loose = QuantJob(model="smollm2-135m", method="gptq", bits=4, group_size=64, calib_samples=8, calib_tokens=512,
                     calib_packed=False, calib_mix="short_qa")
    ids, tasks = _calibration(tok, loose)
    assert sum(tasks.values()) == sum(map(len, ids)) and "code" not in tasks
    shares = calibration_domains(tasks)
    assert shares["code"] == 0 and shares["chat"] == pytest.approx(1.0)  # short Q&A: chat and docs questions


def test_verdicts_say_there_is_nothing_to_recover_where_rtn_loses_nothing(study):
    # An 8-bit grid: RTN's perplexity equals the unquantized model's, so the share recovered is a ratio over
    # zero; the text says so instead of printing "nan%" with an interval of thousands of percent.
    grid, scores, outputs = study
    same = scores[scores["model"] == "unquantized"].assign(model="rtn w4g64")
    scores = pd.concat([scores[scores["model"] != "rtn w4g64"], same], ignore_index=True)
    rec = stats.recovery_table(grid, scores, outputs)
    sens = stats.sensitive_vs_perplexity(grid, scores, outputs)
    lines = stats.verdict_lines(rec, sens, None)
    assert not any("nan" in line for line in lines)
    assert all("RTN's perplexity loss is not distinguishable from zero" in line for line in lines[:len(rec)])
    lost = stats.verdict_lines(stats.recovery_table(*study), sens, None)
    assert all("of RTN's perplexity loss" in line and "recovers" in line for line in lost[:len(rec)])
