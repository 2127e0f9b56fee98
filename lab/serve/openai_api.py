"""An OpenAI-compatible HTTP front end for the engine (FastAPI on uvicorn): `/v1/completions`,
`/v1/chat/completions` (both with server-sent-event streaming), `/v1/models`, `/health` (liveness), `/ready` (readiness:
after the warm-up request), `/metrics`.

The request and response shapes are OpenAI's (https://platform.openai.com/docs/api-reference/completions),
with vLLM's extensions where the lab needs them: `top_k`, `ignore_eos`, `return_token_ids`, and `prompt` as a
list of token ids. Logprobs come in OpenAI's shapes (chat's `logprobs`/`top_logprobs`, the legacy completions'
`logprobs: int`), `n` samples (sharing the prompt's blocks: `AsyncLLM.generate_samples`), penalties and vLLM's
`min_tokens`/`repetition_penalty` as the engine's SamplingParams. Structured output: OpenAI's `response_format`
(`text`, `json_object`, `json_schema`) and vLLM's `guided_json`, `guided_regex`, `guided_grammar` and
`guided_choice`, on both endpoints, become the engine's `StructuredOutputsParams` (`lab.engine.structured`); a
schema, regex or grammar that does not compile is a 400 naming the problem. A field the server does not know is
refused with a 400 naming it rather than ignored. A client that disconnects mid-stream has its request aborted.
"""

from __future__ import annotations

import json
import time
from contextlib import aclosing, asynccontextmanager
from itertools import accumulate
from typing import Literal

from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from lab.engine import SamplingParams, StructuredOutputsParams
from lab.engine.chat import render

from .async_engine import AsyncLLM


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


class _Sampling(BaseModel):
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
                              structured_outputs=self.structured_outputs())

    def token_biases(self) -> dict[int, float] | None:
        """logit_bias with its keys (JSON strings) read as token ids (ValueError for one that is not)."""
        if not self.logit_bias:
            return None
        wrong = [k for k in self.logit_bias if not k.isdecimal()]
        if wrong:
            raise ValueError(f"logit_bias keys are token ids (decimal strings), got {wrong[0]!r}")
        return {int(k): v for k, v in self.logit_bias.items()}

    def structured_outputs(self) -> StructuredOutputsParams | None:
        """The one constraint among response_format and the guided_* fields (ValueError if several)."""
        asked = {f"guided_{k}": {k: v} for k in ("json", "regex", "grammar", "choice")
                 if (v := getattr(self, f"guided_{k}")) is not None}
        if self.response_format is not None and self.response_format.type != "text":
            asked["response_format"] = self.response_format.constraint()
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


class CompletionRequest(_Sampling):
    prompt: str | list[int]
    echo: Literal[False] = False
    logprobs: int | None = Field(None, ge=0, le=5)  # the legacy API's: top logprobs per token

    @property
    def top_logprob_count(self) -> int | None:
        return self.logprobs


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)  # "5" is not a number: wrongly typed fields are refused
    role: str  # checked by lab.engine.chat (system, developer, user, assistant)
    content: str | list  # a string or OpenAI's list of parts (text parts only)
    name: str | None = None  # OpenAI's participant name: metadata, not sent to the template


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)  # OpenAI's newer name for max_tokens
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)

    @property
    def top_logprob_count(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

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


def _error(status: int, message: str, code: str | None = None, param: str | None = None) -> JSONResponse:
    kind = "server_error" if status >= 500 else "invalid_request_error"  # OpenAI's types
    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": code}},
                        status_code=status)


def _sse(obj) -> str:
    return f"data: {json.dumps(obj)}\n\n"


router = APIRouter()


def create_app(engine: AsyncLLM, model_name: str) -> FastAPI:
    """The FastAPI app serving `engine` under `model_name`; the engine thread starts and stops with the app.

    The routes are module-level and reach the engine through `app.state`: FastAPI caches endpoint functions
    in a process-wide cache, so a route closing over the engine would keep every engine (and its KV pool)
    alive for the life of the process."""

    @asynccontextmanager
    async def lifespan(app):
        app.state.engine.start()
        yield
        app.state.engine.shutdown()

    app = FastAPI(title="Inference Lab", lifespan=lifespan)
    app.state.engine, app.state.model_name = engine, model_name
    app.add_exception_handler(RequestValidationError, _invalid)
    app.include_router(router)
    return app


async def _invalid(request: Request, exc: RequestValidationError):
    request.app.state.engine.metrics.rejected.inc()
    first = exc.errors()[0]
    if first.get("type") == "json_invalid":  # loc is ("body", character position), not a parameter
        at = first.get("loc", ("body", "?"))[-1]
        error = (first.get("ctx") or {}).get("error", first.get("msg"))
        return _error(400, f"the body is not valid JSON: {error} at character {at}")
    where = ".".join(str(x) for x in first.get("loc", ()) if x != "body")
    return _error(400, f"{where or 'body'}: {first.get('msg')} (got {first.get('input')!r})"[:500], param=where)


@router.get("/health")
async def health(request: Request):
    """Liveness: 200 while the process serves or warms up; 503 once the engine has failed (restart it)."""
    engine = request.app.state.engine
    if engine.failed:
        return JSONResponse({"status": "failed", "error": engine.failed}, status_code=503)
    return {"status": "ok", "ready": engine.ready.is_set(), "active_requests": engine.num_active}


@router.get("/ready")
async def ready(request: Request):
    """Readiness: 200 only after the warm-up request has run; 503 with the status before (or after a failure)."""
    engine = request.app.state.engine
    body = {"status": engine.status, "warmup_s": engine.warmup_seconds}
    return JSONResponse(body, status_code=200 if engine.status == "ready" else 503)


@router.get("/v1/models")
async def models(request: Request):
    state = request.app.state
    return {"object": "list", "data": [{"id": state.model_name, "object": "model", "owned_by": "inference-lab",
                                        "max_model_len": state.engine.llm.config.max_model_len}]}


@router.get("/metrics")
async def metrics(request: Request):
    return Response(request.app.state.engine.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)


@router.post("/v1/completions")
async def completions(request: Request, body: CompletionRequest):
    return await _serve(request, body, body.prompt, chat=False)


@router.post("/v1/chat/completions")
async def chat_completions(request: Request, body: ChatCompletionRequest):
    try:
        prompt = render(request.app.state.engine.llm.tokenizer, [m.model_dump() for m in body.messages])
    except ValueError as e:
        return _error(400, str(e), param="messages")
    return await _serve(request, body, prompt, chat=True)


async def _serve(request: Request, body: _Sampling, prompt, chat: bool):
    engine, model_name = request.app.state.engine, request.app.state.model_name
    if engine.failed:  # the engine thread has stopped: queueing the request would leave it waiting forever
        return _error(503, f"the server cannot serve: {engine.failed}")
    if body.model != model_name:
        engine.metrics.rejected.inc()
        return _error(404, f"model {body.model!r} does not exist; this server serves {model_name!r}",
                      "model_not_found", "model")
    try:
        seqs = engine.validate_samples(prompt, body.sampling_params())
    except ValueError as e:
        engine.metrics.rejected.inc()
        return _error(400, str(e))
    kind = "chat.completion" if chat else "text_completion"
    head = {"id": f"{'chatcmpl' if chat else 'cmpl'}-{seqs[0].request_id}", "created": int(time.time()),
            "model": model_name}
    if body.stream:
        return StreamingResponse(_stream(engine, seqs, body, chat, head), media_type="text/event-stream")
    text, tokens, lps = ([[] for _ in seqs] for _ in range(3))
    finals = [None] * len(seqs)
    async with aclosing(engine.generate_samples(seqs)) as deltas:  # closing it early aborts every sample
        async for i, delta in deltas:
            if delta.error:
                return _error(500, delta.error)
            text[i].append(delta.text)
            tokens[i] += delta.token_ids
            lps[i] += delta.logprobs or []
            finals[i] = delta.output
            if await request.is_disconnected():
                break
    if any(f is None for f in finals):  # the client went away
        return Response(status_code=499)
    choices = []
    for i, final in enumerate(finals):
        choice = {"index": i, "finish_reason": final.finish_reason,
                  "logprobs": _logprobs(engine.llm.tokenizer, tokens[i], lps[i], chat, body.top_logprob_count)}
        if chat:
            choice["message"] = {"role": "assistant", "content": "".join(text[i])}
        else:
            choice["text"] = "".join(text[i])
        if body.return_token_ids:
            choice["token_ids"] = tokens[i]
        choices.append(choice)
    return {**head, "object": kind, "choices": choices, "usage": _usage(finals)}


async def _stream(engine: AsyncLLM, seqs, body: _Sampling, chat: bool, head: dict):
    kind = "chat.completion.chunk" if chat else "text_completion"
    started, finals = set(), [None] * len(seqs)
    # A disconnect cancels or closes this generator; closing the engine's streams then aborts the requests.
    async with aclosing(engine.generate_samples(seqs)) as deltas:
        async for i, delta in deltas:
            if delta.error:
                yield _sse({"error": {"message": delta.error, "type": "server_error"}})
                break
            if not delta.token_ids and not delta.finished:
                continue
            reason = delta.output.finish_reason if delta.finished else None
            logprobs = _logprobs(engine.llm.tokenizer, delta.token_ids, delta.logprobs or [], chat,
                                 body.top_logprob_count)
            if chat:
                msg = {"content": delta.text, **({"role": "assistant"} if i not in started else {})}
                choice = {"index": i, "delta": msg, "finish_reason": reason, "logprobs": logprobs}
            else:
                choice = {"index": i, "text": delta.text, "finish_reason": reason, "logprobs": logprobs}
            if body.return_token_ids:
                choice["token_ids"] = delta.token_ids
            started.add(i)
            finals[i] = delta.output
            yield _sse({**head, "object": kind, "choices": [choice]})
    if body.include_usage and all(f is not None for f in finals):
        yield _sse({**head, "object": kind, "choices": [], "usage": _usage(finals)})
    yield "data: [DONE]\n\n"


def _logprobs(tokenizer, token_ids: list[int], entries: list, chat: bool, top: int | None):
    """The engine's logprobs (`lab.engine.request.Logprob` dicts) in OpenAI's shape: chat's `content` list, or
    the legacy completions' parallel lists. Token strings are each token decoded alone (with their bytes)."""
    if top is None:
        return None
    piece = (lambda t: tokenizer.decode([t])) if tokenizer is not None else str
    ranked = [sorted(e.items(), key=lambda kv: kv[1].rank)[:top] for e in entries]
    if chat:
        def one(t: int, logprob: float) -> dict:
            text = piece(t)
            return {"token": text, "logprob": logprob, "bytes": list(text.encode())}
        return {"content": [{**one(t, e[t].logprob), "top_logprobs": [one(u, lp.logprob) for u, lp in r]}
                            for t, e, r in zip(token_ids, entries, ranked)]}
    strings = [piece(t) for t in token_ids]
    return {"tokens": strings, "token_logprobs": [e[t].logprob for t, e in zip(token_ids, entries)],
            "top_logprobs": [{piece(u): lp.logprob for u, lp in r} for r in ranked],
            "text_offset": [0, *accumulate(map(len, strings[:-1]))] if strings else []}


def _usage(outs: list) -> dict:
    """OpenAI's usage: the prompt once, the completions of every sample."""
    prompt, completion = len(outs[0].prompt_token_ids), sum(len(o.token_ids) for o in outs)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
