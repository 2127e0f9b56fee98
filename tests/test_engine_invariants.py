"""Correctness invariants of the paged engine, each on the real model (SmolLM2-135M, float32).

paged == contiguous reference (which test_model.py ties to transformers); chunked == unchunked;
prefix hit == miss; preempted == not; block sizes agree; seeded sampling is reproducible.
"""

import pytest

from lab.engine import LLM, SamplingParams
from lab.models.reference import greedy_generate

N_NEW = 20
GREEDY = SamplingParams(temperature=0.0, max_tokens=N_NEW, ignore_eos=True)


def engine(smollm, **kw):
    model, tok = smollm
    kw.setdefault("num_kv_blocks", 256)
    return LLM(model, tokenizer=tok, max_model_len=512, **kw)


def tokens(outputs):
    return [o.token_ids for o in outputs]


@pytest.fixture(scope="module")
def reference(smollm, chat_prompt_ids):
    model, _ = smollm
    return [greedy_generate(model, ids, N_NEW) for ids in chat_prompt_ids]


def test_paged_batch_equals_contiguous_reference(smollm, chat_prompt_ids, reference):
    llm = engine(smollm)
    outs = llm.generate(chat_prompt_ids, GREEDY)
    assert tokens(outs) == reference
    assert all(o.finish_reason == "length" and len(o.token_ids) == N_NEW for o in outs)
    assert llm.stats()["kv_blocks_used"] == 0


@pytest.mark.parametrize("budget", [7, 16, 33])
def test_chunked_prefill_equals_unchunked(smollm, chat_prompt_ids, reference, budget):
    llm = engine(smollm, max_num_batched_tokens=budget, enable_prefix_caching=False)
    assert tokens(llm.generate(chat_prompt_ids, GREEDY)) == reference
    # the prompts are longer than the budget, so they really were split across steps
    assert max(map(len, chat_prompt_ids)) > budget


def test_unchunked_engine_equals_reference(smollm, chat_prompt_ids, reference):
    llm = engine(smollm, enable_chunked_prefill=False, max_num_batched_tokens=512)
    assert tokens(llm.generate(chat_prompt_ids, GREEDY)) == reference


def test_prefix_cache_hit_equals_miss(smollm, chat_prompt_ids, reference):
    llm = engine(smollm)
    first = llm.generate(chat_prompt_ids, GREEDY)
    second = llm.generate(chat_prompt_ids, GREEDY)
    assert all(o.metrics.num_cached_tokens == 0 for o in first)
    # the chat template's shared system prompt, and then each whole prompt, is now cached
    assert all(o.metrics.num_cached_tokens >= 16 for o in second)
    assert all(o.metrics.num_cached_tokens < len(o.prompt_token_ids) for o in second)  # last token recomputed
    assert tokens(second) == tokens(first) == reference
    assert llm.stats()["prefix_cache_hit_rate"] > 0


def test_prefix_hit_within_one_batch_and_salt_isolation(smollm, chat_prompt_ids):
    llm = engine(smollm)
    ids = chat_prompt_ids[1]
    a = llm.generate([{"prompt_token_ids": ids, "cache_salt": "tenant-a"}], GREEDY)[0]
    b = llm.generate([{"prompt_token_ids": ids, "cache_salt": "tenant-b"}], GREEDY)[0]
    c = llm.generate([{"prompt_token_ids": ids, "cache_salt": "tenant-a"}], GREEDY)[0]
    assert b.metrics.num_cached_tokens == 0  # another tenant's identical prompt shares nothing
    assert c.metrics.num_cached_tokens > 0
    assert a.token_ids == b.token_ids == c.token_ids


def test_preemption_equals_no_preemption(smollm, chat_prompt_ids, reference):
    # 4 prompts of ~40 tokens + 20 new need ~4 x 4 blocks of 16; 9 blocks cannot hold them all at once.
    llm = engine(smollm, num_kv_blocks=9, enable_prefix_caching=False)
    outs = llm.generate(chat_prompt_ids, GREEDY)
    assert llm.stats()["preemptions"] > 0
    assert any(o.metrics.num_preemptions > 0 for o in outs)
    assert tokens(outs) == reference
    assert llm.block_manager.num_free_blocks == 9


def test_preemption_with_prefix_caching(smollm, chat_prompt_ids, reference):
    llm = engine(smollm, num_kv_blocks=9)
    outs = llm.generate(chat_prompt_ids, GREEDY)
    assert llm.stats()["preemptions"] > 0
    assert tokens(outs) == reference


@pytest.mark.parametrize("block_size", [8, 32])
def test_block_sizes_agree(smollm, chat_prompt_ids, reference, block_size):
    llm = engine(smollm, block_size=block_size, num_kv_blocks=4096 // block_size)
    assert tokens(llm.generate(chat_prompt_ids, GREEDY)) == reference  # block 16 is the first test


def test_continuous_batching_of_staggered_arrivals(smollm, chat_prompt_ids, reference):
    llm = engine(smollm, max_num_seqs=2)
    done = {}
    ids = [llm.add_request(chat_prompt_ids[0], GREEDY)]
    for _ in range(5):
        done.update({d.request_id: d.output for d in llm.step() if d.finished})
    ids += [llm.add_request(p, GREEDY) for p in chat_prompt_ids[1:]]
    while llm.has_unfinished():
        assert len(llm.scheduler.running) <= 2
        done.update({d.request_id: d.output for d in llm.step() if d.finished})
    assert [done[i].token_ids for i in ids] == reference


def test_seeded_sampling_is_reproducible_and_batch_independent(smollm, chat_prompt_ids):
    llm = engine(smollm)
    p = SamplingParams(temperature=0.8, top_k=50, top_p=0.95, max_tokens=16, seed=1234, ignore_eos=True)
    alone = llm.generate([chat_prompt_ids[1]], p)[0].token_ids
    batched = llm.generate(chat_prompt_ids, [SamplingParams(temperature=1.0, max_tokens=16, seed=i)
                                             for i in range(4)][:1] + [p] + [GREEDY] * 2)[1].token_ids
    other_seed = llm.generate([chat_prompt_ids[1]], SamplingParams(temperature=0.8, top_k=50, top_p=0.95,
                                                                   max_tokens=16, seed=99, ignore_eos=True))[0]
    assert alone == batched
    assert other_seed.token_ids != alone


def test_top_k_one_is_greedy(smollm, chat_prompt_ids, reference):
    llm = engine(smollm)
    outs = llm.generate(chat_prompt_ids[:2], SamplingParams(temperature=1.3, top_k=1, max_tokens=N_NEW,
                                                            ignore_eos=True, seed=5))
    assert tokens(outs) == reference[:2]


def test_eos_and_stop_tokens_end_a_request(smollm, chat_prompt_ids, reference):
    llm = engine(smollm)
    stop_at = reference[0][5]
    out = llm.generate([chat_prompt_ids[0]], SamplingParams(temperature=0, max_tokens=N_NEW,
                                                            stop_token_ids=[stop_at]))[0]
    assert out.finish_reason == "stop" and out.token_ids == reference[0][:reference[0].index(stop_at) + 1]


def test_metrics_are_consistent(smollm, chat_prompts):
    llm = engine(smollm)
    outs = llm.generate(chat_prompts, GREEDY)
    for o in outs:
        m = o.metrics
        assert m.arrival_time <= m.first_scheduled_time <= m.first_token_time <= m.finish_time
        assert m.ttft > 0 and m.tpot > 0 and len(m.inter_token_latencies) == N_NEW - 1
        assert m.num_prompt_tokens == len(o.prompt_token_ids)
        assert isinstance(o.text, str) and o.text
    s = llm.stats()
    assert s["decode_tokens"] == len(outs) * (N_NEW - 1)
    assert s["prefill_tokens"] == sum(len(o.prompt_token_ids) for o in outs)
