"""The acceptance study's parts: task prompts (the lab's set and Spec-Bench's format), the by-position and
per-run forms of the speedup model, step costs timed on the engine, the per-category summary on a synthetic
run, and `lab spec`."""

import json
import math
from types import SimpleNamespace

import pandas as pd
import pytest

from lab.quant.calibration import SPEC_BENCH_PATH
from lab.speculative.measure import StepCosts
from lab.speculative.prompts import LAB_PROMPTS, MULTI_TURN, load_prompts
from lab.speculative.theory import expected_tokens_by_position, expected_tokens_per_round, predicted_run_speedup
from lab.stats.intervals import Interval
from lab.workflow.run import ModelRefused
from lab.studies.spec_acceptance import SpecParams, policy_table, summarize
from lab.studies.spec_acceptance.claims import CUT_OFF, _cut_off_row, break_even, claims_table, range_verdict
from lab.studies.spec_acceptance.intervals import drafter_comparison

from claims_shape import assert_links_find_one_row, assert_one_shape


def test_lab_prompt_set_covers_the_articles_categories():
    prompts = load_prompts()
    cats = {p.category for p in prompts}
    assert cats == {"code", "rewriting", "translation", "summarization", "open-ended"}
    assert len({p.id for p in prompts}) == len(prompts)
    assert [p.category for p in load_prompts(LAB_PROMPTS, 1)] == ["code", "rewriting", "translation",
                                                                  "summarization", "open-ended"]


def test_spec_bench_format_is_read_and_mt_bench_grouped(tmp_path):
    f = tmp_path / "q.jsonl"
    f.write_text("\n".join(json.dumps(r) for r in [
        {"question_id": 1, "category": "writing", "turns": ["Write a haiku.", "Now another."]},
        {"question_id": 2, "category": "coding", "turns": ["Sort a list."]},
        {"question_id": 3, "category": "rag", "turns": ["Given the passage, answer."]},
        {"question_id": 4, "category": "rag", "turns": ["Second."]}]) + "\n")
    prompts = load_prompts(f, per_category=1)
    assert [(p.id, p.category, p.text) for p in prompts] == [
        ("spec_bench:1", MULTI_TURN, "Write a haiku."), ("spec_bench:3", "retrieval-augmented generation",
                                                        "Given the passage, answer.")]


@pytest.mark.skipif(not SPEC_BENCH_PATH.is_file(), reason="Spec-Bench's question.jsonl is not in ../shared/data")
def test_the_real_spec_bench_file_has_six_categories():
    prompts = load_prompts(SPEC_BENCH_PATH)
    assert len(prompts) == 480 and len({p.category for p in prompts}) == 6


def test_bad_prompt_files_are_refused_by_line(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.jsonl does not exist"):
        load_prompts(tmp_path / "nope.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "category": "x", "prompt": "p"}\n{"text": "no"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2: a record needs .* got keys \['text'\]"):
        load_prompts(bad)
    bad.write_text('{"question_id": 1, "category": "poetry", "turns": []}\n')
    with pytest.raises(ValueError, match="bad.jsonl:1: turns must be a non-empty list of strings"):
        load_prompts(bad)
    bad.write_text("not json\n")
    with pytest.raises(ValueError, match="bad.jsonl:1: not JSON"):
        load_prompts(bad)


def test_spec_bench_format_keeps_a_users_own_categories(tmp_path):
    own = tmp_path / "own.jsonl"
    own.write_text('{"question_id": 7, "category": "poetry", "turns": ["Write a haiku.", "Another."]}\n'
                   '{"question_id": 8, "category": "rag", "turns": ["Q"]}\n')
    assert [(p.category, p.text) for p in load_prompts(own)] == [("poetry", "Write a haiku."),
                                                                  ("retrieval-augmented generation", "Q")]


def test_expected_tokens_by_position():
    assert expected_tokens_by_position([0.5] * 4, 4) == pytest.approx(expected_tokens_per_round(0.5, 4))
    assert expected_tokens_by_position([1.0, 0.5, 0.0], 3) == pytest.approx(1 + 1 + 0.5)
    assert expected_tokens_by_position([0.9], 3) == pytest.approx(1.9)  # never-reached positions count as rejected


def test_predicted_run_speedup_counts_plain_steps_and_short_rounds():
    # Two rounds of 2 drafts at a = 1 (3 tokens each, cost 2c + 1), one plain step (1 token, cost 1).
    got = predicted_run_speedup([2, 2], 1, 0.25, lambda d: expected_tokens_per_round(1.0, d))
    assert got == pytest.approx((3 + 3 + 1) / (1.5 + 1.5 + 1))
    got = predicted_run_speedup([1], 0, 0.0, lambda d: expected_tokens_per_round(0.5, d), lambda d: 2.0)
    assert got == pytest.approx(1.5 / 2)


def test_step_costs_on_the_engine(smollm):
    from lab.engine import LLM
    from lab.speculative import SpeculativeConfig
    from lab.speculative.measure import step_costs

    model, tok = smollm
    llm = LLM(model, tokenizer=tok, num_kv_blocks=32, max_model_len=256,
              speculative=SpeculativeConfig(method="layerskip", draft_layers=3))
    costs = step_costs(llm, 40, [1, 3], repeats=1)
    assert costs.target_step_s > 0 and set(costs.verify_s) == {1, 3} and costs.v(0) == 1.0
    assert 0 < costs.c < 1.5  # 3 of 30 layers: a fraction of a target step plus the fixed part
    assert llm.block_manager.num_used_blocks == 0 and llm.extensions["speculative"].drafter.block_manager.num_used_blocks == 0
    with pytest.raises(ValueError, match="blocks; 32 are free"):
        with llm.forward_probe(600, 1):
            pass


def _run(outputs, decode_s, drafted, accepted, draft_s=0.0):
    return pd.DataFrame([{"id": str(i), "category": "code", "output": o, "decode_tokens": len(o) - 1,
                          "decode_s": t, "draft_s": draft_s, "drafted_per_round": d, "accepted_per_round": a}
                         for i, (o, t, d, a) in enumerate(zip(outputs, decode_s, drafted, accepted))])


def test_summary_of_a_synthetic_run():
    """Two requests of 9 decode tokens each: the plain run took 0.9 s each (0.1 s a token); the speculative one
    0.5 s each, with rounds (2 drafts, 2 accepted), (2, 0), (2, 1) and 3 plain steps: 3 + 1 + 2 + 3 = 9."""
    out = [list(range(10)), list(range(10, 20))]
    plain = _run(out, [0.9, 0.9], [[], []], [[], []])
    spec = _run(out, [0.5, 0.5], [[2, 2, 2]] * 2, [[2, 0, 1]] * 2, draft_s=0.06)
    costs = StepCosts(context=10, target_step_s=0.1, verify_s={1: 0.1, 2: 0.15}, draft_step_s=None)
    row = summarize("ngram", 2, spec, plain, costs).iloc[0]
    assert row["lossless"] and row["rounds"] == 6 and row["plain_steps"] == 6
    # position 1: verified 6 times, accepted 4; position 2: verified 4 times (after an acceptance), accepted 2
    assert row["a"] == pytest.approx(6 / 10) and row["acceptance_by_position"] == [pytest.approx(4 / 6, abs=1e-4),
                                                                                    pytest.approx(0.5)]
    assert row["accepted/drafted (vLLM)"] == pytest.approx(6 / 12)
    assert row["mean_accepted_tokens_per_step"] == pytest.approx(1 + 6 / 6)
    assert row["measured_speedup"] == pytest.approx(1.8)
    assert row["c_effective"] == pytest.approx(0.12 / 12 / 0.1)
    e = expected_tokens_per_round(0.6, 2)
    assert row["predicted_article"] == pytest.approx((6 * e + 6) / (6 * (2 * 0.1 + 1) + 6))
    assert row["v(k)"] == pytest.approx(1.5)  # overhead 0: the verification's forward over a plain step
    assert row["predicted_measured_costs"] == pytest.approx((6 * e + 6) / (6 * (2 * 0.1 + 1.5) + 6))
    bad = spec.copy()
    bad.at[0, "output"] = list(range(1, 11))
    assert not summarize("ngram", 2, bad, plain, costs).iloc[0]["lossless"]
    policy = policy_table(summarize("ngram", 2, spec, plain, costs), threshold=0.65)
    assert not policy.iloc[0]["speculate (a >= threshold)"] and policy.iloc[0]["speedup with the switch"] == 1.0


def _varied_run():
    """Three prompts whose acceptance and times differ, so the intervals over prompts have width."""
    out = [list(range(10)), list(range(10, 20)), list(range(20, 30))]
    plain = _run(out, [0.9, 0.9, 1.0], [[]] * 3, [[]] * 3)
    spec = _run(out, [0.5, 0.6, 0.4], [[2, 2, 2], [2, 2, 2], [2, 2]], [[2, 0, 1], [0, 0, 1], [2, 2]], draft_s=0.06)
    return plain, spec, StepCosts(context=10, target_step_s=0.1, verify_s={1: 0.1, 2: 0.15}, draft_step_s=None)


def test_every_measured_figure_has_an_interval_over_prompts_that_brackets_it():
    plain, spec, costs = _varied_run()
    row = summarize("ngram", 2, spec, plain, costs).iloc[0]
    for name in ("a", "accepted/drafted (vLLM)", "mean_accepted_tokens_per_step", "c_effective", "measured_speedup",
                 "error_article", "error_measured_costs"):
        assert row[f"{name}_low"] <= row[name] <= row[f"{name}_high"], name
        assert row[f"{name}_low"] < row[f"{name}_high"], name  # three different prompts: a real interval
    for v, lo, hi in zip(row["acceptance_by_position"], row["acceptance_by_position_low"],
                         row["acceptance_by_position_high"]):
        assert lo <= v <= hi
    # every prompt ran faster (1.5x to 2.5x): the paired speedup's interval excludes 1
    assert row["measured_speedup_low"] >= 1.5 and row["speedup_vs_plain"] == "distinguishable"
    assert row["error_measured_costs_vs_10pct"] == "outside 10%"  # predicted 1.1x against 1.5-2.5x
    one = summarize("ngram", 2, spec.iloc[:1], plain.iloc[:1], costs).iloc[0]  # no spread to resample
    assert one["a_low"] != one["a_low"] and one["speedup_vs_plain"] == "single prompt"


def test_a_range_check_refuses_a_value_far_below_and_an_interval_across_an_end_is_not_distinguishable():
    assert range_verdict(Interval(0.001, 0.0008, 0.0012), 0.03, 0.1) == "below"  # was "within": only c <= 0.1
    assert range_verdict(Interval(0.05, 0.04, 0.06), 0.03, 0.1) == "inside"
    assert range_verdict(Interval(0.09, 0.07, 0.12), 0.03, 0.1) == "not distinguishable"
    assert range_verdict(Interval(0.75, 0.6, 0.9), 0.7, None) == "not distinguishable"
    assert range_verdict(Interval(1.3, 1.2, 1.4), None, 0.5) == "above"


def test_the_claims_table_says_wrong_for_c_far_below_the_range_and_not_distinguishable_across_it():
    plain, spec, costs = _varied_run()
    spec["draft_s"] = [0.0002, 0.0002, 0.0002]
    c_row = _c_claim(summarize("ngram", 2, spec, plain, costs), costs)
    assert c_row["verdict"] == "wrong" and c_row["holds"] is False and c_row["note"].startswith("far below")
    assert c_row["measured here"].startswith("c_effective = 0.000")  # "v [low, high]" for the ledger
    spec["draft_s"] = [0.01, 0.08, 0.005]  # per-token c from 0.01 to 0.4: straddles 0.1
    c_row = _c_claim(summarize("ngram", 2, spec, plain, costs), costs)
    assert c_row["verdict"] == "not distinguishable" and c_row["holds"] is None


def _c_claim(main, costs):
    claims = claims_table(main, {"ngram": costs}, SpecParams(), model=None)
    assert_one_shape(claims)
    return claims[claims["claim"].str.startswith("draft cost ratio c")].iloc[0]


def test_the_claims_table_has_one_shape_and_keeps_the_rows_the_ledger_links():
    import torch

    from lab.claims.deployment_article import SPEC

    plain, spec, costs = _varied_run()
    for run in (plain, spec):
        run["category"] = ["rewriting", "summarization", "open-ended"]
    drafters = ("ngram", "layerskip", "quantized")
    main = pd.concat([summarize(d, 2, spec, plain, costs) for d in drafters], ignore_index=True)
    model = torch.nn.Module()  # the smallest thing `weight_bytes_ratio` counts: one decoder linear, an embedding
    model.layers, model.embed = torch.nn.ModuleList([torch.nn.Linear(4, 4)]), torch.nn.Embedding(10, 4)
    model.config = SimpleNamespace(vocab_size=10, hidden_size=4)
    claims = claims_table(main, dict.fromkeys(drafters, costs), SpecParams(), model)
    assert_one_shape(claims)
    assert_links_find_one_row(claims, SPEC)
    by = claims.set_index("claim")
    theory = by.loc["a=0.7, k=4, c=0.05: E = 2.77 tokens, cost 1.2, speedup ~2.3x"]
    assert theory["verdict"] == "holds" and theory["measured here"] == "E = 2.773, speedup = 2.311"
    assert by.loc["a same-family small model drafts best", "verdict"] == "not checkable here"
    quantized = by.loc["draft cost ratio c is typically 0.03-0.1 (quantized)"]
    assert "bandwidth-bound int4 kernel" in quantized["measured here"] and "packed" in quantized["note"]
    assert not claims["claim"].str.startswith("(no claim)").any()  # context joins its claim's row


def test_the_cut_off_is_where_the_formula_falls_to_1_1x_and_could_have_held():
    """Seeds/003 §5.1's "below a = 0.4 hardly worth it", by its own formula: the a at which k = 4, c = 0.05 reach
    1.1x (not the speedup at exactly 0.4); a dearer draft would put that point above 0.4 and the claim would hold."""
    from lab.claims.rules import verdict
    from lab.speculative.theory import predicted_speedup

    a = break_even(0.05, 4)
    assert predicted_speedup(a, 4, 0.05) == pytest.approx(1.1, abs=1e-6) and a < 0.3
    assert break_even(0.05) < a  # the best k pays even lower
    assert verdict(CUT_OFF, a) == "wrong" and verdict(CUT_OFF, break_even(0.3, 4)) == "holds"
    assert math.isnan(break_even(1.0, 4, verify_cost=2.0))  # 5 tokens for 6 steps at best: never
    overall = pd.DataFrame({"c_effective": [0.001, float("nan")], "v(k)": [1.2, 1.0]}, index=["ngram", "idle"])
    row = _cut_off_row(overall, 4)
    assert row["verdict"] == "wrong" and row["measured here"].startswith(f"{a:.4f}"[:4])
    assert "(ngram)" in row["measured here"] and "idle" not in row["measured here"]


def test_drafters_are_compared_on_the_same_prompts():
    plain, spec, costs = _varied_run()
    slower = spec.assign(decode_s=spec["decode_s"] * 2, accepted_per_round=[[0, 0, 0], [0, 0, 0], [0, 0]])
    requests = pd.concat([plain.assign(drafter="plain"), spec.assign(drafter="ngram"),
                          slower.assign(drafter="layerskip")], ignore_index=True)
    row = drafter_comparison(requests).iloc[0]
    assert (row["drafter"], row["against"], row["prompts"]) == ("ngram", "layerskip", 3)
    assert row["speedup_ratio"] == pytest.approx(2.0) and row["speedup_ratio_low"] == pytest.approx(2.0)
    assert row["speedup_ratio_vs_1"] == "distinguishable"
    assert row["a_difference_low"] <= row["a_difference"] <= row["a_difference_high"]


def test_study_parameters_are_checked():
    with pytest.raises(ValueError, match="DRAFTERS"):
        SpecParams(DRAFTERS=("medusa",))
    with pytest.raises(ValueError, match="DRAFT_LAYERS=30"):
        SpecParams(DRAFT_LAYERS=30)
    with pytest.raises(ValueError, match="THRESHOLD=1.5"):
        SpecParams(THRESHOLD=1.5)
    with pytest.raises(ValueError, match="MODEL='/no/such/dir': cannot load model .* or a directory with config.json"):
        SpecParams(MODEL="/no/such/dir")


def test_a_local_checkpoint_directory_is_a_target(tmp_path):
    """Notebook 05 on a user's own model: MODEL names a Hugging Face directory, read for its config before any
    weight loads; without a tokenizer of its own, its vocabulary must hold SmolLM2's prompt ids."""
    from transformers import LlamaConfig

    LlamaConfig(vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=6, num_attention_heads=4,
                num_key_value_heads=2).save_pretrained(tmp_path / "mine")
    p = SpecParams(MODEL=str(tmp_path / "mine"), DRAFT_LAYERS=3)
    with pytest.raises(ValueError, match="DRAFT_LAYERS=10"):  # the target's 6 layers bound it, not SmolLM2's 30
        SpecParams(MODEL=p.MODEL, DRAFT_LAYERS=10)
    assert SpecParams(MODEL=p.MODEL).DRAFT_LAYERS == 2  # by default a third of the target's layers
    assert SpecParams().DRAFT_LAYERS == 10  # SmolLM2's 30
    LlamaConfig(vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=6, num_attention_heads=4,
                num_key_value_heads=2).save_pretrained(tmp_path / "small")
    with pytest.raises(ModelRefused, match="vocabulary \\(1000\\) is smaller"):
        SpecParams(MODEL=str(tmp_path / "small"), DRAFT_LAYERS=3)


def test_cli_spec_json(capsys):
    from lab.cli import main

    assert main(["spec", "--drafter", "ngram", "--k", "2", "--per-category", "1", "--max-tokens", "6",
                 "--repeats", "1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    cats = {r["category"]: r for r in out["categories"]}
    assert set(cats) == {"code", "rewriting", "translation", "summarization", "open-ended", "all"}
    assert all(r["lossless"] for r in cats.values()) and cats["all"]["requests"] == 5
    assert main(["spec", "--data", "/nonexistent/q.jsonl"]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_acceptance_by_task_reads_the_source_with_more_prompts():
    """Spec-Bench's translation and summarization (20 prompts at the reference) replace the lab set's 5 prompts
    for the acceptance-by-task claim; a task Spec-Bench lacks, or ran with fewer prompts, stays the lab set's."""
    from lab.studies.spec_acceptance.claims import task_categories

    cats = pd.DataFrame({"drafter": ["ngram"] * 3 + ["layerskip"], "category": ["code", "translation",
                         "summarization", "translation"], "requests": [5, 5, 5, 5], "a": [0.5, 0.6, 0.7, 0.4]})
    bench = pd.DataFrame({"drafter": ["ngram", "ngram", "ngram"], "requests": [20, 3, 20], "a": [0.3, 0.9, 0.2],
                          "category": ["translation", "summarization", "question answering"]})
    out = task_categories(cats, bench)
    assert list(zip(out["drafter"], out["category"])) == list(zip(cats["drafter"], cats["category"]))  # order kept
    assert list(out["source"]) == ["lab set", "Spec-Bench", "lab set", "lab set"]
    assert list(out["requests"]) == [5, 20, 5, 5] and list(out["a"]) == [0.5, 0.3, 0.7, 0.4]
    assert task_categories(cats, None)["source"].eq("lab set").all()


def test_the_verification_row_is_judged_on_the_drafters_spread_and_the_ledger_reads_it_the_same():
    """003-42, "verifying k drafts costs one target step": v(k) is the target's (k + 1)-token forward, one quantity
    measured once in each drafter's engine. The notebook called the claim wrong when any drafter's figure exceeded
    1.1 and the ledger read the layer-skip drafter's alone, so a run at 1.11 (ngram), 1.04 (layer-skip) and 1.05
    (quantized) got "wrong" from one and "holds" from the other (`lab claims --check`: disagrees). Both now judge
    the runs' median and min-max spread."""
    from lab.claims.ledger import CLAIMS
    from lab.claims.rules import HOLDS, NOT_DISTINGUISHABLE, WRONG, judge, parse_lab
    from lab.studies.spec_acceptance.claims import verification_row

    claim = next(c for c in CLAIMS if c.id == "003-42")
    for v, want in (({"ngram": 1.11, "layerskip": 1.04, "quantized": 1.05}, NOT_DISTINGUISHABLE),
                    ({"ngram": 1.2, "layerskip": 1.3, "quantized": 1.25}, WRONG),
                    ({"ngram": 1.0, "layerskip": 1.02, "quantized": 1.05}, HOLDS)):
        row = verification_row(v, 4)
        assert row["verdict"] == want, (v, row)
        number = parse_lab(row["measured here"], claim.link.lab_pattern)
        assert float(number.text) == sorted(v.values())[1]
        assert (float(number.lo), float(number.hi)) == (min(v.values()), max(v.values()))
        assert judge(claim.rule, number) == row["verdict"]  # the ledger gives the notebook's verdict
    assert verification_row({"ngram": 1.2, "layerskip": 1.3}, 4)["verdict"] == NOT_DISTINGUISHABLE  # 2 runs: none
