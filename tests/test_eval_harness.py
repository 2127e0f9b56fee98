"""The accuracy harness on the real SmolLM2-135M, at small sizes."""

import copy
import json

import numpy as np
import pandas as pd
import pytest
import torch

from lab.eval.harness import bad_cases, evaluate, flips, heldout_texts, pass_rates, run_sensitive
from lab.eval.scores import perplexity, score_sequences
from lab.eval.sensitive import check, load_items
from lab.quant import QuantSpec, fake_quantize

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def heldout(smollm):
    _, tok = smollm
    return heldout_texts(tok, n=3, max_tokens=96, seed=0)


@pytest.fixture(scope="module")
def rtn_w3(smollm):
    model, _ = smollm
    q = copy.deepcopy(model)
    spec = QuantSpec(3, 64)
    with torch.no_grad():
        for lin in q.layers.modules():
            if isinstance(lin, torch.nn.Linear):
                lin.weight.copy_(fake_quantize(lin.weight, spec))
    return q


def test_heldout_disjoint_from_calibration(smollm):
    from lab.quant.calibration import _stdlib_texts

    _, tok = smollm
    seqs, sources = heldout_texts(tok, n=4, max_tokens=64, seed=1, return_sources=True)
    assert len(seqs) == 4 and all(0 < len(s) <= 64 for s in seqs)
    assert not set(sources) & {label for label, _ in _stdlib_texts()}
    assert heldout_texts(tok, n=4, max_tokens=64, seed=1) == seqs  # deterministic


def test_perplexity_real_and_perturbed(smollm, heldout):
    model, _ = smollm
    ppl = perplexity(model, heldout)
    assert 1 < ppl < 100
    noisy = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for lin in noisy.layers.modules():
            if isinstance(lin, torch.nn.Linear):
                w = lin.weight
                w.add_(torch.randn(w.shape, generator=gen) * 0.5 * w.std())
    assert perplexity(noisy, heldout) > ppl * 1.05
    with pytest.raises(ValueError, match=rf"two or more tokens, got lengths \[{len(heldout[0])}, 1\]"):
        perplexity(model, [heldout[0], [1]])  # a one-token sequence predicts nothing: refused, not skipped


def test_logit_scores_against_itself_and_rtn(smollm, heldout, rtn_w3):
    model, _ = smollm
    same = score_sequences(model, model, heldout)
    assert same.kl_mean().value == pytest.approx(0, abs=1e-9) and same.top1_agreement().value == 1.0
    assert same.positions.sum() == sum(map(len, heldout))
    q = score_sequences(model, rtn_w3, heldout)
    assert q.kl_mean().value > 1e-3 and q.top1_agreement().value < 1.0


def test_reference_forwards_kept_for_the_next_model_score_exactly_as_recomputed(smollm, heldout, rtn_w3):
    """`ReferenceLogProbs` (issue 52: half of notebook 02's scoring was the reference recomputed for every model):
    scores through it are bitwise the scores without it, whether a sequence was kept or (past the budget)
    recomputed, and the reference runs once per sequence for two models."""
    from dataclasses import fields

    from lab.eval.scores import ReferenceLogProbs

    model, _ = smollm
    plain = [score_sequences(model, m, heldout) for m in (model, rtn_w3)]
    for budget in (None, 0):
        cache = ReferenceLogProbs(model, budget_bytes=budget)
        cached = [score_sequences(model, m, heldout, cache=cache) for m in (model, rtn_w3)]
        for a, b in zip(plain, cached):
            assert all(np.array_equal(getattr(a, f.name), getattr(b, f.name)) for f in fields(a))
        assert cache.missed == (len(heldout) if budget is None else 2 * len(heldout))
        assert (cache.used > 0) == (budget is None) and cache.used <= cache.budget
    with pytest.raises(ValueError, match="another model"):
        score_sequences(rtn_w3, model, heldout, cache=cache)


def _items():
    items = load_items(("numbers", "proper_nouns", "multilingual", "code"))
    by_cat = {}
    for it in items:
        by_cat.setdefault(it.category, []).append(it)
    return by_cat["numbers"][:2] + by_cat["proper_nouns"][:2] + by_cat["multilingual"][:1] + by_cat["code"][:1]


def test_run_sensitive_structure(smollm):
    model, tok = smollm
    items = _items()
    df = run_sensitive(model, tok, items, max_tokens=8)
    assert list(df["id"]) == [it.id for it in items]
    assert {"category", "id", "passed", "reason", "output"} <= set(df.columns)
    for it, (_, row) in zip(items, df.iterrows()):
        assert (row["passed"], row["reason"]) == check(it, row["output"])
        assert 0 < row["n_output_tokens"] <= 8
    rates = pass_rates(df)
    assert set(rates) == {"numbers", "proper_nouns", "multilingual", "code", "all"}
    assert rates["all"]["total"] == len(items)
    for it in items:  # a forced correct output passes
        assert check(it, it.reference)[0]


def test_bad_cases_finds_regression():
    items = _items()
    ref = pd.DataFrame([{"category": it.category, "id": it.id, "output": it.reference,
                         "passed": True, "reason": "ok"} for it in items])
    quant = ref.copy()
    broken = items[1]
    passed, reason = check(broken, "I do not know.")
    assert not passed
    quant.loc[1, ["output", "passed", "reason"]] = ["I do not know.", False, reason]
    bad = bad_cases(ref, quant, k=5)
    assert list(bad["id"]) == [broken.id]
    row = bad.iloc[0]
    assert row["reference_output"] == broken.reference and row["quantized_output"] == "I do not know."
    assert row["reason"] == reason
    # A fail on the reference too is not a regression.
    ref.loc[1, "passed"] = False
    assert bad_cases(ref, quant, k=5).empty


def test_flips_count_changes_both_ways():
    items = _items()
    ref = pd.DataFrame([{"category": it.category, "id": it.id, "output": it.reference, "passed": True,
                         "reason": "ok"} for it in items])
    quant = ref.copy()
    quant.loc[0, ["output", "passed"]] = ["changed but right", True]
    quant.loc[1, ["output", "passed"]] = ["wrong", False]
    ref.loc[2, "passed"] = False  # a reference failure the quantized run happens to pass
    f = flips(ref, quant)
    assert f["all"] == {"total": len(items), "same_output": (len(items) - 2) / len(items), "lost": 1, "gained": 1}
    assert sum(v["total"] for k, v in f.items() if k != "all") == len(items)
    with pytest.raises(ValueError, match="different items"):
        flips(ref, quant.iloc[1:])


def test_evaluate_is_json(smollm, heldout, rtn_w3):
    model, tok = smollm
    items = _items()[:2]
    out = evaluate(rtn_w3, tok, suite="all", reference=model, heldout=heldout[:2], items=items, max_tokens=4)
    text = json.dumps(out)
    ppl = json.loads(text)["ppl"]
    assert ppl["kl_mean_low"] <= ppl["kl_mean"] <= ppl["kl_mean_high"] and ppl["kl_mean"] > 0
    assert ppl["reference_perplexity"] < ppl["perplexity"] and ppl["n_sequences"] == 2
    assert len(out["sensitive"]["rows"]) == 2 and "bad_cases" in out["sensitive"]
    assert out["sensitive"]["vs_reference"]["all"]["total"] == 2
    with pytest.raises(ValueError, match="suite"):
        evaluate(model, tok, suite="nope")


def test_evaluate_runs_the_reference_once_a_sequence(smollm, heldout, rtn_w3):
    """Its KL and top-1 and its own perplexity read one forward of the reference per held-out sequence (it ran
    twice before: `lab eval --kv-cache-dtype` took three forwards a sequence where two do). One sequence: the
    count is the question."""
    model, tok = smollm
    for candidate, kv in ((rtn_w3, None), (model, "int4/per-token")):
        forwards = []
        hook = model.register_forward_pre_hook(lambda module, args: forwards.append(1))
        try:
            if kv is not None:
                from lab.kv.format import parse_format

                kv = (parse_format(kv)[0], None)
            evaluate(candidate, tok, suite="ppl", reference=model, heldout=heldout[:1], kv=kv)
        finally:
            hook.remove()
        assert len(forwards) == (2 if candidate is model else 1), (kv, len(forwards))  # one sequence


def test_models_judged_by_one_reference_share_its_forwards(smollm, heldout, monkeypatch):
    """`evaluate_model` with a `ReferenceLogProbs`: the exact cache and a quantized one, as notebook 03 judges its
    formats, run the reference once a sequence (each call ran it again before) and score as without the cache."""
    from lab.eval import scores
    from lab.eval.harness import evaluate_model
    from lab.eval.scores import ReferenceLogProbs
    from lab.kv.format import parse_format

    model, tok = smollm
    kv = (parse_format("int4/per-token")[0], None)
    items = _items()[:1]
    outputs = run_sensitive(model, tok, items, 4)  # the sensitive half is not the question: given, not run again
    plain = [evaluate_model(model, tok, model, heldout[:1], items, outputs, 4, df=outputs, kv=k)[2]
             for k in (None, kv)]
    exact_forwards, real = [], scores.forward_logits
    monkeypatch.setattr(scores, "forward_logits",
                        lambda m, ids, cache=None: (exact_forwards.append(cache is None), real(m, ids, cache))[1])
    kept = ReferenceLogProbs(model)
    shared = [evaluate_model(model, tok, model, heldout[:1], items, outputs, 4, df=outputs, kv=k, cache=kept)[2]
              for k in (None, kv)]
    assert exact_forwards.count(True) == 1 and exact_forwards.count(False) == 1  # one sequence
    for a, b in zip(plain, shared):
        assert np.array_equal(a.nll, b.nll) and np.array_equal(a.kl, b.kl) and np.array_equal(a.top1, b.top1)


def test_evaluate_with_a_quantized_kv_cache(smollm, heldout):
    from lab.kv.format import parse_format

    model, tok = smollm
    fmt, _ = parse_format("int4/per-token")
    out = evaluate(model, tok, suite="all", heldout=heldout[:1], items=_items()[:2], max_tokens=4, kv=(fmt, None))
    ppl = out["ppl"]
    # the reference keeps an exact cache
    assert ppl["reference_perplexity"] == pytest.approx(perplexity(model, heldout[:1]), rel=1e-12)
    assert ppl["perplexity"] == pytest.approx(perplexity(model, heldout[:1], (fmt, None)), rel=1e-12)
    assert ppl["perplexity"] != ppl["reference_perplexity"] and ppl["kl_mean"] > 0
    assert out["sensitive"]["vs_reference"]["all"]["total"] == 2
    k_only = evaluate(model, tok, suite="ppl", heldout=heldout[:1], kv=(fmt, None, "k"))
    assert 0 < k_only["ppl"]["kl_mean"]
    with pytest.raises(ValueError, match="K-only or V-only"):
        evaluate(model, tok, suite="sensitive", items=_items()[:1], kv=(fmt, None, "k"))


def test_sequence_scores_pool_to_the_harness_figures_with_intervals(smollm, heldout, rtn_w3):
    from lab.eval.scores import SequenceScores, paired, recovered

    model, _ = smollm
    q = score_sequences(model, rtn_w3, heldout)
    assert q.perplexity().value == pytest.approx(perplexity(rtn_w3, heldout), rel=1e-9)
    for name in ("perplexity", "kl_mean", "top1_agreement"):
        i = getattr(q, name)()
        assert i.low <= i.value <= i.high
    base = score_sequences(model, model, heldout)
    assert base.kl_mean().value == pytest.approx(0, abs=1e-9) and base.top1_agreement().value == 1.0
    ratio = paired(q, base, "perplexity")
    assert ratio.low > 1  # RTN w3 is worse than the model on every resample of these sequences
    assert paired(base, base, "perplexity").value == 1.0
    assert recovered(q, q, base, "perplexity").value == pytest.approx(0)
    assert recovered(base, q, base, "kl_mean").value == pytest.approx(1)
    again = SequenceScores.from_rows(pd.DataFrame(q.rows(model="rtn", domain="code")))
    assert again.perplexity() == q.perplexity()
    with pytest.raises(ValueError, match="two or more tokens"):
        score_sequences(model, model, [[1]])


def test_readme_source_is_prose_no_calibration_set_reads(smollm):
    _, tok = smollm
    seqs, labels = heldout_texts(tok, n=3, max_tokens=64, seed=0, source="readme", return_sources=True)
    assert len(seqs) == 3 and all(label.startswith("readme:") for label in labels)
    assert not any("inference-lab" in label for label in labels)
    with pytest.raises(ValueError, match="source must be one of"):
        heldout_texts(tok, n=1, source="wiki")


def test_readme_documents_do_not_depend_on_what_else_is_installed(monkeypatch):
    """A distribution installed beside the lab, which nothing the lab requires requires (here a fake one that every
    metadata lookup sees), leaves the prose held-out documents as they were. Before, every installed
    distribution's README was drawn from, and notebook 02's prose sequences changed between two reference runs of
    one commit on 6 December (py-spy, a profiler, had been installed between them)."""
    import email.message
    import importlib.metadata as md

    from lab.eval import harness

    before = harness._readme_docs()
    meta = email.message.Message()
    meta["Name"], meta["Version"] = "zz-profiler", "1.0"
    meta.set_payload("A sampling profiler for Python programs. " * 40)
    fake = type("Dist", (), {"metadata": meta, "requires": None})()
    real_all, real_one = md.distributions, md.distribution
    monkeypatch.setattr(md, "distributions", lambda **kw: [*real_all(**kw), fake])
    monkeypatch.setattr(md, "distribution", lambda name: fake if name == "zz-profiler" else real_one(name))
    after = harness._readme_docs()
    assert after == before and not any("zz-profiler" in label for label, _ in after)
    assert len(after) >= 32  # the gpu preset draws 32 sequences a domain, one a document


def test_sensitive_metrics_carry_wilson_intervals():
    from lab.eval.harness import sensitive_metrics

    df = pd.DataFrame({"category": ["numbers"] * 4 + ["code"] * 2, "id": list("abcdef"),
                       "passed": [True, True, False, False, True, True], "output": list("abcdef")})
    m = sensitive_metrics(df, df)
    assert m["pass_all"] == pytest.approx(4 / 6) and m["pass_all_low"] < 4 / 6 < m["pass_all_high"]
    assert m["pass_numbers"] == 0.5 and m["pass_numbers_high"] > 0.5 and m["lost_all"] == 0
