"""A hostile client against `lab serve` (loopback, bounded in count and time), on a small random-weight model:
malformed and wrongly typed bodies, huge bodies, non-finite and underflowing numbers, bad requests interleaved
with good ones under concurrency, and a property-based stream of random valid and invalid requests
(hypothesis). After each, the server answers /health, every good request got `LLM.generate`'s greedy tokens,
and every KV block is free."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lab.engine import LLM, SamplingParams
from lab.models import load_model
from lab.serve import ServerThread

MODEL = "tiny"
VOCAB = 512
MAX_LEN = 64


@pytest.fixture(scope="module")
def tiny():
    model, _ = load_model("random:tiny", dtype=torch.float32, device="cpu")
    return model


@pytest.fixture(scope="module")
def server(tiny):
    llm = LLM(tiny, num_kv_blocks=96, block_size=4, max_model_len=MAX_LEN, max_num_seqs=4,
              max_num_batched_tokens=32)
    with ServerThread(llm, model_name=MODEL) as srv:
        yield srv


@pytest.fixture(scope="module")
def reference(tiny):
    llm = LLM(tiny, num_kv_blocks=96, block_size=4, max_model_len=MAX_LEN)

    def tokens(prompt: list[int], max_tokens: int) -> list[int]:
        return llm.generate([prompt], SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True))[0].token_ids
    return tokens


def _healthy_and_idle(server, timeout: float = 30.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        s = server.engine.llm.stats()
        if s["running"] == 0 and s["waiting"] == 0 and s["kv_blocks_used"] == 0:
            return httpx.get(server.url + "/health", timeout=10).status_code == 200
        time.sleep(0.05)
    return False


def _good(prompt: list[int], max_tokens: int) -> dict:
    return {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "return_token_ids": True}


HOSTILE_BODIES = [
    b"", b"{", b"[]", b"null", b'"text"', b"{}" * 1000, b'{"model": "tiny", "prompt": [1, 2], "max_tokens": 1e999}',
    b'{"model": "tiny", "prompt": [1, 2], "temperature": NaN}', b'{"model": "tiny", "prompt": [1, 2], "top_p": -Infinity}',
    b'{"model": "tiny", "prompt": [1, 2], "seed": 18446744073709551616}',
    b'{"model": "tiny", "prompt": [1.5, 2]}', b'{"model": "tiny", "prompt": [[1], [2]]}', b'{"model": "tiny", "prompt": []}',
    b'{"model": "tiny", "prompt": [1, 2], "max_tokens": "5"}', b'{"model": "tiny", "prompt": {"a": 1}}',
    b'{"model": "tiny", "prompt": [1, 2], "logit_bias": {"abc": 1}}',
    b'{"model": "tiny", "prompt": [1, 2], "logit_bias": {"5": 101}}',
    b'{"model": "tiny", "prompt": [1, 2], "logit_bias": {"512": 1}}',  # outside the vocabulary
    b'{"model": "tiny", "prompt": [1, 2], "logit_bias": {"5": NaN}}',
    json.dumps({"model": "tiny", "prompt": list(range(1, 400))}).encode(),  # over max_model_len
    json.dumps({"model": "tiny", "prompt": "x" * 2_000_000}).encode(),  # a 2 MB body (and no tokenizer)
]


def test_hostile_bodies_get_4xx_beside_good_requests(server, reference):
    url = server.url + "/v1/completions"
    goods = [([3 + i, 40, 7 * i + 1], 6 + i) for i in range(4)]

    async def main():
        async with httpx.AsyncClient(timeout=60) as c:
            ok = [c.post(url, json=_good(p, n)) for p, n in goods]
            bad = [c.post(url, content=b, headers={"content-type": "application/json"}) for b in HOSTILE_BODIES]
            return await asyncio.gather(*ok, *bad)

    responses = asyncio.run(main())
    for r, (p, n) in zip(responses, goods):
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["token_ids"] == reference(p, n)
    for r, body in zip(responses[len(goods):], HOSTILE_BODIES):
        assert 400 <= r.status_code < 500, (body[:80], r.status_code, r.text[:200])
        err = r.json()["error"]
        assert err["type"] == "invalid_request_error" and err["message"], r.text[:200]
    assert _healthy_and_idle(server)


def test_disconnects_mid_stream_beside_good_requests(server, reference):
    url = server.url + "/v1/completions"

    async def leave_early(c):
        async with c.stream("POST", url, json={**_good([5, 6, 7], 40), "stream": True}) as r:
            async for line in r.aiter_lines():
                if line.startswith("data: "):
                    return  # closes the connection after the first chunk

    async def main():
        async with httpx.AsyncClient(timeout=60) as c:
            return await asyncio.gather(*(leave_early(c) for _ in range(3)), c.post(url, json=_good([9, 10], 12)))

    *_, ok = asyncio.run(main())
    assert ok.status_code == 200 and ok.json()["choices"][0]["token_ids"] == reference([9, 10], 12)
    assert _healthy_and_idle(server)


_valid = st.fixed_dictionaries({
    "prompt": st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=20),
    "max_tokens": st.integers(1, 12)})
_invalid = st.one_of(
    st.fixed_dictionaries({"prompt": st.lists(st.integers(VOCAB, 10**12), min_size=1, max_size=3)}),
    st.fixed_dictionaries({"prompt": st.just([1, 2]), "temperature": st.sampled_from([-1.0, "hot", None, []])}),
    st.fixed_dictionaries({"prompt": st.just([1, 2]), "max_tokens": st.sampled_from([0, -3, 10**6, 2.5, True])}),
    st.fixed_dictionaries({"prompt": st.just([1, 2]), "top_k": st.sampled_from([-2, 1.5, "k"])}),
    st.fixed_dictionaries({"prompt": st.just([1, 2]), "n": st.sampled_from([0, 65, 1.5, "2"])}),
    st.fixed_dictionaries({"prompt": st.just([1, 2]), "unknown_field": st.integers()}),
    st.fixed_dictionaries({"prompt": st.text(max_size=5)}))  # no tokenizer on this model


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.booleans(), _valid, _invalid), min_size=2, max_size=6))
def test_random_streams_of_valid_and_invalid_requests(server, reference, stream):
    url = server.url + "/v1/completions"
    bodies = [({**_good(v["prompt"], v["max_tokens"])}, True) if ok else ({"model": MODEL, **bad}, False)
              for ok, v, bad in stream]

    async def main():
        async with httpx.AsyncClient(timeout=60) as c:
            return await asyncio.gather(*(c.post(url, json=b) for b, _ in bodies))

    for r, (body, ok) in zip(asyncio.run(main()), bodies):
        if ok:
            assert r.status_code == 200, r.text
            assert r.json()["choices"][0]["token_ids"] == reference(body["prompt"], body["max_tokens"])
        else:
            assert 400 <= r.status_code < 500, (body, r.status_code, r.text[:200])
    assert _healthy_and_idle(server)


# ---- text no tokenizer can encode (issue 37, item 5), on the real model's tokenizer --------------------

@pytest.fixture(scope="module")
def text_server(smollm):
    model, tok = smollm
    with ServerThread(LLM(model, tokenizer=tok, num_kv_blocks=32, max_model_len=256, max_num_seqs=2)) as srv:
        yield srv


SMOL = "smollm2-135m"
_CHAT = f'"model": "{SMOL}", "max_tokens": 2'
_TOOL = '{"type": "function", "function": {"name": "f", "description": %s, "parameters": {"type": "object"}}}'
BAD_TEXT = [  # (path, raw body, the field the 400 must name); "\\ud800" is JSON's escape of a lone surrogate
    ("chat", '{%s, "messages": [{"role": "user", "content": "a\\ud800"}]}' % _CHAT, "messages[0].content"),
    ("chat", '{%s, "messages": [{"role": "user", "content": [{"type": "text", "text": "\\udfff"}]}]}' % _CHAT,
     "messages[0].content[0].text"),
    ("chat", '{%s, "messages": [{"role": "user", "content": "a"}], "stop": ["x", "\\ud800"]}' % _CHAT, "stop[1]"),
    ("chat", '{%s, "messages": [{"role": "user", "content": "a"}], "tools": [%s], "tool_choice": "none"}'
     % (_CHAT, _TOOL % '"\\ud800"'), "tools[0].function.description"),
    ("chat", '{%s, "messages": [{"role": "user", "content": "a", "name": "\\ud800"}]}' % _CHAT, "messages[0].name"),
    ("completions", '{%s, "prompt": "a\\ud800b"}' % _CHAT, "prompt"),
    ("completions", '{%s, "prompt": "a", "stop": "\\ud800"}' % _CHAT, "stop"),
    ("completions", '{%s, "prompt": "a", "guided_choice": ["yes", "\\ud800"]}' % _CHAT, "guided_choice[1]"),
    ("completions", '{%s, "prompt": "a", "response_format": {"type": "json_schema", "json_schema": {"name": "x", '
     '"schema": {"type": "object", "properties": {"\\ud800": {"type": "string"}}}}}}' % _CHAT,
     "response_format.json_schema.schema.properties"),
]
RAW_BAD_BODIES = [  # bytes that are not UTF-8 text: invalid bytes, and a surrogate encoded as UTF-8 bytes
    (f'{{"model": "{SMOL}", "prompt": "a'.encode() + b"\xff\xfe" + b'"}', "UTF-8"),
    (f'{{"model": "{SMOL}", "prompt": "a'.encode() + b"\xed\xa0\x80" + b'"}', "prompt"),
    (f'{{"model": "{SMOL}", "prompt": "a'.encode() + b"\xc3" + b'"}', "UTF-8"),  # a character cut short
]


@pytest.mark.parametrize("path, body, param", BAD_TEXT, ids=[b[2] for b in BAD_TEXT])
def test_text_no_tokenizer_can_encode_is_a_400_naming_the_field(text_server, path, body, param):
    url = text_server.url + ("/v1/chat/completions" if path == "chat" else "/v1/completions")
    r = httpx.post(url, content=body.encode(), headers={"content-type": "application/json"}, timeout=60)
    assert r.status_code == 400, r.text[:300]
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and ("ud800" in err["message"] or "udfff" in err["message"]), err
    assert err["param"] == param and err["message"].startswith(param), err
    good = httpx.post(text_server.url + "/v1/chat/completions", timeout=60, json={
        "model": SMOL, "max_tokens": 3, "temperature": 0, "messages": [{"role": "user", "content": "Hi"}]})
    assert good.status_code == 200 and good.json()["choices"][0]["message"]["content"], good.text
    assert _healthy_and_idle(text_server)


@pytest.mark.parametrize("body, words", RAW_BAD_BODIES)
def test_a_body_that_is_not_utf8_text_is_a_400(text_server, body, words):
    r = httpx.post(text_server.url + "/v1/completions", content=body, headers={"content-type": "application/json"},
                   timeout=60)
    assert r.status_code == 400, r.text[:300]
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and words in err["message"], err
    assert _healthy_and_idle(text_server)
