"""The official `openai` Python client against `lab serve` (loopback), on the real model: chat and completions,
whole and streamed, with the fields OpenAI clients send (system/developer roles, content parts, stop, seed,
max_completion_tokens, logprobs, n, stream_options.include_usage), answers equal to `LLM.chat`/`generate`, and
errors raised as the client's typed exceptions."""

import openai
import pytest

from lab.engine import LLM, SamplingParams
from lab.serve import ServerThread

MODEL = "smollm2-135m"
MESSAGES = [{"role": "developer", "content": "You answer briefly."},
            {"role": "user", "content": [{"type": "text", "text": "What is the capital of France?"}]}]


@pytest.fixture(scope="module")
def engine(smollm):
    model, tok = smollm
    return LLM(model, tokenizer=tok, num_kv_blocks=64, max_model_len=512, max_num_seqs=4)


@pytest.fixture(scope="module")
def client(smollm):
    model, tok = smollm
    with ServerThread(LLM(model, tokenizer=tok, num_kv_blocks=64, max_model_len=512, max_num_seqs=4)) as srv:
        yield openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=60)


def test_chat_whole_and_streamed_with_usage(client, engine):
    want = engine.chat(MESSAGES, SamplingParams(temperature=0, max_tokens=16))[0]
    whole = client.chat.completions.create(model=MODEL, messages=MESSAGES, temperature=0, max_completion_tokens=16,
                                           seed=7)
    assert whole.choices[0].message.content == want.text and want.text
    assert whole.usage.completion_tokens == len(want.token_ids)
    chunks = list(client.chat.completions.create(model=MODEL, messages=MESSAGES, temperature=0, max_tokens=16,
                                                 stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == want.text
    assert chunks[-1].usage is not None and chunks[-1].usage.total_tokens == whole.usage.total_tokens


def test_completions_with_stop_and_logprobs(client, engine):
    prompt = "The three primary colors are"
    want = engine.generate([prompt], SamplingParams(temperature=0, max_tokens=24, stop=[","], logprobs=2))[0]
    got = client.completions.create(model=MODEL, prompt=prompt, temperature=0, max_tokens=24, stop=[","], logprobs=2)
    assert got.choices[0].text == want.text and got.choices[0].finish_reason == want.finish_reason
    lp = got.choices[0].logprobs
    assert lp.token_logprobs == pytest.approx([e[t].logprob for t, e in zip(want.token_ids, want.logprobs)],
                                              abs=1e-4)
    chat = client.chat.completions.create(model=MODEL, messages=MESSAGES, temperature=0, max_tokens=4, logprobs=True,
                                          top_logprobs=3)
    content = chat.choices[0].logprobs.content
    assert len(content) == 4 and all(len(c.top_logprobs) == 3 for c in content)


def test_n_samples_come_back_as_indexed_choices(client, engine):
    want = engine.chat(MESSAGES, SamplingParams(temperature=1.0, seed=3, max_tokens=8, n=2))[0].outputs
    got = client.chat.completions.create(model=MODEL, messages=MESSAGES, temperature=1.0, seed=3, max_tokens=8, n=2)
    assert [c.index for c in got.choices] == [0, 1]
    assert [c.message.content for c in got.choices] == [w.text for w in want]


def test_errors_are_the_clients_typed_exceptions(client):
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=MODEL, messages=MESSAGES, temperature=-1)
    assert "temperature" in str(err.value)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="gpt-4o", messages=MESSAGES)
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}])
    assert "only text parts" in str(err.value)
