"""The engine with attention_backend="triton" (lab.kernels, in Triton's interpreter here) on the real model:
the same greedy tokens as the torch backend through chunked prefill, mixed prefill/decode steps, prefix-cache
hits and quantized pools; formats the kernels cannot read are refused by name.

The interpreter runs one Triton program at a time in numpy (~10 s a step for 30 layers), so these runs are
short: a few prompts, a few new tokens."""

import pytest
import torch

from lab.engine import LLM, SamplingParams
from lab.kv.format import KVCacheFormat
from lab.kv.calibration import calibrate_kv_absmax


def _run(model, tok, prompts, max_tokens, backend, **kwargs):
    llm = LLM(model, tokenizer=tok, attention_backend=backend, num_kv_blocks=24, max_model_len=128, **kwargs)
    outs = llm.generate(prompts, SamplingParams(max_tokens=max_tokens, temperature=0))
    return [o.token_ids for o in outs], llm.stats()


@pytest.mark.slow
def test_triton_backend_gives_the_torch_backends_tokens(smollm, chat_prompt_ids):
    """Two prompts chunked by a 24-token budget (a decode shares steps with the other's chunks), then the first
    prompt again: a prefix-cache hit whose chunk attends over cached blocks."""
    model, tok = smollm
    prompts = [chat_prompt_ids[0], chat_prompt_ids[2], chat_prompt_ids[0]]
    kwargs = dict(max_num_batched_tokens=24)
    want, _ = _run(model, tok, prompts, 3, "torch", **kwargs)
    got, stats = _run(model, tok, prompts, 3, "triton", **kwargs)
    assert got == want
    assert stats["prefix_cache_hit_tokens"] > 0


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["int8", "fp8_e4m3"])
def test_triton_backend_reads_a_quantized_pool_as_the_torch_backend(smollm, chat_prompt_ids, fmt):
    model, tok = smollm
    scales = calibrate_kv_absmax(model, chat_prompt_ids[:1]) if fmt == "fp8_e4m3" else None
    kwargs = dict(kv_cache_dtype=fmt, kv_scales=scales, block_size=8)
    want, _ = _run(model, tok, chat_prompt_ids[1:3], 2, "torch", **kwargs)
    got, _ = _run(model, tok, chat_prompt_ids[1:3], 2, "triton", **kwargs)
    assert got == want


def test_one_step_of_logits_matches_the_torch_backend(smollm, chat_prompt_ids):
    """Closer than tokens: the sampled step's logits of both backends, a prefill of one prompt."""
    model, tok = smollm
    logits = {}
    for backend in ("torch", "triton"):
        llm = LLM(model, tokenizer=tok, attention_backend=backend, num_kv_blocks=8, max_model_len=64)
        seen = []
        compute = model.compute_logits
        model.compute_logits = lambda h: seen.append(compute(h)) or seen[-1]
        try:
            llm.generate([chat_prompt_ids[0][:20]], SamplingParams(max_tokens=1, temperature=0))
        finally:
            del model.compute_logits
        logits[backend] = seen[0]
    torch.testing.assert_close(logits["triton"], logits["torch"], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("fmt", [KVCacheFormat("int4", "per-channel"), KVCacheFormat("int8", window=16),
                                 KVCacheFormat("int8", pre_rope=True)], ids=["per-channel", "window", "pre-rope"])
def test_formats_the_kernels_cannot_read_are_refused_by_name(smollm, fmt):
    model, tok = smollm
    with pytest.raises(ValueError, match="attention_backend='torch'"):
        LLM(model, tokenizer=tok, attention_backend="triton", kv_cache_dtype=fmt, num_kv_blocks=8)


@pytest.mark.slow
def test_triton_backend_verifies_drafts_as_the_torch_backend(smollm):
    """Speculative rounds on the Triton backend: the verification is an extend chunk over the cached prefix
    (drafts + 1 query rows) and rejected drafts' slots are rewritten; greedy tokens equal plain torch decoding."""
    from lab.speculative import SpeculativeConfig

    model, tok = smollm
    prompt = tok.encode(tok.apply_chat_template([{"role": "user", "content": "Repeat exactly: one two three four "
                                                  "five six seven eight."}], add_generation_prompt=True,
                                                tokenize=False), add_special_tokens=False)
    want, _ = _run(model, tok, [prompt], 6, "torch")
    got, stats = _run(model, tok, [prompt], 6, "triton", speculative=SpeculativeConfig(k=3))
    assert got == want
    assert stats["spec_rounds"] > 0 and stats["spec_accepted"] > 0
