"""Tool calling on /v1/chat/completions: OpenAI's `tools`, `tool_choice` and `parallel_tool_calls`
(https://platform.openai.com/docs/guides/function-calling), served as vLLM serves them
(vllm/entrypoints/openai/serving_chat.py and its tool parsers; https://docs.vllm.ai/en/latest/features/tool_calling.html).

The idea: a forced tool call is structured output. Where the client requires a call, the output is constrained by
a JSON schema built from the tools' `parameters`, through the engine's grammar (`lab.engine.grammar`, xgrammar), so
the call parses and its arguments validate against the schema by construction; the text is then read back as
calls. Where the model may choose ("auto"), only a parser for its own call format can tell a call from prose.

- `tool_choice="none"`: no constraint, no call; the output is content. As vLLM does by default (its
  `--exclude-tools-when-tool-choice-none` is off), the tools are still passed to the chat template: the model may
  know of them, it cannot call them.
- `"required"`: the output is a JSON array of `{"name", "arguments"}` objects, `anyOf` one branch per tool (its
  name a constant, its arguments that tool's parameters), at least one item, exactly one where
  `parallel_tool_calls` is false. vLLM's array names the arguments key "parameters"; here it is "arguments",
  OpenAI's word and the Hermes format's. `$defs` of the tools' schemas are gathered at the root, where their
  `$ref`s point.
- a named function (`{"type": "function", "function": {"name": ...}}`): the output is that function's
  parameters object, and it is the call's arguments.
- `"auto"` (the default when tools are sent, as in OpenAI's API and vLLM): the output is free and parsed. It needs
  a chat template that renders the tools (`lab.engine.chat.renders`) and a parser for the model's call format;
  the one known here is Hermes' (`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`: Hermes 2/3,
  Qwen2.5), chosen when the template mentions `<tool_call>`. Otherwise a 400 says so (SmolLM2-135M-Instruct's
  template renders neither tools nor calls): vLLM, too, refuses "auto" without a tool parser.

Whatever the choice, the chat template renders the tools if it can; SmolLM2's cannot, so under "required" or a
named function that model learns the tools only through the constraint (their names and parameters; the
descriptions do not reach it).

Output, whole: `message.tool_calls` ([{"id": "call_<hex>", "type": "function", "function": {"name", "arguments":
JSON text}}]), `content` null (under "auto", the text outside the calls, or null when it is only whitespace), and
`finish_reason` "tool_calls" where the calls are complete (an output cut by max_tokens keeps "length" and its
calls as far as they got). Streamed: the same calls as OpenAI's `delta.tool_calls` entries (the first of each call
with its index, id, type and name; then pieces of its arguments), so the official client assembles them. A whole
answer is the stream's deltas assembled (`Reader.whole`), so the two never differ. Under "auto", a block that is
not a call of a known tool (bad JSON, an unknown name, a second call with `parallel_tool_calls` false, an unclosed
block) stays in the content as the model wrote it.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from lab.engine.chat import renders

from .tool_parsers import Hermes, RequiredScanner

CHOICES = ("none", "auto", "required")


class FunctionDefinition(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")  # OpenAI's rule
    description: str | None = None
    parameters: dict | None = None  # a JSON Schema of an object; None: no parameters
    strict: bool | None = None  # accepted; a constrained call is always exact

    @field_validator("parameters")
    @classmethod
    def _an_object(cls, v):
        if v is not None and v.get("type", "object") != "object":
            raise ValueError(f"a function's parameters are a JSON Schema of type 'object', got type {v['type']!r}")
        return v

    def schema(self) -> dict:
        return {"type": "object", **(self.parameters or {"properties": {}})}


class Tool(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    type: Literal["function"]
    function: FunctionDefinition


class FunctionName(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    name: str


class NamedToolChoice(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    type: Literal["function"]
    function: FunctionName


class FunctionCall(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    name: str
    arguments: str  # JSON text, as OpenAI sends it


class ToolCall(BaseModel):
    """A tool call in an assistant message of the conversation sent back."""

    model_config = ConfigDict(extra="forbid", strict=True)
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


def check_choice(v):
    """tool_choice's strings, named in the error (pydantic's union error would name its own branches)."""
    if isinstance(v, str) and v not in CHOICES:
        raise ValueError(f"tool_choice is one of {list(CHOICES)} or {{'type': 'function', 'function': {{'name': "
                         f"...}}}}, got {v!r}")
    return v


class ToolError(ValueError):
    def __init__(self, message: str, param: str):
        super().__init__(message)
        self.param = param


@dataclass
class ToolPlan:
    """What a request's tools and tool_choice mean: `mode` is "none", "auto", "required" or "named"."""

    mode: str
    tools: list[Tool] = field(default_factory=list)
    parallel: bool = True
    name: str | None = None  # the named function

    @classmethod
    def of(cls, tools: list[Tool] | None, choice, parallel: bool, tokenizer, model_name: str) -> ToolPlan:
        """Check the request's tools and choice against each other and the model (ToolError names the field)."""
        if tools is not None and not tools:
            raise ToolError("tools is an empty list: send at least one tool, or leave tools out", "tools")
        names = [t.function.name for t in tools or []]
        for j, name in enumerate(names):
            if name in names[:j]:
                raise ToolError(f"tools[{j}].function.name {name!r} is also tools[{names.index(name)}]'s: function "
                                f"names must be unique", f"tools[{j}].function.name")
        given = choice is not None
        choice = choice if given else "auto" if tools else "none"
        if not tools:
            if choice == "none":
                return cls("none")
            shown = choice if isinstance(choice, str) else choice.model_dump()
            raise ToolError(f"tool_choice {shown!r} needs tools: send tools, or leave tool_choice out", "tool_choice")
        if isinstance(choice, NamedToolChoice):
            if choice.function.name not in names:
                raise ToolError(f"tool_choice names function {choice.function.name!r}, which is not among tools: "
                                f"{names}", "tool_choice.function.name")
            return cls("named", tools, parallel, choice.function.name)
        if choice == "auto" and not (renders(tokenizer, "tools") and Hermes.fits(tokenizer)):
            why = "" if given else " (tool_choice is 'auto' when tools are sent without it)"
            raise ToolError(f"tool_choice 'auto'{why} needs a tool parser for this model's output format; none is "
                            f"known for {model_name} (the one known is Hermes' <tool_call>...</tool_call>, for a "
                            f"chat template that renders tools and writes calls so); use 'required' or a named "
                            f"function", "tool_choice")
        return cls(choice, tools, parallel)

    @property
    def active(self) -> bool:
        return self.mode != "none"

    def rendered(self) -> list[dict] | None:
        """The tools as the chat template takes them (OpenAI's shape)."""
        return [t.model_dump(exclude_none=True) for t in self.tools] or None

    def schema(self) -> dict | None:
        """The JSON schema the output must match ("required" and named), else None."""
        if self.mode == "named":
            return next(t.function.schema() for t in self.tools if t.function.name == self.name)
        if self.mode != "required":
            return None
        defs: dict[str, dict] = {}
        branches = []
        for j, t in enumerate(self.tools):
            params = t.function.schema()
            for key in ("$defs", "definitions"):  # where "#/$defs/X" points: the root
                for name, sub in params.pop(key, {}).items():
                    if defs.setdefault(key, {}).setdefault(name, sub) != sub:
                        raise ToolError(f"tools[{j}].function.parameters.{key}.{name} differs from another tool's "
                                        f"{key}.{name}; under tool_choice 'required' they share one schema",
                                        f"tools[{j}].function.parameters")
            branches.append({"type": "object", "properties": {"name": {"const": t.function.name},
                                                              "arguments": params}, "required": ["name", "arguments"]})
        schema = {"type": "array", "items": {"anyOf": branches}, "minItems": 1,
                  **({} if self.parallel else {"maxItems": 1}), **defs}
        return schema


class Reader:
    """One choice's output read as content and tool calls, delta by delta (`feed`) or whole (`whole`)."""

    def __init__(self, plan: ToolPlan | None):
        self.mode = plan.mode if plan is not None else "none"
        self.named = plan.name if plan is not None else None
        self.content: str | None = None
        self.calls: list[dict] = []  # OpenAI's tool_calls entries, arguments as far as they have come
        self.complete = False  # the calls are whole (for finish_reason "tool_calls")
        self.text = ""
        if self.mode == "required":
            self.scanner = RequiredScanner()
        elif self.mode == "auto":
            self.hermes = Hermes({t.function.name for t in plan.tools}, plan.parallel)

    def feed(self, text: str, final: bool) -> dict:
        """The delta fields (`content`, `tool_calls`) for the next piece of output text."""
        if self.mode == "none":
            self.content = (self.content or "") + text
            return {"content": text}
        self.text += text
        if self.mode == "named":
            found = [(self.named, self.text)]
            if final:
                self.complete = _is_json(self.text)
        elif self.mode == "required":
            self.scanner.feed(text)
            found = [(c["name"], c["arguments"]) for c in self.scanner.calls if c["name"] is not None]
            self.complete = self.scanner.done
        else:
            content, found = self.hermes.feed(text, final)
            self.complete = bool(found)
            if content:
                self.content = (self.content or "") + content
                return {"content": content, **self._call_deltas(found)}
        return self._call_deltas(found)

    def _call_deltas(self, found: list[tuple[str, str]]) -> dict:
        deltas = []
        for k, (name, arguments) in enumerate(found):
            if k == len(self.calls):
                self.calls.append({"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                                   "function": {"name": name, "arguments": ""}})
                deltas.append({"index": k, **self.calls[k], "function": {"name": name, "arguments": ""}})
            sent = self.calls[k]["function"]["arguments"]
            if len(arguments) > len(sent):
                deltas.append({"index": k, "function": {"arguments": arguments[len(sent):]}})
                self.calls[k]["function"]["arguments"] = arguments
        return {"tool_calls": _merge(deltas)} if deltas else {}

    def reason(self, reason: str | None) -> str | None:
        """The finish reason to report: "tool_calls" where the engine stopped on complete calls."""
        return "tool_calls" if reason == "stop" and self.calls and self.complete else reason

    def whole(self, text: str, reason: str) -> tuple[dict, str]:
        """The whole answer's message and finish reason: the stream's deltas, assembled."""
        self.feed(text, True)
        message = {"role": "assistant", "content": self.content}
        if self.calls:
            message["tool_calls"] = self.calls
        return message, self.reason(reason)


def _merge(deltas: list[dict]) -> list[dict]:
    """One entry per call index: a call's header and its first arguments travel together."""
    out: dict[int, dict] = {}
    for d in deltas:
        if d["index"] in out:
            out[d["index"]]["function"]["arguments"] += d["function"]["arguments"]
        else:
            out[d["index"]] = {**d, "function": dict(d["function"])}
    return list(out.values())


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except json.JSONDecodeError:
        return False
    return True
