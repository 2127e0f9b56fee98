"""Speculative decoding in the engine (lab.spec.speculator) on the real model: greedy speculative output equals
plain greedy token for token, beside requests that do not speculate, under a tight token budget that withdraws
drafts, and with the prefix cache (no rejected draft is ever hashed into it)."""

import pytest

from lab.engine import LLM, SamplingParams
from lab.spec.drafters import NgramDrafter
from lab.spec.speculator import SpeculativeConfig

QUESTIONS = ["Repeat this sentence three times: the quick brown fox jumps over the lazy dog.",
             "Write a Python function that adds two numbers, then the same function with type hints.",
             "What is the capital of France?"]
MAX_NEW = 32


@pytest.fixture(scope="module")
def prompts(smollm):
    _, tok = smollm
    return [tok.encode(tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                               tokenize=False), add_special_tokens=False) for q in QUESTIONS]


@pytest.fixture(scope="module")
def plain(smollm, prompts):
    model, tok = smollm
    llm = LLM(model, tokenizer=tok, num_kv_blocks=64, max_model_len=512)
    return [o.token_ids for o in llm.generate(prompts, SamplingParams(max_tokens=MAX_NEW, temperature=0))]


def test_greedy_speculative_equals_plain_greedy(smollm, prompts, plain):
    model, tok = smollm
    llm = LLM(model, tokenizer=tok, num_kv_blocks=64, max_model_len=512, speculative=SpeculativeConfig(k=4))
    got = [o.token_ids for o in llm.generate(prompts, SamplingParams(max_tokens=MAX_NEW, temperature=0))]
    assert got == plain
    s = llm.stats()
    assert s["spec_rounds"] > 0 and 0 < s["spec_accepted"] <= s["spec_drafted"]
    assert s["spec_accepted"] / s["spec_drafted"] <= s["spec_conditional_acceptance"] <= 1
    assert s["spec_mean_accepted_tokens_per_step"] == pytest.approx(s["spec_accepted"] / s["spec_rounds"] + 1)
    assert s["kv_blocks_used"] == 0


def test_speculative_and_plain_requests_share_the_engine_and_a_tight_budget(smollm, prompts, plain):
    model, tok = smollm
    llm = LLM(model, tokenizer=tok, num_kv_blocks=64, max_model_len=512, max_num_batched_tokens=6,
              speculative=SpeculativeConfig(k=6))
    params = [SamplingParams(max_tokens=MAX_NEW, temperature=0, speculate=i != 1) for i in range(3)]
    assert [o.token_ids for o in llm.generate(prompts, params)] == plain
    assert llm.stats()["spec_rounds"] > 0


def test_prefix_cache_holds_no_rejected_draft(smollm, prompts, plain):
    """Run, then ask again with each prompt extended by its own output: the hits must give the same tokens as
    a fresh engine would."""
    model, tok = smollm
    llm = LLM(model, tokenizer=tok, num_kv_blocks=128, max_model_len=512, speculative=SpeculativeConfig(k=4))
    params = SamplingParams(max_tokens=MAX_NEW, temperature=0)
    llm.generate(prompts, params)
    extended = [p + out[:16] for p, out in zip(prompts, plain)]
    again = [o.token_ids for o in llm.generate(extended, SamplingParams(max_tokens=8, temperature=0))]
    fresh = LLM(model, tokenizer=tok, num_kv_blocks=128, max_model_len=512)
    assert llm.stats()["prefix_cache_hit_tokens"] > 0
    assert again == [o.token_ids for o in fresh.generate(extended, SamplingParams(max_tokens=8, temperature=0))]


def test_acceptance_metrics_by_position():
    from lab.spec.speculator import SpecStats

    s = SpecStats()
    for drafted, accepted in ((4, 4), (4, 1), (4, 0), (2, 2)):
        s.record(drafted, accepted)
    # position 1: verified 4 times, accepted 3; position 2: verified 3 (after an acceptance), accepted 2; ...
    assert s.reached == [4, 3, 1, 1] and s.accepted_at == [3, 2, 1, 1]
    assert s.conditional_acceptance == pytest.approx(7 / 9)
    assert s.mean_accepted_tokens_per_step == pytest.approx(7 / 4 + 1)
    assert s.accepted / s.drafted == pytest.approx(7 / 14)  # vLLM's ratio: not a


def test_ngram_drafter_proposes_what_followed_the_latest_match():
    d = NgramDrafter(min_n=1, max_n=2)
    assert d.propose([1, 2, 3, 9, 1, 2, 3, 4, 1, 2], 3) == [3, 4, 1]  # "1 2" last seen at 4: then 3 4 1
    assert d.propose([5, 6, 7], 2) == []  # no earlier occurrence of 7 or 6 7
    with pytest.raises(ValueError, match="min_n <= max_n"):
        NgramDrafter(min_n=3, max_n=2)
    with pytest.raises(ValueError, match="k .drafts per round. must be a positive int"):
        SpeculativeConfig(k=0)
