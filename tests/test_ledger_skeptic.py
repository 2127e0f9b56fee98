"""Issue 48: verdicts a skeptic cannot overturn. Each mechanism both ways: a model-dependent claim is decided only on
a model of its class; a figure fixed by construction is caught by perturbing its evidence (and a measured one is
not); a verdict that flips inside its assumption's plausible range is not distinguishable (and one that flips
outside stands); readings that disagree decide nothing; no verdict is read from a note; the literal scan sees
what it used to miss."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pandas as pd
import pytest

from lab.claims import literals
from lab.claims.assumptions import flips
from lab.claims.checks import by_construction, off_class, ruleless, unnamed_assumptions
from lab.claims.gather import Entry, _unstated, resolve
from lab.claims.rebuild import Rebuild, movements
from lab.claims.record import Assumption, Claim, Link, Part, Reading
from lab.claims.model_class import ModelClass, scale_band
from lab.claims.rules import (HOLDS, NOT_CHECKABLE, NOT_DISTINGUISHABLE, ON_CPU, PROJECTED, WRONG, Bound, Evidence,
                              Number, Range, scoped, undecided_by)
from lab.claims.setting import model_class

SEVENTY = ModelClass("10B-100B", "dense")
SMALL = ModelClass("under 1B", "dense")


# -- model scale in the scope ---------------------------------------------------------------------------------------

def test_the_embedded_model_is_under_1b_and_a_70b_preset_is_in_its_band():
    assert model_class("smollm2-135m") == SMALL
    assert model_class("random:llama-3-70b") == SEVENTY
    assert model_class("mixtral-8x7b").arch == "MoE"
    assert scale_band(135e6) == "under 1B" and scale_band(8e9) == "1B-10B" and scale_band(7e10) == "10B-100B"


@pytest.mark.parametrize("measured", [HOLDS, WRONG])
def test_a_model_dependent_claim_is_decided_only_on_a_model_of_its_class(measured):
    # measured on the 135M model: kept apart, with the dimension that kept it from deciding
    assert scoped("model-behaviour", Evidence(ON_CPU, model=SMALL), measured, SEVENTY) == (NOT_CHECKABLE, measured)
    assert undecided_by("model-behaviour", Evidence(ON_CPU, model=SMALL), SEVENTY).startswith("model scale")
    # measured on a model of the claim's class, or a claim about any model: decided
    assert scoped("model-behaviour", Evidence(ON_CPU, model=SEVENTY), measured, SEVENTY) == (measured, "")
    assert scoped("model-behaviour", Evidence(ON_CPU, model=SMALL), measured, ModelClass()) == (measured, "")
    # a projection computed for the claim's model decides it
    assert scoped("model-behaviour", Evidence(PROJECTED), measured, SEVENTY) == (measured, "")
    # the architecture is a dimension too
    moe = ModelClass("10B-100B", "MoE")
    assert undecided_by("model-behaviour", Evidence(ON_CPU, model=SEVENTY), moe).startswith("architecture")


def test_a_model_behaviour_claim_must_name_its_class():
    with pytest.raises(ValueError, match="names the class of model"):
        Claim("003-99", "003", "§9", "acceptance is high", "0.7", verdict=NOT_CHECKABLE, why="w",
              about="x", scope="model-behaviour")


def _entry(claim, verdict, evidence=ON_CPU, in_setting="", undecided=""):
    return Entry(claim, "1", verdict, "", Path("."), "claims.csv", 1, verdict, evidence, "", in_setting, undecided,
                 measured=in_setting or verdict)


def test_the_check_fails_on_a_model_dependent_verdict_off_its_class_and_on_a_study_scoped_as_model_free():
    kv = Claim("003-98", "003", "§2.3", "keys are more sensitive", "K > V", link=Link("03_kv_quantization", "keys"),
               rule=Bound("1"), about="x", scope="behaviour")
    assert off_class([_entry(kv, HOLDS)])  # KV error depends on the model: not 'behaviour'
    ok = dataclasses.replace(kv, scope="model-behaviour", model=SEVENTY)
    assert off_class([_entry(ok, NOT_CHECKABLE, in_setting=HOLDS, undecided="model scale")]) == []
    assert off_class([_entry(ok, HOLDS, undecided="model scale (...)")])  # decided although its class is not met


# -- figures fixed by construction ----------------------------------------------------------------------------------

def _toy_rebuild(table_of) -> Rebuild:
    """A notebook whose claims table has one row computed from a measured frame by `table_of`."""
    def load(_run):
        return {"measured": pd.DataFrame({"with_cache_s": [0.4, 0.5, 0.6], "without_cache_s": [1.0, 1.1, 1.3],
                                          "prompt_tokens": [128, 256, 512]})}

    def table(inputs):
        return pd.DataFrame([{"claim": "the cache cuts the first token's time", "measured here": table_of(inputs),
                              "verdict": HOLDS}])
    return Rebuild("99_toy", load, table, settings={"measured": ("prompt_tokens",)})


def _figure(row):
    return row["measured here"].split(" ")[0]


def test_a_measured_figure_moves_with_its_evidence():
    measured = _toy_rebuild(lambda i: f"{(i['measured']['without_cache_s'] / i['measured']['with_cache_s']).median():.3g}x")
    [moved] = movements(measured, Path("."), {"the cache cuts": _figure}).values()
    assert not moved.by_construction and moved.base == "2.2x"


def test_a_planted_figure_fixed_by_construction_is_caught():
    # the numerator set to the denominator, as a with-cache time "for a new prompt" copied from the no-cache time
    planted = _toy_rebuild(lambda i: f"{(i['measured']['without_cache_s'] / i['measured']['without_cache_s']).median():.3g}x")
    [moved] = movements(planted, Path("."), {"the cache cuts": _figure}).values()
    assert moved.by_construction and moved.base == "1x"
    # a share fixed by a setting (a field inserted at the middle of the prompt) is by construction too
    halfway = _toy_rebuild(lambda i: f"{100 * (i['measured']['prompt_tokens'] // 2).sum() / i['measured']['prompt_tokens'].sum():.3g}%")
    assert movements(halfway, Path("."), {"the cache cuts": _figure})["the cache cuts"].by_construction


def test_a_floor_is_caught_a_baseline_that_passes_nothing_cannot_drop():
    def load(_run):
        return {"items": pd.DataFrame({"base_pass": [0, 0, 0], "quant_pass": [0, 0, 0]})}

    def table(inputs):
        drop = inputs["items"]["quant_pass"].sum() - inputs["items"]["base_pass"].sum()
        return pd.DataFrame([{"claim": "task metrics drop", "measured here": f"{drop:+.1f} pts"}])
    # a shift moves a column at zero; a drop computed from two columns each shifted alone moves; only a drop whose
    # both sides are pinned would not: here each side is free, so the figure is not by construction
    moved = movements(Rebuild("99_toy", load, table), Path("."), {"task metrics drop": _figure})
    assert not moved["task metrics drop"].by_construction


def test_by_construction_checks_the_ledgers_rows_through_each_notebooks_rebuild():
    planted = _toy_rebuild(lambda i: "1.00x")
    claim = Claim("002-98", "002", "§4.1", "2.5x faster with the cache", "2.5x",
                  link=Link("99_toy", "the cache cuts"), rule=Number("2.5", exact=False), about="x", scope="behaviour")
    entry = _entry(claim, WRONG)
    assert by_construction([entry], {"99_toy": planted}) == [
        "by construction: 002-98 (99_toy): no perturbation of its evidence moves its figure '1.00'; make it an "
        "argument or measure what can move it"]
    measured = _toy_rebuild(lambda i: f"{i['measured']['without_cache_s'].sum() / i['measured']['with_cache_s'].sum():.3g}x")
    assert by_construction([entry], {"99_toy": measured}) == []


def test_every_measured_verdict_has_a_rule_or_parts():
    bare = Claim("003-97", "003", "§5.1", "acceptance decides", "a", link=Link("05_speculative_acceptance", "a"),
                 about="x", scope="gpu-speed")
    assert ruleless([_entry(bare, WRONG)])
    parted = dataclasses.replace(bare, parts=(Part("code", r"code (?P<v>[\d.]+)", Range("0.7", None)),))
    assert ruleless([_entry(parted, WRONG)]) == []


# -- assumptions and readings ---------------------------------------------------------------------------------------

def _cut_off(low: float, high: float) -> tuple[Claim, Assumption]:
    # "hardly worth it below a = 0.4": the a where a formula falls to the threshold t, against 0.4
    a = Assumption("hardly worth it", 1.1, "x", "a reading", low, high, "why", figure=lambda t: 0.25 * t ** 3)
    return Claim("003-96", "003", "§5.1", "below 0.4 hardly worth it", "a < 0.4", link=Link("05", "a below"),
                 rule=Range("0.4", None), about="x", scope="arithmetic", assumptions=(a,)), a


def test_a_verdict_that_flips_inside_its_plausible_range_is_not_distinguishable():
    claim, a = _cut_off(1.05, 1.5)
    flip = flips(claim, a, WRONG, a.figure)
    assert flip.at_value == WRONG and flip.inside and 1.1 < flip.inside[0] < 1.5
    entry = Entry(claim, "0.333", WRONG, "", measured=WRONG)
    assert _unstated(entry, {}).verdict == NOT_DISTINGUISHABLE


def test_a_verdict_that_flips_only_outside_its_plausible_range_stands_and_shows_where():
    claim, a = _cut_off(1.05, 1.1)
    flip = flips(claim, a, WRONG, a.figure)
    assert flip.points and not flip.inside and "outside the plausible range" in flip.text()
    assert _unstated(Entry(claim, "0.333", WRONG, "", measured=WRONG), {}).verdict == WRONG


def test_an_assumption_whose_recomputation_misses_the_row_is_a_failure():
    claim, a = _cut_off(1.05, 1.5)
    wrong_fn = dataclasses.replace(a, figure=lambda t: 0.9)  # does not reproduce the row's 0.333
    swept = _unstated(Entry(dataclasses.replace(claim, assumptions=(wrong_fn,)), "0.333", WRONG, "", measured=WRONG), {})
    assert unnamed_assumptions([swept]) and "recomputed at the value used" in unnamed_assumptions([swept])[0]


def test_a_threshold_the_lab_chose_must_be_named():
    bare = Claim("003-95", "003", "§6.2", "seriously overestimates", "seriously", link=Link("06", "x"),
                 rule=Bound("1.2"), about="x", scope="behaviour")
    assert unnamed_assumptions([_entry(bare, HOLDS)])
    named = dataclasses.replace(bare, assumptions=(Assumption("seriously", 1.2, "x", "a reading", 1.1, 1.5, "why",
                                                              rule=lambda x: Bound(repr(x))),))
    assert unnamed_assumptions([_entry(named, HOLDS)]) == []
    printed = dataclasses.replace(bare, article="at least 1.2x")  # the article's own number is no assumption
    assert unnamed_assumptions([_entry(printed, HOLDS)]) == []


def test_readings_that_disagree_decide_nothing_and_readings_that_agree_decide():
    cell = "70b weights 48.5%; with KV 45.1%; 8b with KV 34.3%"
    claim = Claim("002-97", "002", "§5.2", "INT8 saves about 30%", "about 30%", link=Link("09", "int8"),
                  rule=Number("30", False, 5 / 30), about="x", scope="behaviour",
                  readings=(Reading("weights", r"weights (?P<v>[\d.]+)%"), Reading("8B", r"8b with KV (?P<v>[\d.]+)%")))
    assert _unstated(Entry(claim, cell, WRONG, "", measured=WRONG), {}).verdict == NOT_DISTINGUISHABLE
    agree = dataclasses.replace(claim, readings=claim.readings[:1] + (Reading("KV", r"with KV (?P<v>[\d.]+)%"),))
    assert _unstated(Entry(agree, cell, WRONG, "", measured=WRONG), {}).verdict == WRONG


def test_readings_that_miss_the_claim_on_both_sides_decide_nothing():
    # the two ends of a range between methods (a precompiled mask and a naive one) around the article's 20-30%
    cell = "74.9% [1.8, 74.9] of a step"
    claim = Claim("003-93", "003", "§5.3", "the full mask costs 20-30%", "20-30%", link=Link("07", "mask"),
                  rule=Range("20", "30"), about="x", scope="behaviour",
                  readings=(Reading("naive", r"^(?P<v>[\d.]+)%"), Reading("precompiled", r"\[(?P<v>[\d.]+),")))
    assert _unstated(Entry(claim, cell, WRONG, "", measured=WRONG), {}).verdict == NOT_DISTINGUISHABLE
    above = dataclasses.replace(claim, rule=Range("0.5", "1"))  # both ends above the claim: wrong stands
    assert _unstated(Entry(above, cell, WRONG, "", measured=WRONG), {}).verdict == WRONG


# -- holes in the machinery ------------------------------------------------------------------------------------------

def test_a_verdict_in_a_note_is_never_adopted(tmp_path):
    run = tmp_path / "07_x" / "20260101T000000.000000Z-abcdef"
    run.mkdir(parents=True)
    (run / "params.json").write_text('{"notebook": "07_x", "parameters": {"MODEL": "smollm2-135m"}, "gpu": null}')
    pd.DataFrame([{"claim": "a claim", "article": "x", "measured here": "no number", "verdict": NOT_CHECKABLE,
                   "holds": "", "note": "in this setting: wrong"}]).to_csv(run / "claims.csv", index=False)
    claim = Claim("003-94", "003", "§1", "a claim", "x", link=Link("07_x", "a claim"), about="x", scope="behaviour")
    entry = resolve(claim, {"07_x": run})
    assert entry.verdict == NOT_CHECKABLE and entry.in_setting == ""


def test_the_literal_scan_closes_its_holes():
    hits = [h.split(": ", 1)[1] for h in literals.scan(
        "from lab.stats.intervals import NOT_DISTINGUISHABLE\nx = anything.HOLDS\nw = judged(rule, 1.5)\n"
        "v = verdict(rule, -2)\nok = judged(rule, value)\n", "s.py")]
    assert hits == ["imports NOT_DISTINGUISHABLE from lab.stats.intervals", "anything.HOLDS", "a constant judged (1.5)",
                    "a constant judged (-2)"]
    assert literals.LAB / "claims" / "arithmetic" in literals.SCANNED  # the articles' arithmetic is scanned too
    assert literals.find() == []


def test_a_drop_from_a_baseline_that_passes_nothing_is_not_measured():
    """Notebook 02 on a model whose unquantized baseline passes none of the sensitive items (a small 16-bit
    checkpoint of a user's, say) cannot see a drop: the claim is not checkable there, with the reason."""
    from lab.studies.quant_accuracy.stats import _floor

    assert "passes none of the sensitive items" in _floor(pd.DataFrame({"pass_all": [0.0, 0.0]}))
    assert _floor(pd.DataFrame({"pass_all": [0.4, 0.3]})) == ""


def test_docs_state_the_ledgers_counts_and_the_check_rewrites_them(tmp_path):
    from lab.claims.report import COUNTS_BEGIN, COUNTS_END, counts_block, write_counts

    claim = Claim("003-92", "003", "§1", "a claim", "1", verdict=NOT_CHECKABLE, why="w", about="x", scope="behaviour")
    doc = tmp_path / "claims.md"
    doc.write_text(f"intro\n{COUNTS_BEGIN}\nold counts\n{COUNTS_END}\nrest\n")
    entries = [Entry(claim, "", NOT_CHECKABLE, "w")]
    assert write_counts(entries, doc) == (doc, True)
    assert counts_block(entries) in doc.read_text() and "old counts" not in doc.read_text()
    assert write_counts(entries, doc) == (doc, False)  # current now


def test_a_tally_is_read_with_the_rows_that_could_go_either_way_as_its_interval():
    """003-43 reads notebook 05's tally through its link's figure function: a count the notebook does not print
    is 0, and the rows not distinguishable from 10% make the interval, so the verdict is the notebook's."""
    from lab.claims.deployment_article_serving import rows_outside

    open_only = rows_outside("of 18 rows, the article's prediction: not distinguishable at 12, within 10% at 6; x")
    assert (open_only.text, open_only.interval) == ("0", (0, 12))
    some_out = rows_outside("of 18 rows, the article's prediction: not distinguishable at 15, outside 10% at 3")
    assert (some_out.text, some_out.interval) == ("3", (3, 18))
    rule = Range(None, "0")
    from lab.claims.rules import judge
    assert judge(rule, open_only) == NOT_DISTINGUISHABLE and judge(rule, some_out) == WRONG
    assert judge(rule, rows_outside("the article's prediction: within 10% at 18")) == HOLDS
    link = Link("05", "acceptance decides", lab_figure=rows_outside)
    assert link.figure("the article's prediction: outside 10% at 2") == rows_outside(
        "the article's prediction: outside 10% at 2")
    with pytest.raises(ValueError):
        Link("05", "x", lab_pattern="(?P<v>1)", lab_figure=rows_outside)


def test_rebuilt_tables_are_kept_by_the_content_of_the_evidence_not_its_path(tmp_path):
    """`lab claims --check` and the tests follow the same evidence many times: a copy of a run reads the tables
    already rebuilt, an edited copy is rebuilt and its figure follows the edit, and an input whose content cannot be
    read off is rebuilt every time."""
    import shutil

    calls = []

    def load(run):
        return {"measured": pd.read_csv(Path(run) / "m.csv")}

    def table(inputs):
        calls.append(1)
        return pd.DataFrame([{"claim": "the cache cuts", "measured here": f"{inputs['measured']['s'].sum():.3g} s"}])

    rebuild = Rebuild("99_toy", load, table)
    first = tmp_path / "run"
    first.mkdir()
    pd.DataFrame({"s": [1.0, 2.0]}).to_csv(first / "m.csv", index=False)
    [a] = movements(rebuild, first, {"the cache cuts": _figure}).values()
    built = len(calls)
    assert a.base == "3" and not a.by_construction and built > 1
    copy = tmp_path / "copy"
    shutil.copytree(first, copy)
    [b] = movements(rebuild, copy, {"the cache cuts": _figure}).values()
    assert b == a and len(calls) == built  # the same evidence: nothing rebuilt
    pd.DataFrame({"s": [1.0, 5.0]}).to_csv(copy / "m.csv", index=False)
    [c] = movements(rebuild, copy, {"the cache cuts": _figure}).values()
    assert c.base == "6" and len(calls) > built  # edited: rebuilt, and the figure follows the edit

    opaque = Rebuild("99_toy", lambda run: {**load(run), "model": object()}, table)
    for _ in range(2):
        before = len(calls)
        movements(opaque, first, {"the cache cuts": _figure})
        assert len(calls) > before
