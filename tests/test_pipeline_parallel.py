"""Pipeline parallelism (lab.parallel.pipeline, `LLM(pipeline_parallel_size=N)`) on the real model (SmolLM2-135M,
float32): PP=2 greedy output equals TP=1 with several micro-batches a step, through chunked prefill, preemption and
prefix-cache hits, and at another count set on the running group; each stage holds its 15 layers' weights and KV;
micro-batches are cut at sequence boundaries; a killed stage is an error naming its rank; close() leaves no worker
behind.
"""

import os
import signal

import pytest
import torch

from parallel_helpers import gone, tokens

from lab.engine import LLM, SamplingParams
from lab.models.attention import PagedAttentionMetadata
from lab.parallel.group import RankFailure
from lab.parallel.pipeline import micro_batches, split_meta

N_NEW = 20
GREEDY = SamplingParams(temperature=0.0, max_tokens=N_NEW, ignore_eos=True)


def pp_engine(**kw):
    return LLM("smollm2-135m", **{"dtype": "float32", "device": "cpu", "max_model_len": 512,
                                  "pipeline_parallel_size": 2, **kw})




@pytest.fixture(scope="module")
def reference(smollm, chat_prompt_ids, one_thread):
    model, tok = smollm
    return tokens(LLM(model, tokenizer=tok, max_model_len=512, num_kv_blocks=256).generate(chat_prompt_ids, GREEDY))


def test_micro_batches_cut_at_sequence_starts():
    t = torch.tensor
    # rows: decodes at 0 and 1, a prefill of 6 rows at 2, a decode at 8, a prefill of 3 at 9 (12 tokens)
    meta = PagedAttentionMetadata(slot_mapping=torch.arange(12), positions=torch.arange(12),
                                  decode_rows=t([0, 1, 8]), decode_blocks=t([5, 0, 6, 7, 9, 0]),
                                  decode_bias=torch.zeros(3, 1, 1, 32), decode_lens=t([3, 20, 7]),
                                  prefills=[(2, 6, t([1]), 6), (9, 3, t([2]), 3)])
    assert micro_batches(meta, 12, 1) == [(0, 12)]
    assert micro_batches(meta, 12, 2) == [(0, 8), (8, 12)]
    assert micro_batches(meta, 12, 20) == [(0, 1), (1, 2), (2, 8), (8, 9), (9, 12)]  # at most one per sequence
    part = split_meta(meta, 8, 12)
    assert part.decode_rows.tolist() == [0] and part.decode_blocks.tolist() == [9, 0]
    assert part.decode_lens.tolist() == [7] and part.slot_mapping.tolist() == [8, 9, 10, 11]
    assert [(s, q, c) for s, q, _, c in part.prefills] == [(1, 3, 3)]


def test_batch_and_prefix_hits_equal_tp1_and_stages_hold_their_layers(chat_prompt_ids, reference, one_thread):
    llm = pp_engine(num_kv_blocks=256, pipeline_micro_batches=4)
    assert tokens(llm.generate(chat_prompt_ids, GREEDY)) == reference
    again = llm.generate(chat_prompt_ids, GREEDY)
    assert tokens(again) == reference and all(o.metrics.num_cached_tokens >= 16 for o in again)
    s = llm.stats()
    assert s["prefix_cache_hit_tokens"] > 0 and s["pp_micro_batches"] == 4
    assert s["pp_recv_calls"] > s["pp_steps"]  # decode steps of 4 sequences ran as several micro-batches
    # 15 layers each (qkv 15 heads x 64 rows, o, gate/up, down, 2 norms); the embedding on rank 0 and, as the
    # tied LM head, on rank 1 with the final norm; K and V of 15 layers x 3 heads for 256 blocks of 16 tokens
    layer = (15 * 64 * 576 + 576 * 576 + 3 * 1536 * 576 + 2 * 576) * 4
    embedding = 49152 * 576 * 4
    assert s["pp_rank_weight_bytes"] == [embedding + 15 * layer, embedding + 15 * layer + 576 * 4]
    assert s["pp_rank_kv_bytes"] == [2 * 15 * 256 * 16 * 3 * 64 * 4] * 2
    # The same ranks at another count (notebook 08 measures every count on one group): rank 0 alone reads it
    group = llm.extensions["pipeline_parallel"].group
    group.set_micro_batches(1)
    assert tokens(llm.generate(chat_prompt_ids, GREEDY)) == reference
    after = llm.stats()
    assert after["pp_micro_batches"] == 1
    assert after["pp_recv_calls"] - s["pp_recv_calls"] == after["pp_steps"] - s["pp_steps"]  # one a step now
    with pytest.raises(ValueError, match="micro_batches must be a positive integer, got 0"):
        group.set_micro_batches(0)
    pids = group.pids
    llm.close()
    assert gone(pids)


def test_chunked_prefill_and_preemption_equal_tp1_then_a_killed_stage(chat_prompt_ids, reference, one_thread):
    llm = pp_engine(num_kv_blocks=9, max_num_batched_tokens=16)
    assert tokens(llm.generate(chat_prompt_ids, GREEDY)) == reference
    assert llm.stats()["preemptions"] > 0
    pids = llm.extensions["pipeline_parallel"].group.pids
    os.kill(pids[0], signal.SIGKILL)
    with pytest.raises(RankFailure, match="pipeline-parallel rank 1 died"):
        llm.generate(chat_prompt_ids, GREEDY)
    assert gone(pids)
    llm.close()


def test_refusals():
    with pytest.raises(ValueError, match="pipeline_parallel_size 31 exceeds the model's 30 layers"):
        pp_engine(pipeline_parallel_size=31)
    with pytest.raises(ValueError, match="the two are not combined yet"):
        pp_engine(tensor_parallel_size=2)
    with pytest.raises(ValueError, match="pipeline_parallel_size 2 does not support kv_cache_dtype="):
        pp_engine(kv_cache_dtype="fp8")
    with pytest.raises(ValueError, match="pipeline_micro_batches must be a positive integer or None, got 0"):
        pp_engine(pipeline_micro_batches=0)
