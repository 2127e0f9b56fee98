"""Chat messages to a prompt: the OpenAI / vLLM message shapes, checked, then the tokenizer's chat template.

`LLM.chat` and the server's /v1/chat/completions both go through `render`, so a conversation reaches the model
the same way from Python and over HTTP. Accepted, as OpenAI's API and vLLM accept them: roles system,
developer (OpenAI's newer name for system: rendered as system, which is what chat templates know), user,
assistant and tool; content as a string or as a list of parts, of which text parts are joined (other part types,
such as images, are refused by name: this model reads text only).

Tool calling (OpenAI's shapes): an assistant message may carry `tool_calls` ([{"id", "type": "function",
"function": {"name", "arguments": JSON text}}]) and then needs no content; a `tool` message answers one of them
by its `tool_call_id`, which must name a call made earlier in the conversation. As vLLM does, the arguments'
JSON text is parsed into a dict before rendering, since templates write it out themselves (`| tojson`). The
template renders these messages or the conversation is refused: a template that ignores `tool_calls` (SmolLM2's
renders only role and content) would show the model an empty assistant turn, so such a conversation is a
ValueError naming why (`renders`, which tries the template once with a marker and caches the answer). `tools`
are passed to the template as given; whether it renders them is `renders(tokenizer, "tools")`.
"""

from __future__ import annotations

import json

from .text import check_text

ROLES = ("system", "developer", "user", "assistant", "tool")
_MARK = "lab_probe_fn_7f3a"  # a function name no template writes by itself
_RENDERS: dict[tuple[str, str], bool] = {}  # (chat template, what) -> whether it shows


def _content(content, where: str) -> str:
    if isinstance(content, str):
        check_text(content, f"{where}.content")
        return content
    if not isinstance(content, list):
        raise ValueError(f"{where}.content must be a string or a list of parts, got {type(content).__name__}")
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind != "text" or not isinstance(part.get("text"), str):
            raise ValueError(f"{where}.content[{j}] is a {kind or type(part).__name__!s} part; only text parts "
                             f"({{'type': 'text', 'text': ...}}) are supported")
        check_text(part["text"], f"{where}.content[{j}].text")
        texts.append(part["text"])
    return "".join(texts)


def _tool_calls(calls, where: str) -> list[dict]:
    """An assistant's tool calls, checked, with each call's arguments parsed from their JSON text."""
    if not isinstance(calls, list) or not calls:
        raise ValueError(f"{where}.tool_calls must be a non-empty list of tool calls, got {calls!r}")
    out = []
    for j, call in enumerate(calls):
        at = f"{where}.tool_calls[{j}]"
        fn = call.get("function") if isinstance(call, dict) else None
        if (not isinstance(fn, dict) or not isinstance(call.get("id"), str) or call.get("type", "function") != "function"
                or not isinstance(fn.get("name"), str)):
            raise ValueError(f"{at} must be {{'id': str, 'type': 'function', 'function': {{'name': str, "
                             f"'arguments': JSON text}}}}, got {call!r}")
        args = fn.get("arguments", "{}")
        if isinstance(args, str):
            check_text(args, f"{at}.function.arguments")
            try:
                args = json.loads(args)
            except json.JSONDecodeError as e:
                raise ValueError(f"{at}.function.arguments is not valid JSON ({e}): {fn['arguments'][:200]!r}") from None
        if not isinstance(args, dict):
            raise ValueError(f"{at}.function.arguments must be a JSON object, got {args!r}"[:300])
        check_text(fn["name"], f"{at}.function.name")
        out.append({"id": call["id"], "type": "function", "function": {"name": fn["name"], "arguments": args}})
    return out


def _message(m, where: str, call_ids: set[str]) -> dict:
    if not isinstance(m, dict) or "role" not in m:
        raise ValueError(f"{where} must be a dict with 'role' and 'content', got {m!r}")
    if m["role"] not in ROLES:
        raise ValueError(f"{where}.role is {m['role']!r}; one of {list(ROLES)}")
    calls, call_id = m.get("tool_calls"), m.get("tool_call_id")
    if calls is not None and m["role"] != "assistant":
        raise ValueError(f"{where}.tool_calls: only an assistant message makes tool calls, this one is {m['role']!r}")
    if m.get("content") is None and calls is None:
        raise ValueError(f"{where} must be a dict with 'role' and 'content', got {m!r}")
    out = {"role": "system" if m["role"] == "developer" else m["role"],
           "content": "" if m.get("content") is None else _content(m["content"], where)}
    if calls is not None:
        out["tool_calls"] = _tool_calls(calls, where)
        call_ids.update(c["id"] for c in out["tool_calls"])
    if m["role"] == "tool":
        if not isinstance(call_id, str) or call_id not in call_ids:
            raise ValueError(f"{where}.tool_call_id is {call_id!r}; a tool message answers a tool call made earlier "
                             f"in the conversation: one of {sorted(call_ids)}")
        out["tool_call_id"] = call_id
    elif call_id is not None:
        raise ValueError(f"{where}.tool_call_id: only a tool message answers a tool call, this one is {m['role']!r}")
    return out


def normalize(messages, where: str = "messages") -> list[dict]:
    """One conversation as [{"role", "content": str, ...}], every message checked (errors name its index)."""
    if not isinstance(messages, list) or not messages:
        raise ValueError(f"{where} must be a non-empty list of messages, got {messages!r}")
    call_ids: set[str] = set()
    return [_message(m, f"{where}[{i}]", call_ids) for i, m in enumerate(messages)]


def renders(tokenizer, what: str) -> bool:
    """Whether the tokenizer's chat template shows `what` to the model: "tools" (the tool list) or "tool_calls"
    (an assistant's tool calls). Found by rendering a marker once per template."""
    template = getattr(tokenizer, "chat_template", None)
    if tokenizer is None or not template:
        return False
    key = (str(template), what)
    if key not in _RENDERS:
        fn = {"name": _MARK, "description": "probe", "parameters": {"type": "object", "properties": {}}}
        user = {"role": "user", "content": "x"}
        if what == "tools":
            messages, tools = [user], [{"type": "function", "function": fn}]
        else:
            call = {"id": "call_probe", "type": "function", "function": {"name": _MARK, "arguments": {}}}
            messages, tools = [user, {"role": "assistant", "content": "", "tool_calls": [call]}], None
        try:
            text = tokenizer.apply_chat_template(messages, tools=tools, tokenize=False)
        except Exception:  # noqa: BLE001  a template that cannot take them does not render them
            text = ""
        _RENDERS[key] = _MARK in text
    return _RENDERS[key]


def render(tokenizer, messages, where: str = "messages", tools: list[dict] | None = None) -> str:
    """The prompt text of one conversation, ending where the assistant's answer begins. `tools`: OpenAI's tool
    list, for a template that renders it."""
    if tokenizer is None:
        raise ValueError("this model has no tokenizer, hence no chat template: pass token ids instead")
    msgs = normalize(messages, where)
    calling = [i for i, m in enumerate(msgs) if "tool_calls" in m]
    if calling and not renders(tokenizer, "tool_calls"):
        raise ValueError(f"{where}[{calling[0]}].tool_calls: this model's chat template does not render an "
                         f"assistant's tool calls, so the model would see an empty turn; send the call's result "
                         f"as a user message instead")
    from jinja2 import TemplateError

    try:
        return tokenizer.apply_chat_template(msgs, tools=tools or None, add_generation_prompt=True, tokenize=False)
    except TemplateError as e:  # the template's own raise_exception, or a message shape it cannot read
        raise ValueError(f"the chat template cannot render {where}: {e}") from None
