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


@pytest.mark.parametrize("kw, name", [
    (dict(temperature=-0.5), "temperature"), (dict(temperature=float("nan")), "temperature"),
    (dict(temperature=float("inf")), "temperature"), (dict(temperature="0.7"), "temperature"),
    (dict(top_k=-2), "top_k"), (dict(top_k=2.5), "top_k"), (dict(top_k=True), "top_k"),
    (dict(top_p=0.0), "top_p"), (dict(top_p=1.5), "top_p"), (dict(top_p=float("nan")), "top_p"),
    (dict(seed=2**64), "seed"), (dict(seed=1.5), "seed"), (dict(ignore_eos="yes"), "ignore_eos"),
    (dict(stop_token_ids="12"), "stop_token_ids"), (dict(stop_token_ids=[3, -1]), r"stop_token_ids\[1\]")])
def test_every_sampling_parameter_is_checked_at_the_door_and_named(kw, name):
    with pytest.raises(ValueError, match=name):
        SamplingParams(**kw)


def test_vllm_spellings_of_sampling_parameters_are_accepted():
    assert not SamplingParams(top_k=-1).greedy and SamplingParams(seed=2**64 - 1).seed == 2**64 - 1
    assert SamplingParams(temperature=1e-40).greedy and not SamplingParams(temperature=1e-4).greedy


def test_an_underflowing_temperature_decodes_greedily_instead_of_failing_the_step():
    llm = make_llm()
    want = llm.generate([prompt(12)], greedy(6))[0].token_ids
    tiny = SamplingParams(temperature=1e-40, max_tokens=6, ignore_eos=True)
    assert llm.generate([prompt(12)], tiny)[0].token_ids == want  # before: NaN probabilities, the step raised


def test_a_request_that_fails_inside_a_step_fails_alone(monkeypatch, caplog):
    """Defence in depth: a step that raises is retried request by request; only the failing one ends (with
    "error" and its message), its blocks return, the others get their tokens and the engine goes on."""
    import lab.engine.sampler as sampler_module

    real = sampler_module.choose

    def sample(logits, params, generators):
        if any(p.seed == 666 for p in params):
            raise RuntimeError("poisoned row")
        return real(logits, params, generators)

    good = [prompt(30), prompt(21, start=11)]
    expected = [o.token_ids for o in make_llm().generate(good, [greedy(8), greedy(5)])]
    monkeypatch.setattr(sampler_module, "choose", sample)
    llm = make_llm()
    poisoned = SamplingParams(temperature=0.5, seed=666, max_tokens=8)
    outs = llm.generate([good[0], prompt(9, start=5), good[1]], [greedy(8), poisoned, greedy(5)])
    assert [o.token_ids for o in (outs[0], outs[2])] == expected
    assert [o.finish_reason for o in outs] == ["length", "error", "length"]
    assert "poisoned row" in outs[1].error and outs[0].error is None
    assert "failed in an engine step" in caplog.text
    assert_untouched(llm)
    assert llm.generate([good[1]], greedy(5))[0].token_ids == expected[1]  # still usable


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
    (dict(kv_cache_dtype="fp9"), "kv_cache_dtype"),
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
        finished.update((o.request_id, o) for o in (d.output for d in llm.step() if d.finished))
    assert llm.has_unfinished()
    bad_prompt, bad_params = BAD_REQUESTS[bad]
    with pytest.raises(ValueError):
        llm.add_request(bad_prompt(), bad_params())
    assert set(llm.sequences) == set(ids) - set(finished)
    for _ in range(200):
        if not llm.has_unfinished():
            break
        finished.update((o.request_id, o) for o in (d.output for d in llm.step() if d.finished))
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


@pytest.mark.parametrize("bad, match", [
    ([3, 1.7], "token ids must be integers; got 1.7"), ([3, True], "token ids must be integers; got True"),
    (None, "a prompt is a string, a list of token ids or a dict; got NoneType"),
    ({"text": "hi"}, r"got the keys \['text'\]"), ({"prompt": "a", "prompt_token_ids": [3]}, "one of 'prompt'")])
def test_malformed_prompts_are_named_with_their_index_in_the_batch(bad, match):
    llm = make_llm()
    with pytest.raises(ValueError, match=r"prompts\[1\]: .*" + match):
        llm.generate([prompt(5), bad, prompt(6)], greedy(2))
    assert_untouched(llm)


def test_an_empty_batch_is_refused_and_vectors_of_token_ids_are_prompts():
    llm = make_llm()
    with pytest.raises(ValueError, match="no prompts"):
        llm.generate([], greedy(2))
    want = llm.generate([prompt(7)], greedy(3))[0].token_ids
    assert llm.generate([torch.tensor(prompt(7))], greedy(3))[0].token_ids == want


def test_text_no_tokenizer_can_encode_is_named_and_refused_at_the_door(smollm):
    """A lone surrogate ("\\ud800", valid in JSON and in a Python str) is not Unicode text: the tokenizer raised a
    TypeError about its input type. Now each place it can come in is a ValueError naming it (issue 37, item 5)."""
    from lab.engine import StructuredOutputsParams

    model, tok = smollm
    llm = LLM(model, tokenizer=tok, num_kv_blocks=16, max_model_len=128, max_num_seqs=2)
    with pytest.raises(ValueError, match=r"prompts\[1\]: prompt contains '\\ud800' at character 1"):
        llm.generate(["ok", "a\ud800"], greedy(2))
    with pytest.raises(ValueError, match=r"messages\[0\]\.content contains '\\udfff'"):
        llm.chat([{"role": "user", "content": "x\udfff"}], greedy(2))
    with pytest.raises(ValueError, match=r"stop\[1\] contains '\\ud800'"):
        SamplingParams(stop=["x", "\ud800"])
    with pytest.raises(ValueError, match=r"choice\[0\] contains '\\ud800'"):
        StructuredOutputsParams(choice=["\ud800"])
    with pytest.raises(ValueError, match=r"prompts\[0\]: cache_salt contains '\\ud800'"):
        llm.generate([{"prompt_token_ids": [1, 2], "cache_salt": "a\ud800"}], greedy(2))
    assert_untouched(llm)
    assert llm.generate(["The capital of France is"], greedy(3))[0].text  # still serving
