"""GPTQModel beside the lab's GPTQ (`lab.bench.quant.gptqmodel_side_by_side`, what `lab bench quant` prints), on a small
random-weight Llama with SmolLM2's vocabulary (so its tokenizer cuts the held-out text): the same settings reach
GPTQModel, both results are measured on the same inputs, and both beat round-to-nearest there (what GPTQ is for)."""

import copy

import pytest
import torch
from test_model_families import save_tiny_hf

from lab.bench.quant import gptqmodel_side_by_side
from lab.quant import gptqmodel_compare, gptqmodel_peer
from lab.quant.rtn import QuantSpec, quantize

pytestmark = pytest.mark.usefixtures("one_thread")
needs_gptqmodel = pytest.mark.skipif(bool(gptqmodel_peer.available()), reason=gptqmodel_peer.available())
SPEC = QuantSpec(4, 32)


@pytest.fixture(scope="module")
def subject(tmp_path_factory):
    """(reference lab model, tokenizer, calibration blocks): 2 layers, hidden 64, tied embeddings as SmolLM2's."""
    from transformers import LlamaConfig

    from lab.models import load_model
    from lab.models.loader import load_tokenizer, resolve_model_dir

    tok = load_tokenizer(resolve_model_dir("smollm2-135m"))
    path = tmp_path_factory.mktemp("tiny-smollm-vocab")
    config = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         tie_word_embeddings=True)
    save_tiny_hf(path, config)  # the family tests' weights: large enough that a wrong layout shows
    model, _ = load_model(path, dtype=torch.float32, device="cpu")
    g = torch.Generator().manual_seed(2)
    calib = [torch.randint(0, len(tok), (64,), generator=g).tolist() for _ in range(8)]
    return model, tok, calib


@needs_gptqmodel
def test_gptqmodel_side_by_side_on_the_same_inputs(subject):
    from lab.quant.gptq import GPTQConfig, gptq_quantize_model
    from lab.quant.pipeline import decoder_linears

    reference, tok, calib = subject
    lab_model, codes = copy.deepcopy(reference), {}
    gptq_quantize_model(lab_model, calib, SPEC, GPTQConfig(), progress=False, results=codes)
    r = gptqmodel_side_by_side(reference, tok, lab_model, codes, 1.0, SPEC, False, calib,
                               heldout_sequences=3, heldout_tokens=48, recon_blocks=8)
    assert r["status"] == f"GPTQModel {gptqmodel_peer.VERSION} ran"
    qc = r["quantize_config"]  # the settings reached GPTQModel
    assert (qc["bits"], qc["group_size"], qc["sym"], qc["desc_act"]) == (4, 32, False, False)
    assert qc["meta"]["damp_percent"] == GPTQConfig().percdamp and qc["meta"]["act_group_aware"] is False
    assert r["gptqmodel_seconds"] > 0 and r["lab_over_gptqmodel"] == 1.0 / r["gptqmodel_seconds"]

    # round-to-nearest on the same inputs: GPTQ (either one) must do better, layer by layer
    rtn = copy.deepcopy(reference)
    with torch.no_grad():
        for lin in decoder_linears(rtn).values():
            q, s, z = quantize(lin.weight, SPEC)
            lin.weight.copy_(s.repeat_interleave(32, 1) * (q.float() - z.repeat_interleave(32, 1)))
    norms, errors = gptqmodel_compare.layer_output_errors(reference, {"rtn": rtn}, calib)
    rtn_rel = errors["rtn"] / norms
    for label in ("lab", "gptqmodel"):
        rel = torch.tensor(r["layer_relative_error"][label])
        assert rel.shape == (2,) and bool((rel > 0).all()), label
        assert bool((rel < torch.tensor(rtn_rel)).all()), (label, rel, rtn_rel)
        pooled = r["pooled_relative_error"][label]
        assert pooled["value_low"] <= pooled["value"] <= pooled["value_high"]
    for domain in ("code", "prose"):
        row = r["perplexity"][domain]
        assert row["sequences"] == 3
        for label in ("reference", "lab", "gptqmodel", "gptqmodel_over_lab"):
            assert row[label]["value_low"] <= row[label]["value"] <= row[label]["value_high"], (domain, label)
    text = "\n".join(gptqmodel_compare.format_comparison(r, "a tiny random model"))
    assert "GPTQModel/lab" in text and "perplexity prose" in text and "output error gptqmodel" in text


def test_without_gptqmodel_the_reason_is_reported(monkeypatch, subject):
    reference, tok, calib = subject
    monkeypatch.setattr(gptqmodel_peer, "available", lambda: "GPTQModel is not installed (test)")
    r = gptqmodel_side_by_side(reference, tok, reference, {}, 1.0, SPEC, False, calib)
    assert r == {"status": "GPTQModel is not installed (test)"}
    assert gptqmodel_compare.format_comparison(r, "x") == ["GPTQModel: not run: GPTQModel is not installed (test)"]
    assert "Q4_1" in gptqmodel_compare.subject_note("smollm2-135m")


def test_held_out_perplexity_runs_the_reference_once_a_sequence(subject, monkeypatch):
    """The reference, GPTQModel's model and the lab's are each scored against the reference: its forwards are
    kept for the three (it ran three times a sequence before). That kept forwards score exactly as recomputed ones
    is tests/test_eval_harness.py's `test_reference_forwards_kept_for_the_next_model_score_exactly_as_recomputed`."""
    from lab.bench.quant import heldout_perplexity
    from lab.eval import scores

    reference, tok, _ = subject
    models = {"lab": copy.deepcopy(reference), "gptqmodel": copy.deepcopy(reference)}
    ran, real = [], scores.forward_logits
    monkeypatch.setattr(scores, "forward_logits", lambda m, ids, cache=None: (ran.append(m), real(m, ids, cache))[1])
    heldout_perplexity(reference, models, tok, 2, 32)
    assert sum(m is reference for m in ran) == 2 * 2  # two domains of two sequences
    assert sum(m is models["lab"] for m in ran) == sum(m is models["gptqmodel"] for m in ran) == 4


def test_the_bench_uses_the_quantization_studys_held_out_domains():
    from lab.bench.quant import HELDOUT_DOMAINS
    from lab.studies.quant_accuracy.measure import DOMAIN_SOURCES

    assert HELDOUT_DOMAINS == DOMAIN_SOURCES
