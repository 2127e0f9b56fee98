"""The request bodies of the OpenAI-compatible API (`lab.serve.openai_api` serves them), as pydantic models: OpenAI's
fields (https://platform.openai.com/docs/api-reference/chat/create) and vLLM's extensions, every one typed
strictly ("5" is not a number) and a field the server does not know refused, not ignored. Tool calling's own
models are `lab.serve.tools`'.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

from lab.engine import SamplingParams, StructuredOutputsParams

from .tools import NamedToolChoice, Tool, ToolCall, ToolPlan, check_choice


class JsonSchemaFormat(BaseModel):
    """OpenAI's response_format.json_schema. `strict` is accepted and always in force: the grammar is exact."""

    model_config = ConfigDict(extra="forbid", strict=True)
    name: str
    description: str | None = None
    schema_: dict | None = Field(None, alias="schema")  # None: any JSON object
    strict: bool | None = None


class ResponseFormat(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_with_its_type(self):
        if (self.type == "json_schema") != (self.json_schema is not None):
            raise ValueError("json_schema is given exactly when type is json_schema")
        return self

    def constraint(self) -> dict:
        """As StructuredOutputsParams fields ({} for text)."""
        if self.type == "text":
            return {}
        if self.type == "json_object" or self.json_schema.schema_ is None:
            return {"json_object": True}
        return {"json": self.json_schema.schema_}


class SamplingRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)  # "5" is not a number: wrongly typed fields are refused
    model: str
    max_tokens: int = Field(16, ge=1)
    temperature: float = Field(1.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(0, ge=-1)  # vLLM's -1, like 0, disables it
    seed: int | None = None
    stream: bool = False
    stream_options: dict | None = None
    ignore_eos: bool = False
    return_token_ids: bool = False
    user: str | None = None  # metadata: accepted, not used
    stop: str | list[str] | None = None  # stop strings (excluded from the text, as OpenAI and vLLM do)
    stop_token_ids: list[int] | None = None  # vLLM's extension
    n: int = Field(1, ge=1, le=64)  # parallel samples, sharing the prompt's KV blocks
    min_tokens: int = Field(0, ge=0)  # vLLM's extension
    repetition_penalty: float = Field(1.0, gt=0, le=2)  # vLLM's extension
    presence_penalty: float = Field(0.0, ge=-2, le=2)
    frequency_penalty: float = Field(0.0, ge=-2, le=2)
    logit_bias: dict[str, float] | None = None  # OpenAI's: {"token id": bias in [-100, 100]}
    response_format: ResponseFormat | None = None  # OpenAI's structured output
    guided_json: dict | str | None = None  # vLLM's: a JSON schema (or its text)
    guided_regex: str | None = None
    guided_grammar: str | None = None  # EBNF (GBNF's dialect) with a root rule
    guided_choice: list[str] | None = None  # the output is exactly one of these strings

    @field_validator("stream_options")
    @classmethod
    def _only_usage(cls, v):
        if v is not None and set(v) - {"include_usage"}:
            raise ValueError(f"stream_options supports include_usage only, got {sorted(v)}")
        return v

    def sampling_params(self) -> SamplingParams:
        return SamplingParams(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p,
                              max_tokens=self.max_tokens, seed=self.seed, ignore_eos=self.ignore_eos,
                              stop=self.stop or None, stop_token_ids=self.stop_token_ids or [],
                              logprobs=self.top_logprob_count, presence_penalty=self.presence_penalty,
                              frequency_penalty=self.frequency_penalty, repetition_penalty=self.repetition_penalty,
                              min_tokens=self.min_tokens, n=self.n, logit_bias=self.token_biases(),
                              structured_outputs=self.structured_outputs(),
                              output_kind="delta" if self.stream else "final")

    def token_biases(self) -> dict[int, float] | None:
        """logit_bias with its keys (JSON strings) read as token ids (ValueError for one that is not)."""
        if not self.logit_bias:
            return None
        wrong = [k for k in self.logit_bias if not k.isdecimal()]
        if wrong:
            raise ValueError(f"logit_bias keys are token ids (decimal strings), got {wrong[0]!r}")
        return {int(k): v for k, v in self.logit_bias.items()}

    def constraints(self) -> dict[str, dict]:
        """Each field that constrains the output, as StructuredOutputsParams fields."""
        asked = {f"guided_{k}": {k: v} for k in ("json", "regex", "grammar", "choice")
                 if (v := getattr(self, f"guided_{k}")) is not None}
        if self.response_format is not None and self.response_format.type != "text":
            asked["response_format"] = self.response_format.constraint()
        return asked

    def structured_outputs(self) -> StructuredOutputsParams | None:
        """The one constraint among response_format, the guided_* fields and tool_choice (ValueError if several)."""
        asked = self.constraints()
        if len(asked) > 1:
            raise ValueError(f"send one structured-output constraint; got {', '.join(asked)}")
        return StructuredOutputsParams(**next(iter(asked.values()))) if asked else None

    @property
    def top_logprob_count(self) -> int | None:
        """How many top logprobs each token needs (None: no logprobs)."""
        return None

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.get("include_usage"))


class CompletionRequest(SamplingRequest):
    prompt: str | list[int]
    echo: Literal[False] = False
    logprobs: int | None = Field(None, ge=0, le=5)  # the legacy API's: top logprobs per token

    @property
    def top_logprob_count(self) -> int | None:
        return self.logprobs


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)  # "5" is not a number: wrongly typed fields are refused
    role: str  # checked by lab.engine.chat (system, developer, user, assistant, tool)
    content: str | list | None = None  # a string or OpenAI's list of parts (text parts only); None: tool calls only
    name: str | None = None  # OpenAI's participant name: metadata, not sent to the template
    tool_calls: list[ToolCall] | None = None  # an assistant's calls (lab.engine.chat checks the rest)
    tool_call_id: str | None = None  # the call a tool message answers


class ChatCompletionRequest(SamplingRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)  # OpenAI's newer name for max_tokens
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    tools: list[Tool] | None = None  # lab.serve.tools
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool = True
    _tools: ToolPlan | None = PrivateAttr(None)  # set by the route, once checked against the model

    _choice = field_validator("tool_choice", mode="before")(check_choice)

    @property
    def top_logprob_count(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    def constraints(self) -> dict[str, dict]:
        asked = super().constraints()
        if self._tools is not None and (schema := self._tools.schema()) is not None:
            mode = self._tools.mode
            asked[f"tool_choice {mode!r}" if mode != "named" else f"tool_choice {self._tools.name!r}"] = {"json": schema}
        return asked

    @model_validator(mode="after")
    def _one_max_tokens(self):
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs: true")
        if self.max_completion_tokens is not None:
            if "max_tokens" in self.model_fields_set and self.max_tokens != self.max_completion_tokens:
                raise ValueError(f"max_tokens={self.max_tokens} and max_completion_tokens="
                                 f"{self.max_completion_tokens} disagree; send one")
            self.max_tokens = self.max_completion_tokens
        return self
