"""Tool calling on /v1/chat/completions (lab.serve.tools, issue 37 item 4), with the official `openai` client on the
real model: "required" and named choices constrained by the tools' schemas (whole and streamed; the arguments
validate against the tool's schema), parallel_tool_calls false, "none", "auto" refused where no parser knows the
model's format and parsed where one does (Hermes), a tool-result round trip, and each bad input a 400 naming it.

SmolLM2-135M-Instruct's template renders neither tools nor tool calls. A second server runs the same model under a
small Hermes-style template (tools in <tools></tools>, calls as <tool_call>...</tool_call>, results as
<tool_response>), written here, for "auto" and the round trip."""

import copy
import json
import re

import jsonschema
import openai
import pytest

from lab.engine import LLM
from lab.engine.chat import render, renders
from lab.serve import ServerThread
from lab.serve.tool_parsers import Hermes, RequiredScanner
from lab.serve.tools import Tool, ToolError, ToolPlan

MODEL = "smollm2-135m"
WEATHER = {"type": "object", "properties": {"city": {"type": "string"},
                                            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
           "required": ["city", "unit"]}
TIME = {"type": "object", "properties": {"tz": {"type": "string"}}, "required": ["tz"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                           "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "description": "The time in a time zone",
                                           "parameters": TIME}}]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
ASK = [{"role": "user", "content": "What is the weather in Paris, and what time is it in Tokyo?"}]
HERMES = """{%- if tools %}<|im_start|>system
You can call these functions, given as JSON schemas in <tools></tools>:
<tools>{% for tool in tools %}
{{ tool | tojson }}{% endfor %}
</tools>
To call one, write <tool_call>{"name": <function name>, "arguments": <arguments object>}</tool_call>.<|im_end|>
{% endif %}
{%- for message in messages %}
{%- if message.role == "assistant" and message.tool_calls %}<|im_start|>assistant
{{ message.content }}{% for call in message.tool_calls %}<tool_call>{"name": "{{ call.function.name }}", \
"arguments": {{ call.function.arguments | tojson }}}</tool_call>{% endfor %}<|im_end|>
{% elif message.role == "tool" %}<|im_start|>user
<tool_response>{{ message.content }}</tool_response><|im_end|>
{% else %}<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""


@pytest.fixture(scope="module")
def hermes_tokenizer(smollm):
    tok = copy.deepcopy(smollm[1])
    tok.chat_template = HERMES
    return tok


def _client(srv):
    return openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def client(smollm):
    model, tok = smollm
    with ServerThread(LLM(model, tokenizer=tok, num_kv_blocks=64, max_model_len=512, max_num_seqs=4)) as srv:
        yield _client(srv)


@pytest.fixture(scope="module")
def hermes(smollm, hermes_tokenizer):
    model, _ = smollm
    with ServerThread(LLM(model, tokenizer=hermes_tokenizer, num_kv_blocks=96, max_model_len=768, max_num_seqs=4)) as srv:
        yield _client(srv)


def _create(c, **kw):
    return c.chat.completions.create(**{"model": MODEL, "messages": ASK, "temperature": 0, "max_tokens": 64, **kw})


def _streamed(c, **kw):
    """The streamed answer as the client assembles it, and the raw chunks."""
    args = {"model": MODEL, "messages": ASK, "temperature": 0, "max_tokens": 64, **kw}
    chunks = list(c.chat.completions.create(**args, stream=True))
    with c.chat.completions.stream(**args) as stream:
        for _ in stream:
            pass
        final = stream.get_final_completion()
    return final.choices[0], chunks


def _calls(message) -> list[tuple[str, str]]:
    return [(t.function.name, t.function.arguments) for t in message.tool_calls or []]


def _valid_calls(message) -> None:
    ids = [t.id for t in message.tool_calls]
    assert len(set(ids)) == len(ids) and all(re.fullmatch(r"call_[0-9a-f]{24}", i) for i in ids), ids
    for t in message.tool_calls:
        assert t.type == "function"
        jsonschema.validate(json.loads(t.function.arguments), SCHEMAS[t.function.name])


# ---- the readers, alone ----------------------------------------------------------------------------------

def test_the_required_scanner_reads_calls_as_they_grow():
    text = '[{"name": "f", "arguments": {"q": "a \\"}]\\" b", "n": [1, {"x": 2}]}}, {"name": "g", "arguments": {}}]'
    whole = RequiredScanner()
    whole.feed(text)
    assert whole.done and [(c["name"], json.loads(c["arguments"])) for c in whole.calls] == \
        [(c["name"], c["arguments"]) for c in json.loads(text)]
    assert whole.calls[0]["arguments"] == '{"q": "a \\"}]\\" b", "n": [1, {"x": 2}]}' and whole.calls[1]["arguments"] == "{}"
    one = RequiredScanner()
    for ch in text:  # a character at a time: names once whole, arguments only ever growing
        one.feed(ch)
        for got, want in zip(one.calls, whole.calls):
            assert got["name"] in (None, want["name"]) and want["arguments"].startswith(got["arguments"])
            assert got["name"] is not None or not got["arguments"]
    assert one.calls == whole.calls and one.done


@pytest.mark.parametrize("text, content, calls", [
    ('Sure. <tool_call>{"name": "f", "arguments": {"a": 1}}</tool_call>', "Sure. ", [("f", '{"a": 1}')]),
    ('\n<tool_call>{"name": "f", "arguments": {}}</tool_call>\n<tool_call>{"name": "g", "arguments": {"b": "<"}}'
     '</tool_call>\n', None, [("f", "{}"), ("g", '{"b": "<"}')]),
    ('<tool_call>{"name": "nope", "arguments": {}}</tool_call>', '<tool_call>{"name": "nope", "arguments": {}}'
     '</tool_call>', []),  # not a known tool: the model's text, kept
    ('a <tool_call>{"name": "f", "argu', 'a <tool_call>{"name": "f", "argu', []),  # unclosed at the end
    ("x < y <tool_ca", "x < y <tool_ca", []),
])
def test_the_hermes_parser_gives_the_same_answer_at_every_split(text, content, calls):
    whole = Hermes({"f", "g"})
    got, found = whole.feed(text, True)
    assert (got or None, found) == (content, calls)
    for cut in range(len(text) + 1):
        split = Hermes({"f", "g"})
        a, _ = split.feed(text[:cut], False)
        b, found = split.feed(text[cut:], True)
        assert ((a + b) or None, found) == (content, calls), cut


def test_required_schema_is_an_array_of_calls_with_shared_defs():
    ref = {"type": "object", "properties": {"p": {"$ref": "#/$defs/P"}}, "$defs": {"P": {"type": "integer"}}}
    tools = [Tool.model_validate({"type": "function", "function": {"name": n, "parameters": ref}}) for n in "ab"]
    schema = ToolPlan("required", tools, parallel=False).schema()
    assert schema["minItems"] == 1 and schema["maxItems"] == 1 and schema["$defs"] == {"P": {"type": "integer"}}
    assert [b["properties"]["name"] for b in schema["items"]["anyOf"]] == [{"const": "a"}, {"const": "b"}]
    jsonschema.validate([{"name": "b", "arguments": {"p": 3}}], schema)
    assert "maxItems" not in ToolPlan("required", tools).schema()
    other = Tool.model_validate({"type": "function", "function": {"name": "c", "parameters": {
        **ref, "$defs": {"P": {"type": "string"}}}}})
    with pytest.raises(ToolError, match=r"tools\[2\]\.function\.parameters\.\$defs\.P differs"):
        ToolPlan("required", [*tools, other]).schema()


def test_which_templates_render_tools(smollm, hermes_tokenizer):
    assert not renders(smollm[1], "tools") and not renders(smollm[1], "tool_calls")
    assert renders(hermes_tokenizer, "tools") and renders(hermes_tokenizer, "tool_calls")
    assert not Hermes.fits(smollm[1]) and Hermes.fits(hermes_tokenizer)


# ---- over HTTP, with the official client --------------------------------------------------------------------

def test_required_whole_and_streamed(client):
    whole = _create(client, tools=TOOLS, tool_choice="required").choices[0]
    assert whole.finish_reason == "tool_calls" and whole.message.content is None and whole.message.tool_calls
    _valid_calls(whole.message)
    streamed, chunks = _streamed(client, tools=TOOLS, tool_choice="required")
    assert _calls(streamed.message) == _calls(whole.message) and streamed.finish_reason == "tool_calls"
    _valid_calls(streamed.message)
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    first = next(d for c in chunks for d in c.choices[0].delta.tool_calls or [])
    assert first.index == 0 and first.id.startswith("call_") and first.function.name == whole.message.tool_calls[0].function.name
    assert all(c.choices[0].delta.content is None for c in chunks if c.choices)


def test_a_named_function_whole_and_streamed(client):
    choice = {"type": "function", "function": {"name": "get_time"}}
    whole = _create(client, tools=TOOLS, tool_choice=choice).choices[0]
    assert whole.finish_reason == "tool_calls" and whole.message.content is None
    assert [n for n, _ in _calls(whole.message)] == ["get_time"]
    _valid_calls(whole.message)
    streamed, _ = _streamed(client, tools=TOOLS, tool_choice=choice)
    assert _calls(streamed.message) == _calls(whole.message) and streamed.finish_reason == "tool_calls"


def test_parallel_tool_calls_false_gives_exactly_one_call(hermes):
    several = _create(hermes, tools=TOOLS, tool_choice="required", max_tokens=80).choices[0]
    assert len(several.message.tool_calls) > 1  # this prompt makes the model call again and again
    one = _create(hermes, tools=TOOLS, tool_choice="required", parallel_tool_calls=False, max_tokens=80).choices[0]
    assert len(one.message.tool_calls) == 1 and one.finish_reason == "tool_calls"
    _valid_calls(one.message)


def test_none_answers_in_text(client):
    plain = _create(client, max_tokens=12).choices[0]
    none = _create(client, tools=TOOLS, tool_choice="none", max_tokens=12).choices[0]
    assert none.message.tool_calls is None and none.message.content == plain.message.content  # the template ignores tools
    assert none.finish_reason == plain.finish_reason == "length"


def test_auto_is_refused_without_a_parser(client):
    for kw in ({"tool_choice": "auto"}, {}):  # "auto" is the default when tools are sent
        with pytest.raises(openai.BadRequestError) as err:
            _create(client, tools=TOOLS, **kw)
        assert "needs a tool parser" in str(err.value) and MODEL in str(err.value) and err.value.param == "tool_choice"


def test_auto_parses_hermes_calls_whole_and_streamed(hermes):
    call = r'<tool_call>\{"name": "get_weather", "arguments": \{"city": "Paris", "unit": "celsius"\}\}</tool_call>'
    forced = {"extra_body": {"guided_regex": r"Sure\. " + call}, "max_tokens": 60}  # the model's text, steered
    whole = _create(hermes, tools=TOOLS, tool_choice="auto", **forced).choices[0]
    assert whole.finish_reason == "tool_calls" and whole.message.content == "Sure. "
    assert _calls(whole.message) == [("get_weather", '{"city": "Paris", "unit": "celsius"}')]
    streamed, _ = _streamed(hermes, tools=TOOLS, **forced)
    assert (streamed.message.content, _calls(streamed.message), streamed.finish_reason) == \
        ("Sure. ", _calls(whole.message), "tool_calls")
    free = _create(hermes, tools=TOOLS, max_tokens=24).choices[0]  # unsteered, the small model answers in prose
    chunks = list(_create(hermes, tools=TOOLS, max_tokens=24, stream=True))  # (the client's helper refuses "length")
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert "".join(d.content or "" for d in deltas) == free.message.content and free.message.tool_calls is None
    assert not any(d.tool_calls for d in deltas) and chunks[-1].choices[0].finish_reason == free.finish_reason


def test_a_tool_result_round_trip(client, hermes, hermes_tokenizer):
    first = _create(hermes, messages=ASK[:1], tools=TOOLS, tool_choice="required", parallel_tool_calls=False)
    call = first.choices[0].message.tool_calls[0]
    conversation = [*ASK, first.choices[0].message.model_dump(exclude_none=True),
                    {"role": "tool", "tool_call_id": call.id, "content": "18 degrees and sunny"}]
    prompt = render(hermes_tokenizer, conversation, tools=TOOLS)
    assert f'<tool_call>{{"name": "{call.function.name}", "arguments": {call.function.arguments}}}' in prompt
    assert "<tool_response>18 degrees and sunny</tool_response>" in prompt
    answer = _create(hermes, messages=conversation, tools=TOOLS, max_tokens=24).choices[0]
    assert answer.message.tool_calls is None and answer.message.content and answer.finish_reason in ("stop", "length")
    with pytest.raises(openai.BadRequestError) as err:  # SmolLM2's own template would drop the call
        _create(client, messages=conversation, tools=TOOLS, tool_choice="none")
    assert err.value.param == "messages" and "messages[1].tool_calls" in str(err.value)


def _fn(**kw):
    return [{"type": "function", "function": kw}]


BAD = [  # (request fields, the param the 400 names, words its message has)
    ({"tools": _fn(parameters=WEATHER)}, "tools.0.function.name", "Field required"),
    ({"tools": _fn(name="get weather")}, "tools.0.function.name", "get weather"),
    ({"tools": _fn(name="f", parameters="city")}, "tools.0.function.parameters", "valid dictionary"),
    ({"tools": _fn(name="f", parameters={"type": "string"})}, "tools.0.function.parameters", "'string'"),
    ({"tools": [{"type": "retrieval", "function": {"name": "f"}}]}, "tools.0.type", "'retrieval'"),
    ({"tools": [], "tool_choice": "none"}, "tools", "empty"),
    ({"tools": _fn(name="f") + _fn(name="f")}, "tools[1].function.name", "unique"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice.function.name",
     "'nope'"),
    ({"tool_choice": "required"}, "tool_choice", "needs tools"),
    ({"tool_choice": {"type": "function", "function": {"name": "get_time"}}}, "tool_choice", "needs tools"),
    ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice", "is one of ['none', 'auto', 'required'] or"),
    ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}}, None,
     "send one structured-output constraint"),
    ({"messages": [*ASK, {"role": "tool", "tool_call_id": "call_x", "content": "5"}]}, "messages", "'call_x'"),
    ({"messages": [{"role": "user", "content": "hi", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}]}, "messages", "only an assistant"),
    ({"messages": [*ASK, {"role": "assistant", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{city"}}]}]}, "messages",
     "arguments is not valid JSON"),
]


@pytest.mark.parametrize("fields, param, words", BAD, ids=[w for _, _, w in BAD])
def test_bad_tool_requests_are_400s_naming_the_field(client, fields, param, words):
    with pytest.raises(openai.BadRequestError) as err:
        _create(client, **fields)
    body = err.value.body
    assert body["type"] == "invalid_request_error" and words in body["message"] and body["param"] == param, body
    assert _create(client, max_tokens=2).choices[0].message.content  # still serving
