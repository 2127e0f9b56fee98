"""Stop strings (vLLM's `SamplingParams.stop`), on the real model: matched across token boundaries, excluded
from the text unless asked, the token that completed one kept; the same through the server, streamed or not."""

import json

import httpx
import pytest

from lab.engine import LLM, SamplingParams
from lab.serve import ServerThread

PROMPT = "Explain what a KV cache is in two sentences."


@pytest.fixture(scope="module")
def llm(smollm):
    model, tok = smollm
    return LLM(model, tokenizer=tok, num_kv_blocks=64, max_model_len=256)


@pytest.fixture(scope="module")
def base(llm):
    [out] = llm.chat([{"role": "user", "content": PROMPT}], SamplingParams(temperature=0, max_tokens=40,
                                                                          ignore_eos=True))
    return out


def _spanning_stop(llm, out) -> tuple[str, int]:
    """A 5-character piece of the greedy text that no single token holds, and the index of the token ending it."""
    tok = llm.tokenizer
    pieces = [tok.decode(out.token_ids[:i + 1], skip_special_tokens=True) for i in range(len(out.token_ids))]
    for i in range(2, len(pieces)):
        start = len(pieces[i - 1]) - 2  # two characters from token i - 1, the rest from token i
        stop = out.text[start:start + 5]
        if len(stop) == 5 and len(pieces[i]) >= start + 5 and out.text.find(stop) == start and stop.strip():
            return stop, i
    pytest.skip("no 5-character piece spans two tokens in this output")


def test_a_stop_string_across_tokens_ends_the_output_before_it(llm, base):
    stop, last = _spanning_stop(llm, base)
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, stop=["never appears", stop])
    [out] = llm.chat([{"role": "user", "content": PROMPT}], params)
    assert out.finish_reason == "stop" and out.text == base.text[:base.text.find(stop)]
    assert out.token_ids == base.token_ids[:last + 1]  # the completing token stays, as in vLLM
    keep = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, stop=stop, include_stop_str_in_output=True)
    [kept] = llm.chat([{"role": "user", "content": PROMPT}], keep)
    assert kept.text == base.text[:base.text.find(stop) + len(stop)]


@pytest.mark.parametrize("stop", ["", [""], [3], 5])
def test_bad_stop_values_are_refused(stop):
    with pytest.raises(ValueError, match="stop must be"):
        SamplingParams(stop=stop)


def test_stop_strings_need_a_tokenizer():
    from lab.models import load_model

    model, _ = load_model("random:tiny", dtype="float32")
    with pytest.raises(ValueError, match="stop strings need a tokenizer"):
        LLM(model, num_kv_blocks=16, max_model_len=64).generate([[3, 4, 5]], SamplingParams(stop="x"))


def test_the_server_cuts_at_stop_strings_whole_and_streamed(smollm, llm, base):
    stop, _ = _spanning_stop(llm, base)
    model, tok = smollm
    body = {"model": "smollm2-135m", "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 40,
            "temperature": 0, "ignore_eos": True, "stop": stop}
    with ServerThread(LLM(model, tokenizer=tok, num_kv_blocks=64, max_model_len=256)) as srv:
        whole = httpx.post(srv.url + "/v1/chat/completions", json=body, timeout=60).json()
        streamed = []
        with httpx.stream("POST", srv.url + "/v1/chat/completions", json={**body, "stream": True}, timeout=60) as r:
            for line in r.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    streamed.append(json.loads(line[6:]))
    want = base.text[:base.text.find(stop)]
    assert whole["choices"][0]["message"]["content"] == want and whole["choices"][0]["finish_reason"] == "stop"
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in streamed if c.get("choices"))
    assert text == want


def test_stop_strings_decode_a_tail_each_step_not_the_whole_output(llm, monkeypatch):
    """A defect: every step decoded the whole output to look for the stop strings, so a request's checks grew
    with the square of its length. Now each step decodes a tail as long as the stop strings need; the same
    output comes back."""
    # a short stop string, so 40 tokens tell a tail from the whole output: n(n + 1) / 2 = 820 decoded tokens
    # against at most 14 a step (it took 120 tokens with "never appears": 18 s against 3.5 s)
    stop, n_out = "§§", 40
    params = SamplingParams(temperature=0, max_tokens=n_out, ignore_eos=True, stop=[stop])
    [plain] = llm.chat([{"role": "user", "content": PROMPT}], SamplingParams(temperature=0, max_tokens=n_out,
                                                                           ignore_eos=True))
    decoded, decode = [], llm.tokenizer.decode
    monkeypatch.setattr(llm.tokenizer, "decode", lambda ids, **kw: decoded.append(len(ids)) or decode(ids, **kw))
    [out] = llm.chat([{"role": "user", "content": PROMPT}], params)
    assert out.token_ids == plain.token_ids and out.text == plain.text and out.finish_reason == "length"
    n = len(out.token_ids)
    assert max(decoded[:-1]) <= 4 * len(stop) + 4  # the tails; the last decode is the output's text
    assert sum(decoded) < n * (4 * len(stop) + 4) + 2 * n < n * (n + 1) / 2  # was n(n + 1) / 2
