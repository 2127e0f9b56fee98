"""`LLM.chat` and the message shapes of OpenAI's and vLLM's chat APIs (`lab.engine.chat`), on the real model."""

import pytest

from lab.engine import LLM, SamplingParams
from lab.engine.chat import normalize

GREEDY = SamplingParams(temperature=0, max_tokens=12)
QUESTION = "What is the capital of France?"


@pytest.fixture(scope="module")
def llm(smollm):
    model, tok = smollm
    return LLM(model, tokenizer=tok, num_kv_blocks=64, max_model_len=256)


def test_chat_answers_the_readme_question_through_the_template(llm):
    [out] = llm.chat([{"role": "user", "content": QUESTION}], GREEDY)
    assert "Paris" in out.text  # generate() on the raw question answers with end-of-turn at once
    prompt = llm.tokenizer.apply_chat_template([{"role": "user", "content": QUESTION}], add_generation_prompt=True,
                                               tokenize=False)
    assert out.token_ids == llm.generate([prompt], GREEDY)[0].token_ids


def test_chat_takes_several_conversations_parts_and_the_developer_role(llm):
    system = [{"role": "system", "content": "Answer in one word."}, {"role": "user", "content": QUESTION}]
    parts = [{"role": "developer", "content": [{"type": "text", "text": "Answer in "},
                                               {"type": "text", "text": "one word."}]},
             {"role": "user", "content": [{"type": "text", "text": QUESTION}]}]
    a, b = llm.chat([system, parts], GREEDY)
    assert a.token_ids == b.token_ids


@pytest.mark.parametrize("messages, match", [
    ([], "non-empty"),
    ([{"role": "robot", "content": "hi"}], r"messages\[0\]\.role is 'robot'"),
    ([{"role": "user"}], r"messages\[0\] must be a dict with 'role' and 'content'"),
    ([{"role": "user", "content": "a"}, {"role": "user", "content": [{"type": "image_url", "image_url": {}}]}],
     r"messages\[1\]\.content\[0\] is a image_url part"),
    ([{"role": "user", "content": 5}], r"messages\[0\]\.content must be a string or a list of parts"),
])
def test_bad_messages_are_refused_by_place(messages, match):
    with pytest.raises(ValueError, match=match):
        normalize(messages)


def test_a_bad_conversation_in_a_batch_is_named_and_nothing_is_queued(llm):
    with pytest.raises(ValueError, match=r"messages\[1\]\[0\]\.role"):
        llm.chat([[{"role": "user", "content": "hi"}], [{"role": "bot", "content": "x"}]], GREEDY)
    assert not llm.has_unfinished()


def test_logprobs_equal_the_reference_models_log_softmax(smollm, llm):
    """vLLM's logprobs: each generated token's log-probability and rank under the model's raw logits, with the
    top-k; checked against a plain causal forward of the reference model over prompt + output."""
    import torch

    from lab.models.reference import forward_logits

    model, tok = smollm
    params = SamplingParams(temperature=0.8, seed=3, max_tokens=8, ignore_eos=True, logprobs=3)
    [out] = llm.chat([{"role": "user", "content": QUESTION}], params)
    assert len(out.logprobs) == len(out.token_ids) == 8
    with torch.inference_mode():
        ref = torch.log_softmax(forward_logits(model, out.prompt_token_ids + out.token_ids).float(), -1)
    for j, (token, entry) in enumerate(zip(out.token_ids, out.logprobs)):
        row = ref[len(out.prompt_token_ids) - 1 + j]
        assert entry[token].logprob == pytest.approx(float(row[token]), abs=2e-3)
        assert entry[token].rank == 1 + int((row > row[token]).sum())
        top = row.topk(3).indices.tolist()
        assert set(top) <= set(entry) and [entry[t].rank for t in top] == [1, 2, 3]
    assert llm.generate([[1, 2, 3]], SamplingParams(max_tokens=2))[0].logprobs is None  # not asked, not computed


def test_speculative_requests_get_the_same_logprobs(smollm):
    from lab.speculative import SpeculativeConfig

    model, tok = smollm
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=2)
    msgs = [{"role": "user", "content": "Repeat after me: the cat sat on the mat, the cat sat on the mat."}]
    plain = LLM(model, tokenizer=tok, num_kv_blocks=64, max_model_len=256).chat(msgs, params)[0]
    spec = LLM(model, tokenizer=tok, num_kv_blocks=64, max_model_len=256,
               speculative=SpeculativeConfig(k=3, method="ngram")).chat(msgs, params)[0]
    assert spec.token_ids == plain.token_ids and spec.metrics.speculation.accepted > 0
    for a, b in zip(spec.logprobs, plain.logprobs):
        assert a.keys() == b.keys() and all(abs(a[t].logprob - b[t].logprob) < 2e-3 for t in a)


def test_n_samples_share_the_prompt_and_equal_n_seeded_requests(smollm):
    model, tok = smollm
    llm = LLM(model, tokenizer=tok, num_kv_blocks=64, max_model_len=256)
    msgs = [{"role": "user", "content": "Write a short poem about the sea, please, in four lines."}]
    [out] = llm.chat(msgs, SamplingParams(temperature=1.0, seed=11, max_tokens=10, n=3))
    assert len(out.outputs) == 3 and out.outputs[0] is out
    hits = llm.stats()["prefix_cache_hit_tokens"]
    bs = llm.config.block_size
    full = (len(out.prompt_token_ids) - 1) // bs * bs  # a hit leaves at least the last prompt token to compute
    assert hits == 2 * full > 0  # samples 1 and 2 found the first's full prompt blocks in the cache
    single = LLM(model, tokenizer=tok, num_kv_blocks=64, max_model_len=256)
    for i, sample in enumerate(out.outputs):
        want = single.chat(msgs, SamplingParams(temperature=1.0, seed=11 + i, max_tokens=10))[0]
        assert sample.token_ids == want.token_ids
    assert len({tuple(s.token_ids) for s in out.outputs}) > 1  # independent samples, not copies
    assert llm.block_manager.num_used_blocks == 0 and llm.extensions["fanout"].held == {}
    with pytest.raises(ValueError, match="n must be"):
        SamplingParams(n=0)


def test_penalties_equal_a_direct_computation_on_the_reference_model(smollm, llm):
    import torch

    from lab.models.reference import forward_logits

    model, tok = smollm
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, presence_penalty=0.5,
                            frequency_penalty=0.7, repetition_penalty=1.3)
    [out] = llm.chat([{"role": "user", "content": "Say 'yes' many times."}], params)
    ids, want = list(out.prompt_token_ids), []
    with torch.inference_mode():
        for _ in range(12):
            row = forward_logits(model, ids + want)[-1].float()
            seen = torch.tensor(sorted(set(ids + want)))
            row[seen] = torch.where(row[seen] > 0, row[seen] / 1.3, row[seen] * 1.3)
            for t in set(want):
                row[t] -= 0.5 + 0.7 * want.count(t)
            want.append(int(row.argmax()))
    assert out.token_ids == want
    plain = llm.chat([{"role": "user", "content": "Say 'yes' many times."}],
                     SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))[0]
    assert plain.token_ids != want  # the penalties changed the answer, so the test can fail


def test_min_tokens_masks_the_end_of_turn(llm):
    raw = llm.generate(["What is the capital of France?"], SamplingParams(temperature=0, max_tokens=8))[0]
    assert raw.finish_reason == "stop" and len(raw.token_ids) < 4  # the instruct model ends (almost) at once
    held = llm.generate(["What is the capital of France?"], SamplingParams(temperature=0, max_tokens=8, min_tokens=4))[0]
    assert len(held.token_ids) >= 4 and not set(held.token_ids[:4]) & set(llm.eos_token_ids)


@pytest.mark.parametrize("kw, name", [(dict(presence_penalty=2.5), "presence_penalty"),
                                      (dict(repetition_penalty=0.0), "repetition_penalty"),
                                      (dict(min_tokens=20, max_tokens=10), "min_tokens")])
def test_bad_penalties_are_named(kw, name):
    with pytest.raises(ValueError, match=name):
        SamplingParams(**kw)


def test_prompt_logprobs_equal_the_reference_across_chunks_and_a_cached_prefix(smollm):
    import torch

    from lab.models.reference import forward_logits

    model, tok = smollm
    llm = LLM(model, tokenizer=tok, num_kv_blocks=64, max_model_len=256, max_num_batched_tokens=16)  # 16-token chunks
    msgs = [{"role": "user", "content": QUESTION}]
    llm.chat(msgs, SamplingParams(max_tokens=1))  # the prompt's blocks are now in the prefix cache
    [out] = llm.chat(msgs, SamplingParams(max_tokens=2, prompt_logprobs=2))
    prompt = out.prompt_token_ids
    assert out.prompt_logprobs[0] is None and len(out.prompt_logprobs) == len(prompt) > 16
    assert out.metrics.num_cached_tokens == 0  # computed again: cached tokens have no logits
    with torch.inference_mode():
        ref = torch.log_softmax(forward_logits(model, prompt).float(), -1)
    for p in range(1, len(prompt)):
        entry, row = out.prompt_logprobs[p], ref[p - 1]
        assert entry[prompt[p]].logprob == pytest.approx(float(row[prompt[p]]), abs=2e-3)
        assert entry[prompt[p]].rank == 1 + int((row > row[prompt[p]]).sum())
