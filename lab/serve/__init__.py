"""Serving: the engine behind an OpenAI-compatible HTTP API.

- `async_engine`: `AsyncLLM`, the engine stepping in its own thread while an asyncio server takes requests;
- `openai_api`: the FastAPI app (`/v1/completions`, `/v1/chat/completions` with SSE streaming, `/health`,
  `/metrics`), whose request bodies are `protocol`'s models;
- `tools`: tool calling (`tools`, `tool_choice`, `parallel_tool_calls`), with `tool_parsers` reading the calls out
  of the output;
- `metrics`: the Prometheus metrics (latency histograms, engine state);
- `server`: `lab serve`, and `ServerThread` for in-process servers.
The load generator that measures it is `lab.bench.serve`.
"""

from .async_engine import AsyncLLM, Delta
from .openai_api import create_app
from .server import ServerThread, serve

__all__ = ["AsyncLLM", "Delta", "ServerThread", "create_app", "serve"]
