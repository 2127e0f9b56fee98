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
schema, regex or grammar that does not compile is a 400 naming the problem. Tool calling (`tools`, `tool_choice`,
`parallel_tool_calls`, assistant `tool_calls` and `tool` messages) is `lab.serve.tools`'. A field the server does
not know is refused with a 400 naming it rather than ignored; so is text no tokenizer can encode (a lone surrogate,
`lab.engine.text`) in any field, and a body that is not UTF-8. A client that disconnects mid-stream has its
request aborted.
"""

from __future__ import annotations

import json
import time
from contextlib import aclosing, asynccontextmanager
from itertools import accumulate

from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException

from lab.engine.chat import render
from lab.engine.text import BadText, check_texts

from .async_engine import AsyncLLM
from .protocol import ChatCompletionRequest, CompletionRequest, SamplingRequest
from .tools import Reader, ToolError, ToolPlan


def _error(status: int, message: str, code: str | None = None, param: str | None = None) -> JSONResponse:
    kind = "server_error" if status >= 500 else "invalid_request_error"  # OpenAI's types
    message, param = (None if x is None else _printable(x) for x in (message, param))
    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": code}},
                        status_code=status)


def _printable(text: str) -> str:
    """`text` with any character UTF-8 cannot encode (an echoed lone surrogate) written as its escape."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


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
    app.add_exception_handler(HTTPException, _http_error)
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


async def _http_error(request: Request, exc: HTTPException):
    """Starlette's and FastAPI's own errors (an unknown route, a body that cannot be read) in OpenAI's shape."""
    if isinstance(exc.__cause__, UnicodeDecodeError):
        request.app.state.engine.metrics.rejected.inc()
        return _error(400, f"the body is not UTF-8 text: {exc.__cause__}")
    response = _error(exc.status_code, str(exc.detail))
    response.headers.update(exc.headers or {})  # a 405's Allow
    return response


@router.get("/health")
async def health(request: Request):
    """Liveness: 200 while the process serves, warms up or drains; 503 with the cause once the engine cannot serve
    (a rank died or hung, the engine thread failed: restart the process)."""
    engine = request.app.state.engine
    if engine.failed:
        return JSONResponse({"status": "failed", "error": engine.failed}, status_code=503)
    return {"status": "ok", "ready": engine.ready.is_set(), "draining": engine.draining,
            "active_requests": engine.num_active}


@router.get("/ready")
async def ready(request: Request):
    """Readiness: 200 only after the warm-up request has run and until shutdown begins; 503 with the status
    before, while draining, and after a failure (with its cause)."""
    engine = request.app.state.engine
    body = {"status": engine.status, "warmup_s": engine.warmup_seconds,
            **({"error": engine.failed} if engine.failed else {})}
    return JSONResponse(body, status_code=200 if engine.status == "ready" else 503)


@router.get("/v1/models")
async def models(request: Request):
    state = request.app.state
    return {"object": "list", "data": [{"id": state.model_name, "object": "model", "owned_by": "inference-lab",
                                        "max_model_len": state.engine.llm.config.max_model_len}]}


@router.get("/metrics")
async def metrics(request: Request):
    return Response(request.app.state.engine.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)


def _refused(request: Request, e: ValueError, param: str | None) -> JSONResponse:
    request.app.state.engine.metrics.rejected.inc()
    return _error(400, str(e), param=getattr(e, "where", None) or getattr(e, "param", None) or param)


@router.post("/v1/completions")
async def completions(request: Request, body: CompletionRequest):
    try:
        check_texts(body.model_dump(by_alias=True, exclude_unset=True), "")
    except BadText as e:
        return _refused(request, e, None)
    return await _serve(request, body, body.prompt, chat=False)


@router.post("/v1/chat/completions")
async def chat_completions(request: Request, body: ChatCompletionRequest):
    state = request.app.state
    tokenizer = state.engine.llm.tokenizer
    try:
        check_texts(body.model_dump(by_alias=True, exclude_unset=True), "")
        body._tools = ToolPlan.of(body.tools, body.tool_choice, body.parallel_tool_calls, tokenizer, state.model_name)
        prompt = render(tokenizer, [m.model_dump() for m in body.messages], tools=body._tools.rendered())
    except (BadText, ToolError) as e:
        return _refused(request, e, None)
    except ValueError as e:
        return _refused(request, e, "messages")
    return await _serve(request, body, prompt, chat=True)


async def _serve(request: Request, body: SamplingRequest, prompt, chat: bool):
    engine, model_name = request.app.state.engine, request.app.state.model_name
    if engine.failed:  # the engine thread has stopped: queueing the request would leave it waiting forever
        return _error(503, f"the server cannot serve: {engine.failed}")
    if engine.draining:
        return _error(503, "the server is shutting down (draining the requests in flight); send this to another "
                           "instance")
    if body.model != model_name:
        engine.metrics.rejected.inc()
        return _error(404, f"model {body.model!r} does not exist; this server serves {model_name!r}",
                      "model_not_found", "model")
    try:
        seqs = engine.validate_samples(prompt, body.sampling_params())
    except ValueError as e:
        engine.metrics.rejected.inc()
        return _error(400, str(e), param=getattr(e, "param", None))
    kind = "chat.completion" if chat else "text_completion"
    head = {"id": f"{'chatcmpl' if chat else 'cmpl'}-{seqs[0].request_id}", "created": int(time.time()),
            "model": model_name}
    if body.stream:
        return StreamingResponse(_stream(engine, seqs, body, chat, head), media_type="text/event-stream")
    text, tokens, lps = ([[] for _ in seqs] for _ in range(3))
    finals = [None] * len(seqs)
    async with aclosing(engine.generate_samples(seqs)) as deltas:  # closing it early aborts every sample
        async for i, delta in deltas:
            if delta.error:  # 503 if the whole engine failed under it, 500 if its own step did
                return _error(503 if engine.failed else 500, delta.error)
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
        if chat:  # the text as content, or read as tool calls (lab.serve.tools)
            choice["message"], choice["finish_reason"] = Reader(body._tools).whole("".join(text[i]), final.finish_reason)
        else:
            choice["text"] = "".join(text[i])
        if body.return_token_ids:
            choice["token_ids"] = tokens[i]
        choices.append(choice)
    return {**head, "object": kind, "choices": choices, "usage": _usage(finals)}


async def _stream(engine: AsyncLLM, seqs, body: SamplingRequest, chat: bool, head: dict):
    kind = "chat.completion.chunk" if chat else "text_completion"
    started, finals = set(), [None] * len(seqs)
    readers = [Reader(body._tools) if chat else None for _ in seqs]  # content, or tool calls (lab.serve.tools)
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
                msg = {**({"role": "assistant"} if i not in started else {}), **readers[i].feed(delta.text, delta.finished)}
                choice = {"index": i, "delta": msg, "finish_reason": readers[i].reason(reason), "logprobs": logprobs}
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
