"""`lab serve`: the engine behind the OpenAI-compatible API on uvicorn, and `ServerThread`, the same server in
a background thread of this process (for the serving study and the tests: one loaded model, many servers).

What the foreground server (`serve`) does around requests, for an orchestrator (docs/serving.md):

- **The engine fails** (a rank died or hung, the engine thread raised: `AsyncLLM.fatal`): `/health` and `/ready`
  answer 503 with the cause, new requests get a 503 naming it, and after `failure_grace_s` (long enough for a
  probe to see it) the process kills its children and exits with status 1, so the orchestrator restarts it;
  `exit_on_failure=False` (`--stay-up-on-failure`) keeps it up, answering 503, for debugging.
- **SIGTERM or SIGINT** (Kubernetes sends SIGTERM before it removes a pod): readiness goes to 503 at once, new
  requests are refused with a 503, the requests in flight finish until `drain_timeout_s`, and what is left then is
  aborted (each stream ends with its final chunk, finish reason "abort"); every block goes back to the pool, the
  engine and its ranks are closed, and the process exits 0. A second signal exits at once (status 1).
- No child process (a rank, anything it started) outlives the server: they are killed on every way out.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time

import uvicorn

from lab.engine import LLM
from lab.machine.procs import all_pids, cmdline, proc_stat

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


log = logging.getLogger(__name__)


def descendants(pid: int | None = None) -> list[int]:
    """Every process below `pid` (this one by default), children first, from /proc (empty where it is missing)."""
    parents: dict[int, list[int]] = {}
    for child in all_pids():
        stat = proc_stat(child)
        if stat is not None:
            parents.setdefault(stat.ppid, []).append(child)
    out, todo = [], [os.getpid() if pid is None else pid]
    while todo:
        kids = parents.get(todo.pop(0), [])
        out += kids
        todo += kids
    return out


def kill_descendants(wait_s: float = 5.0) -> list[int]:
    """SIGKILL every process below this one (a stopped rank included: SIGTERM would wait for it to be continued)
    and reap this process's children; returns the pids killed."""
    pids = descendants()
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    end = time.monotonic() + wait_s
    while time.monotonic() < end:
        try:
            if os.waitpid(-1, os.WNOHANG) == (0, 0):
                if not [p for p in pids if os.path.exists(f"/proc/{p}")]:
                    break
                time.sleep(0.05)
        except ChildProcessError:  # none left to reap
            break
    return pids


class _Server(uvicorn.Server):
    """uvicorn's server with the lab's signals: the first drains (`AsyncLLM.begin_drain`), the second exits at
    once. uvicorn's own handler would stop at once and, after, raise the signal again into the default handler
    (the process would end by SIGTERM, not with status 0)."""

    def __init__(self, config: uvicorn.Config, engine: AsyncLLM, drain_timeout_s: float):
        super().__init__(config)
        self.engine, self.drain_timeout_s, self.forced = engine, drain_timeout_s, False

    def handle_exit(self, sig, frame) -> None:
        if self.engine.draining or self.should_exit:
            log.warning("second signal (%s): exiting now", signal.Signals(sig).name)
            self.engine.begin_drain(0)  # what is in flight is aborted now (blocks back), not waited for
            self.forced = self.force_exit = self.should_exit = True
            return
        if self.engine.failed:
            self.should_exit = self.force_exit = True
            return
        log.info("%s: not ready; draining %d request(s) for up to %g s", signal.Signals(sig).name,
                 self.engine.num_active, self.drain_timeout_s)
        self.engine.begin_drain(self.drain_timeout_s)
        threading.Thread(target=self._exit_when_drained, name="lab-drain", daemon=True).start()

    def _exit_when_drained(self) -> None:
        self.engine.drained.wait(self.drain_timeout_s + 10)
        self.should_exit = True


def serve(llm: LLM, model_name: str, host: str, port: int, warmup: bool = False, drain_timeout_s: float = 30.0,
          step_timeout_s: float = 60.0, failure_grace_s: float = 5.0, exit_on_failure: bool = True) -> int:
    """Serve in the foreground until a signal (`lab serve`), draining on the first; returns the exit status: 0
    after a drain, 1 after an engine failure or a second signal. `warmup`: `/ready` answers 200 only after one
    warm-up request (`AsyncLLM`); the rest is in the module's docstring."""
    if not logging.getLogger("lab").handlers and not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(levelname)s:     %(name)s: %(message)s")
    holder: dict = {}

    def on_fatal(cause: str) -> None:
        if not exit_on_failure:
            log.error("staying up on failure (--stay-up-on-failure): /health answers 503 until stopped")
            return

        def later():
            time.sleep(failure_grace_s)
            log.error("exiting with status 1 after %g s of answering 503", failure_grace_s)
            holder["server"].should_exit = holder["server"].force_exit = True
        threading.Thread(target=later, name="lab-failure-exit", daemon=True).start()

    engine = AsyncLLM(llm, warmup=warmup or None, step_timeout_s=step_timeout_s, on_fatal=on_fatal)
    config = uvicorn.Config(create_app(engine, model_name), host=host, port=port, log_level="info",
                            timeout_graceful_shutdown=drain_timeout_s + 5)
    server = holder["server"] = _Server(config, engine, drain_timeout_s)
    try:
        server.run()
    finally:
        if engine.failed:  # the ranks may be dead or stopped: no orderly close can reach them
            killed = kill_descendants()
            log.error("engine failed (%s); killed %d child process(es)", engine.failed, len(killed))
    if engine.failed or server.forced:
        if not engine.failed:
            kill_descendants()
        return 1
    stats = llm.stats()
    log.info("drained: %d request(s) finished, %d aborted at the %g-s deadline; KV blocks in use %d of %d",
             engine.drain_counts["finished"], engine.drain_counts["aborted"], drain_timeout_s,
             stats["kv_blocks_used"], stats["kv_blocks_total"])
    llm.close()
    left = [p for p in descendants() if "resource_tracker" not in (cmdline(p) or "")]  # multiprocessing's own helper
    if left:
        log.warning("killing %d child process(es) left after close: %s", len(left), left)
    kill_descendants()
    return 0

