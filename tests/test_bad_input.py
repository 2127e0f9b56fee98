"""Bad requests and bad engine configurations are refused with a clear ValueError, and a refused
request leaves the engine serving the good ones as if nothing had happened."""

from __future__ import annotations

import functools
import re

import pytest
import torch

from lab.engine import LLM, SamplingParams
from lab.models import load_model

VOCAB = 512  # the tiny preset


pytestmark = pytest.mark.usefixtures("one_thread")


@functools.lru_cache(maxsize=None)
def tiny_model():
    model, tokenizer = load_model("random:tiny", dtype=torch.float32, device="cpu")
    assert tokenizer is None
    return model


def make_llm(**kw) -> LLM:
    cfg = dict(block_size=4, num_kv_blocks=64, max_model_len=64, max_num_seqs=4, max_num_batched_tokens=32)
    return LLM(tiny_model(), **{**cfg, **kw})


def greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)


def prompt(n: int, start: int = 3) -> list[int]:
    return [start + (7 * i) % 400 for i in range(n)]


def assert_untouched(llm: LLM) -> None:
    assert not llm.has_unfinished() and llm.sequences == {}
    assert llm.block_manager.num_free_blocks == llm.block_manager.num_blocks


def has_number(message: str, n: int) -> bool:
    return re.search(rf"(?<!\d){n}(?!\d)", message) is not None


# ---- requests -----------------------------------------------------------------------------------

def test_prompt_plus_max_tokens_over_max_model_len():
    llm = make_llm(max_model_len=64)
    with pytest.raises(ValueError) as err:
        llm.add_request(prompt(47), greedy(23))
    msg = str(err.value)
    assert has_number(msg, 47) and has_number(msg, 23) and has_number(msg, 64), msg
    assert_untouched(llm)
    with pytest.raises(ValueError, match="max_model_len"):
        llm.add_request(prompt(65), greedy(1))  # the prompt alone is too long


def test_exactly_max_model_len_is_accepted():
    llm = make_llm(max_model_len=64)
    [out] = llm.generate([prompt(41)], greedy(23))
    assert len(out.token_ids) == 23 and out.finish_reason == "length"
    assert_untouched(llm)


@pytest.mark.parametrize("empty", [[], {"prompt_token_ids": []}])
def test_empty_prompt(empty):
    llm = make_llm()
    with pytest.raises(ValueError, match="empty"):
        llm.add_request(empty, greedy(4))
    with pytest.raises(ValueError, match="empty"):
        llm.generate([prompt(5), empty], greedy(4))
    assert_untouched(llm)


@pytest.mark.parametrize("max_tokens", [0, -1, -100, 2.0, None])
def test_max_tokens_must_be_a_positive_integer(max_tokens):
    with pytest.raises(ValueError, match="max_tokens"):
        SamplingParams(max_tokens=max_tokens)


@pytest.mark.parametrize("kw", [dict(temperature=-0.5), dict(top_k=-1), dict(top_p=0.0), dict(top_p=1.5)])
def test_other_bad_sampling_params(kw):
    with pytest.raises(ValueError):
        SamplingParams(**kw)


def test_request_needing_more_blocks_than_the_pool():
    llm = make_llm(block_size=4, num_kv_blocks=4, max_model_len=64)
    with pytest.raises(ValueError) as err:
        llm.add_request(prompt(10), greedy(8))  # 18 tokens -> 5 blocks of 4 > 4
    msg = str(err.value)
    assert "block" in msg and has_number(msg, 5) and has_number(msg, 4), msg
    assert_untouched(llm)
    # 16 tokens fill the pool exactly and are served
    [out] = llm.generate([prompt(10)], greedy(6))
    assert len(out.token_ids) == 6
    assert_untouched(llm)


@pytest.mark.parametrize("ids", [[-1], [VOCAB], [3, 4, VOCAB + 88], [10**9]])
def test_token_ids_outside_the_vocabulary(ids):
    llm = make_llm()
    with pytest.raises(ValueError, match="vocabulary"):
        llm.add_request(ids, greedy(2))
    with pytest.raises(ValueError, match="vocabulary"):
        llm.add_request({"prompt_token_ids": ids}, greedy(2))
    assert_untouched(llm)


def test_vocabulary_edges_are_accepted():
    llm = make_llm()
    [out] = llm.generate([[0, VOCAB - 1, 5]], greedy(3))
    assert out.prompt_token_ids == [0, VOCAB - 1, 5] and len(out.token_ids) == 3


@pytest.mark.parametrize("text", ["Hello, world", {"prompt": "Hello"}, {"prompt": "Hi", "cache_salt": "a"}])
def test_string_prompt_without_tokenizer(text):
    llm = make_llm()
    assert llm.tokenizer is None
    with pytest.raises(ValueError, match="tokenizer"):
        llm.add_request(text, greedy(2))
    with pytest.raises(ValueError, match="tokenizer"):
        llm.generate(text, greedy(2))
    assert_untouched(llm)


def test_params_list_of_the_wrong_length():
    llm = make_llm()
    with pytest.raises(ValueError):
        llm.generate([prompt(4), prompt(5)], [greedy(2)])
    assert_untouched(llm)


# ---- engine configurations ----------------------------------------------------------------------

@pytest.mark.parametrize("kw, word", [
    (dict(attention_backend="flash"), "attention_backend"),
    (dict(attention_backend=""), "attention_backend"),
    (dict(kv_cache_dtype="fp8"), "kv_cache_dtype"),
    (dict(block_size=0), "block_size"),
    (dict(block_size=-4), "block_size"),
    (dict(num_kv_blocks=0), "num_kv_blocks"),
    (dict(max_model_len=0), "max_model_len"),
    (dict(max_num_seqs=0), "max_num_seqs"),
    (dict(max_num_batched_tokens=0), "max_num_batched_tokens"),
    (dict(enable_chunked_prefill=False, max_model_len=64, max_num_batched_tokens=63), "chunked prefill"),
    (dict(max_model_len=5000), "max_model_len"),  # beyond the model's rotary table (4096)
])
def test_invalid_engine_config(kw, word):
    with pytest.raises(ValueError, match=word):
        make_llm(**kw)


def test_chunked_prefill_off_with_a_big_enough_budget_is_valid():
    llm = make_llm(enable_chunked_prefill=False, max_model_len=32, max_num_batched_tokens=32)
    outs = llm.generate([prompt(20), prompt(30, start=9)], greedy(2))
    assert [len(o.token_ids) for o in outs] == [2, 2]


# ---- the engine keeps serving -------------------------------------------------------------------

BAD_REQUESTS = [
    (lambda: prompt(60), lambda: greedy(10)),  # over max_model_len
    (lambda: [], lambda: greedy(4)),  # empty
    (lambda: [3, VOCAB], lambda: greedy(4)),  # outside the vocabulary
    (lambda: "text", lambda: greedy(4)),  # no tokenizer
]


@pytest.mark.parametrize("bad", range(len(BAD_REQUESTS)))
def test_engine_keeps_serving_after_a_bad_request(bad):
    good = [prompt(30), prompt(21, start=11)]
    params = [greedy(12), greedy(9)]
    expected = [o.token_ids for o in make_llm().generate(good, params)]
    assert [len(t) for t in expected] == [12, 9]

    llm = make_llm()
    ids = [llm.add_request(p, sp) for p, sp in zip(good, params)]
    finished = {}
    for _ in range(3):
        finished.update((o.request_id, o) for o in llm.step())
    assert llm.has_unfinished()
    bad_prompt, bad_params = BAD_REQUESTS[bad]
    with pytest.raises(ValueError):
        llm.add_request(bad_prompt(), bad_params())
    assert set(llm.sequences) == set(ids) - set(finished)
    for _ in range(200):
        if not llm.has_unfinished():
            break
        finished.update((o.request_id, o) for o in llm.step())
    assert not llm.has_unfinished()
    assert sorted(finished) == sorted(ids)
    assert [finished[i].token_ids for i in ids] == expected
    assert_untouched(llm)

    # generate validates every prompt before queueing any
    with pytest.raises(ValueError):
        llm.generate([*good, bad_prompt()], [*params, bad_params()])
    assert not llm.has_unfinished() and llm.sequences == {}
    assert llm.step() == []
    assert [o.token_ids for o in llm.generate(good, params)] == expected
    assert_untouched(llm)
