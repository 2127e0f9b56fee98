"""`lab serve`: the engine behind the OpenAI-compatible API on uvicorn, and `ServerThread`, the same server in
a background thread of this process (for the serving study and the tests: one loaded model, many servers)."""

from __future__ import annotations

import socket
import threading
import time

import uvicorn

from lab.engine import LLM

from .async_engine import AsyncLLM
from .openai_api import create_app


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class ServerThread:
    """Serve `llm` on host:port from a daemon thread until `stop()`; usable as a context manager."""

    def __init__(self, llm: LLM, model_name: str = "smollm2-135m", host: str = "127.0.0.1", port: int | None = None,
                 warmup=None):
        self.engine = AsyncLLM(llm, warmup=warmup)
        self.host, self.port = host, port or free_port(host)
        config = uvicorn.Config(create_app(self.engine, model_name), host=self.host, port=self.port,
                                log_level="warning", timeout_graceful_shutdown=5)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="lab-server", daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout: float = 30.0) -> ServerThread:
        self.thread.start()
        end = time.monotonic() + timeout
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > end:
                raise RuntimeError(f"the server on {self.url} did not start within {timeout} s")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def serve(llm: LLM, model_name: str, host: str, port: int, warmup: bool = False) -> None:
    """Serve in the foreground until interrupted (`lab serve`); `warmup`: `/ready` answers 200 only after one
    warm-up request (`AsyncLLM`)."""
    uvicorn.run(create_app(AsyncLLM(llm, warmup=warmup or None), model_name), host=host, port=port, log_level="info")
