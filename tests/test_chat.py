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
