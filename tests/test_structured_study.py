"""Notebook 07's logic without the model: intervals, the extraction task's items and scoring, the claims' shapes.
(The notebook itself runs at the smoke preset in tests/test_notebooks.py.)"""

import math
import re

import pandas as pd
import pytest

from lab.stats.intervals import paired_difference, rate, wilson
from lab.studies.structured_output import measure as study, task
from lab.studies.structured_output.claims import claims_table, projection

from claims_shape import assert_links_find_one_row, assert_one_shape


def test_wilson_matches_published_values():
    # Wilson (1927) / Newcombe (1998), Table I: 0 of 10 -> 0-0.2775; 10 of 10 -> 0.7225-1; 5 of 10 -> 0.2366-0.7634
    for (k, n), (lo, hi) in {(0, 10): (0.0, 0.2775), (10, 10): (0.7225, 1.0), (5, 10): (0.2366, 0.7634)}.items():
        got = wilson(k, n)
        assert got[0] == pytest.approx(lo, abs=1e-4) and got[1] == pytest.approx(hi, abs=1e-4)
    assert rate(40, 40) == "40/40 = 100% (91%-100%)"
    with pytest.raises(ValueError, match="k=11, n=10"):
        wilson(11, 10)


def test_paired_difference_sees_a_shift_and_not_noise():
    a = [1, 1, 1, 1, 0, 1, 1, 1, 1, 1] * 4
    shifted = paired_difference(a, [0] * 40)
    assert shifted["distinguishable"] and shifted["low"] > 0.7
    same = paired_difference(a, a[1:] + a[:1])  # the same values, paired differently
    assert not same["distinguishable"] and same["low"] <= 0 <= same["high"]
    with pytest.raises(ValueError, match="3 and 2"):
        paired_difference([1, 2, 3], [1, 2])


def test_items_are_reproducible_and_answers_appear_in_the_text():
    a, b = task.items(30, seed=1), task.items(30, seed=1)
    assert a == b and a != task.items(30, seed=2)
    assert len({it.answer["name"] for it in a}) == 30
    for it in a:
        for field in task.FIELDS:
            assert str(it.answer[field]) in it.text, (field, it.text)
    with pytest.raises(ValueError, match="n=0"):
        task.items(0)


def test_parse_and_score_are_lenient_with_format_only():
    it = task.Item("x", {"name": "Ada Lovelace", "age": 36, "city": "London", "job": "mathematician"})
    whole = '{"name": "Ada Lovelace", "age": 36, "city": "London", "job": "a mathematician"}'
    row = task.score(it, whole)
    assert row["whole_output_is_json"] and row["schema_valid"] and row["fields_right"] == 4
    fenced = task.score(it, 'Here it is:\n```json\n{"name": "ada lovelace", "age": "36", "city": "Paris", "job": "x"}\n```')
    assert not fenced["whole_output_is_json"] and fenced["json_object_found"] and not fenced["schema_valid"]
    assert (fenced["name"], fenced["age"], fenced["city"]) == (True, True, False)
    trailing = task.score(it, whole + "\n\nThe JSON object is: {")
    assert not trailing["whole_output_is_json"] and trailing["json_object_found"] and trailing["fields_right"] == 4
    broken = task.score(it, '{"name": "Ada Lovelace", "age": 36')
    assert not broken["json_object_found"] and broken["fields_right"] == 0
    assert task.score(it, '{"name": "Ada Lovelace", "age": true}')["age"] is False


def test_validity_table_and_comparison():
    rows = []
    for i in range(10):
        for on in (False, True):
            right = 4 if on else (4 if i < 5 else 0)
            rows.append({"item": i, "temperature": 0.0, "grammar": on, "tokens": 30, "finish_reason": "stop",
                         "batch_s_per_item": 0.1, "whole_output_is_json": on or i < 5, "json_object_found": on or i < 5,
                         "schema_valid": on or i < 5, "fields_right": right})
    df = pd.DataFrame(rows)
    v = task.validity_table(df).set_index("grammar")
    assert v.loc["on", "schema_valid"] == 1.0 and v.loc["off", "schema_valid"] == 0.5
    assert v.loc["off", "tokens per valid answer"] == 60 and v.loc["on", "tokens per valid answer"] == 30
    assert v.loc["on", "schema_valid 95% low"] == pytest.approx(wilson(10, 10)[0])
    c = task.accuracy_comparison(df).set_index("items")
    assert c.loc["all items", "accuracy on - off"] == 0.5 and c.loc["all items", "distinguishable"]
    assert c.loc["items both parsed", "n"] == 5 and c.loc["items both parsed", "accuracy on - off"] == 0


def test_nested_instances_are_valid_and_params_are_checked():
    import jsonschema

    for depth in (1, 2, 5):
        jsonschema.validate(study.nested_instance(depth), study.nested_schema(depth))
    with pytest.raises(ValueError, match="JUMP_ITEMS=9 is more than ITEMS=3"):
        study.StructuredParams(ITEMS=3, JUMP_ITEMS=9)
    with pytest.raises(ValueError, match="unknown model 'llama-9'"):
        study.StructuredParams(PROJECT_MODELS=("llama-9",))


def test_projection_share_grows_with_batch_and_overlap_hides_it():
    p = study.StructuredParams()
    proj = projection(p, fill_s_per_row=1e-4, naive_s_per_row=0.03, vocab_here=49152, batches=(1, 8, 128),
                      models=("llama-3-8b",))
    serial = list(proj["share, serial"])
    assert serial == sorted(serial) and serial[0] < 0.1 < serial[-1]
    assert proj.iloc[0]["vocabulary"] == 128256
    assert proj.iloc[0]["mask fill ms (serial)"] == pytest.approx(0.1 * 128256 / 49152)
    first = proj.iloc[0]
    assert first["share, overlapped"] == 0 and not math.isnan(first["step ms (roofline)"])
    assert first["share, naive mask"] > 0.9


def _claims(valid_with_grammar=1.0, share_at_1=0.02, naive_s=0.03, naive_agrees=True):
    """Notebook 07's claims table from small hand-made measurements (the reference run's shapes): a 15 ms step at
    batch 1, the precompiled mask `share_at_1` of it, the naive mask `naive_s` a state."""
    p = study.StructuredParams()
    validity = pd.DataFrame([
        {"grammar": g, "temperature": t, "outputs": 40, "schema_valid": v, "tokens per valid answer": n,
         "seconds per valid answer": s}
        for t in (0.0, 0.7) for g, v, n, s in (("on", valid_with_grammar, 35.0, 0.05), ("off", 0.75, 56.0, 0.08))])
    summary = pd.DataFrame([{"batch": b, "mask share of step": share, "mask ms per row": 0.2,
                             "step with grammar ms": 15.0, "step without grammar ms": 15.0, "with / without": 1.1,
                             "rounds": 3, "ratio runs low": 1.05, "ratio runs high": 1.15,
                             "share runs low": share * 0.9, "share runs high": share * 1.1,
                             "distinguishable": True} for b, share in ((1, share_at_1), (64, 0.25))])
    components = pd.DataFrame({"naive_s": [naive_s, naive_s], "fill_s": [2e-6, 3e-6], "apply_s": [1e-4, 1e-4],
                               "naive_agrees": [True, naive_agrees]})
    depth = pd.DataFrame({"depth": [1, 8, 32], "compile ms": [4.0, 8.0, 16.0], "fill us median": [2.8, 2.5, 2.3]})
    compile_df = pd.DataFrame({"grammar": ["recursive tree ($ref)"], "cold ms": [0.7]})
    proj = projection(p, fill_s_per_row=1e-4, naive_s_per_row=naive_s, vocab_here=49152, batches=(1, 128),
                      models=("llama-3-8b",))
    return claims_table(p, validity, summary, components, depth, compile_df, proj, 49152)


def _mask_row(claims):
    return claims[claims["claim"].str.contains("两三成): this machine", regex=False)].iloc[0]


def test_claims_have_one_shape_and_keep_the_rows_the_ledger_links():
    claims = _claims()
    assert_one_shape(claims)
    assert_links_find_one_row(claims, "07_structured_output")
    for match in ("makes the format absolutely correct", "and faster: a smaller", "两三成): this machine",
                  "(the same, projected)", "precompiling the state transitions", "deeply nested schemas",
                  "vocabularies run to a hundred thousand"):
        assert claims["claim"].str.contains(match, regex=False).sum() == 1, match
    assert not claims["claim"].str.contains("batch 64").any()  # the article speaks of small batches only
    nested = claims[claims["claim"].str.startswith("deeply nested")].iloc[0]
    assert nested["verdict"] == "not checkable here" and "pushdown automaton" in nested["measured here"]
    vocab = claims[claims["claim"].str.startswith("vocabularies")].iloc[0]
    assert vocab["verdict"] == "not checkable here" and "tiny" not in vocab["measured here"]


def test_the_full_mask_s_share_spans_the_precompiled_and_the_naive_mask_and_can_come_out_either_way():
    """The article's 20-30% is a mask computed in full every step: its cost lies between xgrammar's precompiled
    fill and the naive mask, the span the verdict rests on; it holds only when the whole span is inside 20-30%."""
    span = r"^(?P<v>[\d.]+)% \[(?P<lo>[\d.]+), (?P<hi>[\d.]+)\]"
    cases = {(0.02, 0.03): "not distinguishable",  # 2% to 67%: across the range
             (0.22, 0.0055): "holds",  # 22% to 27%
             (0.02, 0.001): "wrong"}  # 2% to 6%
    for (share, naive_s), want in cases.items():
        row = _mask_row(_claims(share_at_1=share, naive_s=naive_s))
        assert row["verdict"] == want, (share, naive_s)
        m = re.search(span, row["measured here"])
        assert float(m["lo"]) == pytest.approx(100 * share, abs=0.05)
        assert float(m["v"]) == float(m["hi"]) == pytest.approx(100 * naive_s / (0.015 + naive_s), abs=0.05)


def test_a_cut_output_or_a_disagreeing_mask_makes_its_claim_wrong_with_the_reason():
    claims = _claims(valid_with_grammar=0.95, naive_agrees=False)
    assert_one_shape(claims)
    fmt = claims[claims["claim"].str.startswith("constrained decoding")].iloc[0]
    assert fmt["verdict"] == "wrong" and "max_tokens" in fmt["note"]
    lookup = claims[claims["claim"].str.startswith("precompiling")].iloc[0]
    assert lookup["verdict"] == "wrong" and "disagree" in lookup["note"]


def test_the_grammar_ratio_is_distinguishable_only_when_every_run_falls_on_one_side():
    """Three rounds whose on/off ratios drift around 1 (0.96, 1.02, 0.98), each tight over its own steps: one
    round's steps would call 0.96 distinguishable; the rounds' span does not (issue 34 item 6)."""
    def steps(ratios):
        rows = []
        for r, ratio in enumerate(ratios):
            for on, scale in ((False, 1.0), (True, ratio)):
                rows += [{"batch": 1, "grammar": on, "step": i, "running": 1, "round": r,
                          "step_s": scale * (0.1 + 1e-4 * (i % 3)), "mask_s": 0.002 if on else 0.0}
                         for i in range(12)]
        return pd.DataFrame(rows)

    drift = study.mask_summary(steps([0.96, 1.02, 0.98])).iloc[0]
    assert (drift["ratio runs low"], drift["with / without"], drift["ratio runs high"]) == pytest.approx((0.96, 0.98, 1.02))
    assert drift["ratio one run's steps high"] < 1  # one run alone looks distinguishable
    assert not drift["distinguishable"]
    assert study.mask_summary(steps([1.05, 1.08, 1.06])).iloc[0]["distinguishable"]
