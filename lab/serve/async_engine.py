"""`AsyncLLM`: the engine stepping in a thread of its own, requests arriving from an asyncio event loop.

The engine is synchronous (`LLM.step` is one forward). A server must accept and stream requests while it
steps, so the engine runs in one dedicated thread that owns it: requests and aborts reach it through a
command queue, drained before every step, and each step's new tokens go back to each request's asyncio
queue with `loop.call_soon_threadsafe`. Nothing else touches the `LLM`, so it needs no lock. This is the
shape of vLLM's `AsyncLLM` (engine core in its own process) reduced to one thread.

Readiness (for a Kubernetes readiness probe): with `warmup`, the engine thread first runs one small request,
so the first real request does not pay the first step's one-time costs (allocator growth, kernel selection,
lazily built tables), and `ready` is set only after it. The server listens from the start, so a liveness probe
(`/health`) passes during warm-up while the readiness probe (`/ready`) keeps traffic away until then. A warm-up
that raises leaves the engine failed: both probes report it, so the orchestrator restarts the process.

A request that is abandoned (the client disconnected, the handler was cancelled) is aborted: its blocks go
back to the pool. A step that raises fails the requests it held, with the error, and the engine goes on
serving the others.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing

from lab.engine import LLM, SamplingParams
from lab.engine.output import RequestDelta
from lab.engine.request import Sequence

from .metrics import ServerMetrics

log = logging.getLogger(__name__)


Delta = RequestDelta  # what a request's iterator yields: the engine's own deltas (lab.engine.output)


WARMUP_PROMPT_TOKENS = 16


def warm_up(llm: LLM) -> None:
    """One 16-token prompt and two decode steps: the first prefill and decode steps' one-time costs, paid."""
    llm.generate([[1] * WARMUP_PROMPT_TOKENS], SamplingParams(max_tokens=2, ignore_eos=True))


class AsyncLLM:
    """`warmup`: None (ready at once), True (`warm_up`) or a function of the `LLM` run in the engine thread
    before it takes requests. `ready` is set when it returns; `failed` holds its error if it raised."""

    def __init__(self, llm: LLM, metrics: ServerMetrics | None = None,
                 warmup: bool | Callable[[LLM], None] | None = None):
        self.llm = llm
        self.warmup = warm_up if warmup is True else (warmup or None)
        self.ready = threading.Event()
        self.failed: str | None = None
        self.warmup_seconds: float | None = None
        self.metrics = metrics or ServerMetrics(llm)
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._streams: dict[int, asyncio.Queue] = {}  # request id -> its queue of (request id, delta)
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    # ---- lifecycle (event-loop side) -------------------------------------------------------------
    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop.clear()
        self.ready.clear()
        self.failed = None
        self._thread = threading.Thread(target=self._run, name="lab-engine", daemon=True)
        self._thread.start()

    def shutdown(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    # ---- requests (event-loop side) --------------------------------------------------------------
    def validate(self, prompt, params: SamplingParams) -> Sequence:
        """Tokenize and check a request (ValueError names the value and the limit); nothing is queued."""
        return self.llm.make_sequence(prompt, params)

    async def generate(self, seq: Sequence) -> AsyncIterator[Delta]:
        """Queue a validated request and yield its deltas until it finishes; abandoning the iterator aborts it."""
        async with aclosing(self.generate_samples([seq])) as deltas:
            async for _, delta in deltas:
                yield delta

    def validate_samples(self, prompt, params: SamplingParams) -> list[Sequence]:
        """`validate` for each of the request's `params.n` samples (sample i seeded with seed + i)."""
        return [self.llm.make_sequence(prompt, p) for p in params.samples()]

    async def generate_samples(self, seqs: list[Sequence]) -> AsyncIterator[tuple[int, Delta]]:
        """The deltas of a request's samples (from `validate_samples`), tagged with the sample's index, until
        every one has finished. The engine fans them out as it does for `LLM.generate` (`LLM.add_samples`: the
        others wait until the first has computed the prompt, then share its blocks). Abandoning the iterator
        aborts every sample, those still held included."""
        merged: asyncio.Queue = asyncio.Queue()
        index = {seq.request_id: i for i, seq in enumerate(seqs)}
        self._commands.put(("add", seqs, merged))
        self._wake.set()
        running = len(seqs)
        try:
            while running:
                rid, delta = await merged.get()
                running -= delta.finished
                yield index[rid], delta
        finally:
            if running:
                for seq in seqs:
                    self._commands.put(("abort", seq.request_id, None))
                self._wake.set()

    # ---- the engine thread --------------------------------------------------------------------------
    def _warm_up(self) -> bool:
        if self.warmup is not None:
            t = time.perf_counter()
            try:
                self.warmup(self.llm)
            except Exception as e:  # noqa: BLE001  reported by the probes, not raised into a dead thread
                log.exception("warm-up failed; the server reports itself failed")
                self.failed = f"warm-up failed: {type(e).__name__}: {e}"
                return False
            self.warmup_seconds = time.perf_counter() - t
        self.ready.set()
        return True

    @property
    def status(self) -> str:
        """'failed', 'warming up' or 'ready'."""
        return "failed" if self.failed else "ready" if self.ready.is_set() else "warming up"

    def _run(self) -> None:
        if not self._warm_up():
            return
        while not self._stop.is_set():
            self._drain()
            if not self.llm.has_unfinished():
                self._wake.wait(0.05)
                self._wake.clear()
                continue
            try:
                deltas = self.llm.step()
            except Exception as e:  # noqa: BLE001  one failing step must not take the server down
                log.exception("engine step failed outside any one request; failing the running requests")
                self._fail_running(f"engine step failed: {type(e).__name__}: {e}")
                continue
            self._publish(deltas)

    def _drain(self) -> None:
        while True:
            try:
                kind, arg, q = self._commands.get_nowait()
            except queue.Empty:
                return
            if kind == "add":  # a request's samples, all delivered to one queue
                self.llm.add_samples(arg)
                self._streams.update((seq.request_id, q) for seq in arg)
            elif arg in self._streams:  # abort
                self.llm.abort(arg)
                del self._streams[arg]
                self.metrics.aborted.inc()

    def _publish(self, deltas: list[RequestDelta]) -> None:
        """Send each delta of the step (`LLM.step`: the engine's one output path) to its request's stream;
        nothing is decoded or rebuilt here."""
        for delta in deltas:
            q = self._streams.get(delta.request_id)
            if q is None:  # aborted while the step ran
                continue
            self._loop.call_soon_threadsafe(q.put_nowait, (delta.request_id, delta))
            if delta.finished:
                del self._streams[delta.request_id]
                if delta.error is None:
                    self.metrics.observe_finished(delta.output)

    def _fail_running(self, message: str) -> None:
        for rid, q in list(self._streams.items()):
            if self.llm.is_running(rid):
                self.llm.abort(rid)
                del self._streams[rid]
                self._loop.call_soon_threadsafe(q.put_nowait, (rid, RequestDelta(rid, [], "", True, error=message)))
                self.metrics.failed.inc()

    @property
    def num_active(self) -> int:
        return len(self._streams)
