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

Once the engine cannot serve at all it says so (issue 53): a parallel rank died or is stopped (`LLM.health`,
polled by a watchdog thread every `watch_interval_s`, between steps and during one), a step ran past
`step_timeout_s` (a rank or the engine hung: the engine thread is stuck in it and cannot say so itself), a step
raised `RankFailure`, or the engine thread raised outside a step. Then `failed` holds the cause, every open
request ends with it at once, both probes answer 503 with it, new requests are refused with it, and `on_fatal`
is called (`lab serve` exits non-zero after a short grace, so an orchestrator restarts the process; vLLM's
server likewise answers 503 on `/health` once its engine is dead and shuts down).

Draining (`begin_drain`, on SIGTERM: `lab.serve.server`): readiness goes to 503 at once and new requests are
refused, the requests in flight run on until `deadline_s`, and what is left then is aborted through the engine's
one abort (`LLM.abort`), so each stream still gets its last chunk, with finish reason "abort", and its blocks go
back; `drained` is set when nothing is left.
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
from lab.parallel.group import RankFailure

from .metrics import ServerMetrics

log = logging.getLogger(__name__)


Delta = RequestDelta  # what a request's iterator yields: the engine's own deltas (lab.engine.output)


WARMUP_PROMPT_TOKENS = 16


def warm_up(llm: LLM) -> None:
    """One 16-token prompt and two decode steps: the first prefill and decode steps' one-time costs, paid."""
    llm.generate([[1] * WARMUP_PROMPT_TOKENS], SamplingParams(max_tokens=2, ignore_eos=True))


class AsyncLLM:
    """`warmup`: None (ready at once), True (`warm_up`) or a function of the `LLM` run in the engine thread
    before it takes requests. `ready` is set when it returns; `failed` holds its error if it raised, or the cause
    once the engine cannot serve (`fatal`). `step_timeout_s`: a step running longer is a hang; `on_fatal(cause)` is
    called once, from whichever thread found the failure."""

    def __init__(self, llm: LLM, metrics: ServerMetrics | None = None,
                 warmup: bool | Callable[[LLM], None] | None = None, step_timeout_s: float = 60.0,
                 watch_interval_s: float = 0.5, on_fatal: Callable[[str], None] | None = None):
        if not step_timeout_s > 0 or not watch_interval_s > 0:
            raise ValueError(f"step_timeout_s and watch_interval_s must be positive seconds, got {step_timeout_s!r} "
                             f"and {watch_interval_s!r}")
        self.llm = llm
        self.warmup = warm_up if warmup is True else (warmup or None)
        self.ready = threading.Event()
        self.failed: str | None = None
        self.warmup_seconds: float | None = None
        self.metrics = metrics or ServerMetrics(llm)
        self.step_timeout_s, self.watch_interval_s, self.on_fatal = step_timeout_s, watch_interval_s, on_fatal
        self.draining = False
        self.drained = threading.Event()
        self.drain_counts = {"finished": 0, "aborted": 0}  # requests that ended while draining, and how
        self._drain_deadline: float | None = None
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._streams: dict[int, asyncio.Queue] = {}  # request id -> its queue of (request id, delta)
        self._lock = threading.Lock()  # `_streams` and `failed`: the watchdog ends streams while a step may hang
        self._step_started: float | None = None  # monotonic time the running step began (None between steps)
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._watchdog: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    # ---- lifecycle (event-loop side) -------------------------------------------------------------
    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop.clear()
        self.ready.clear()
        self.failed = None
        self._thread = threading.Thread(target=self._run, name="lab-engine", daemon=True)
        self._thread.start()
        self._watchdog = threading.Thread(target=self._watch, name="lab-engine-watchdog", daemon=True)
        self._watchdog.start()

    def shutdown(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            # a failed engine's thread may be stuck in a collective with a dead rank: do not wait out its timeout
            self._thread.join(timeout=1 if self.failed else 30)

    def begin_drain(self, deadline_s: float) -> None:
        """Stop taking requests (readiness 503 at once) and finish those in flight, aborting what is left after
        `deadline_s` seconds (`drained` is set when none is left)."""
        self._drain_deadline = time.monotonic() + max(0.0, deadline_s)
        self.draining = True
        self._wake.set()
        if not self.num_active:
            self.drained.set()

    def fatal(self, cause: str) -> None:
        """The engine cannot serve: record why, end every open request with it, stop the engine thread and tell
        `on_fatal` (once; later calls are ignored)."""
        with self._lock:
            if self.failed:
                return
            self.failed = cause
            streams, self._streams = list(self._streams.items()), {}
            while True:  # requests queued for a thread that will not take them
                try:
                    kind, arg, q = self._commands.get_nowait()
                except queue.Empty:
                    break
                if kind == "add":
                    streams += [(seq.request_id, q) for seq in arg]
        self.ready.clear()
        log.error("the engine cannot serve: %s", cause)
        for rid, q in streams:
            self._loop.call_soon_threadsafe(q.put_nowait, (rid, RequestDelta(rid, [], "", True, error=cause)))
            self.metrics.failed.inc()
        self._stop.set()
        self._wake.set()
        if self.on_fatal is not None:
            self.on_fatal(cause)

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
        if self.failed:  # no engine thread will take it
            for seq in seqs:
                yield index[seq.request_id], RequestDelta(seq.request_id, [], "", True, error=self.failed)
            return
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
        """'failed', 'draining', 'warming up' or 'ready'."""
        if self.failed:
            return "failed"
        if self.draining:
            return "draining"
        return "ready" if self.ready.is_set() else "warming up"

    def _run(self) -> None:
        try:
            if not self._warm_up():
                return
            while not self._stop.is_set():
                self._drain()
                if self.draining:
                    self._drain_step()
                if not self.llm.has_unfinished():
                    self._wake.wait(0.05)
                    self._wake.clear()
                    continue
                self._step_started = time.monotonic()
                try:
                    deltas = self.llm.step()
                except RankFailure as e:  # a rank is gone: no later step can succeed
                    self.fatal(str(e).splitlines()[0])
                    return
                except Exception as e:  # noqa: BLE001  one failing step must not take the server down
                    log.exception("engine step failed outside any one request; failing the running requests")
                    self._fail_running(f"engine step failed: {type(e).__name__}: {e}")
                    continue
                finally:
                    self._step_started = None
                if self.failed:  # the watchdog gave up on this step while it ran
                    return
                self._publish(deltas)
        except Exception as e:  # noqa: BLE001  outside a step: the thread would die and leave the server mute
            log.exception("the engine thread raised outside a step")
            self.fatal(f"the engine thread raised outside a step: {type(e).__name__}: {e}")

    def _watch(self) -> None:
        """The watchdog: a step past its deadline, or a cause from `LLM.health`, makes the engine failed."""
        while not self._stop.wait(self.watch_interval_s):
            started = self._step_started
            if started is not None and (ran := time.monotonic() - started) > self.step_timeout_s:
                self.fatal(f"a step has run for {ran:.0f} s, past the step deadline of {self.step_timeout_s:g} s: "
                           f"a rank or the engine hung")
                return
            try:
                cause = self.llm.health()
            except Exception as e:  # noqa: BLE001  a probe that cannot look is a failure to report, not a crash
                cause = f"the engine's health check raised {type(e).__name__}: {e}"
            if cause:
                self.fatal(cause)
                return

    def _drain_step(self) -> None:
        """While draining: past the deadline, abort what is left, each stream ending with its last delta."""
        if time.monotonic() >= self._drain_deadline:
            with self._lock:
                streams, self._streams = list(self._streams.items()), {}
            for rid, q in streams:
                delta = self.llm.abort(rid)  # the engine's one abort: blocks back, finish reason "abort"
                if delta is None:  # a sample that never ran (held for its first's prompt)
                    delta = RequestDelta(rid, [], "", True, error="the server shut down before this request ran")
                self._loop.call_soon_threadsafe(q.put_nowait, (rid, delta))
                self.drain_counts["aborted"] += 1
                self.metrics.aborted.inc()
        if not self._streams:
            self.drained.set()

    def _drain(self) -> None:
        while True:
            try:
                kind, arg, q = self._commands.get_nowait()
            except queue.Empty:
                return
            with self._lock:
                if kind == "add" and self.failed:  # raced with `fatal`: end it as the others were
                    for seq in arg:
                        self._loop.call_soon_threadsafe(
                            q.put_nowait, (seq.request_id, RequestDelta(seq.request_id, [], "", True, error=self.failed)))
                elif kind == "add":  # a request's samples, all delivered to one queue
                    self.llm.add_samples(arg)
                    self._streams.update((seq.request_id, q) for seq in arg)
                elif arg in self._streams:  # abort
                    self.llm.abort(arg)
                    del self._streams[arg]
                    self.metrics.aborted.inc()

    def _publish(self, deltas: list[RequestDelta]) -> None:
        """Send each delta of the step (`LLM.step`: the engine's one output path) to its request's stream;
        nothing is decoded or rebuilt here."""
        with self._lock:
            for delta in deltas:
                q = self._streams.get(delta.request_id)
                if q is None:  # aborted while the step ran
                    continue
                self._loop.call_soon_threadsafe(q.put_nowait, (delta.request_id, delta))
                if delta.finished:
                    del self._streams[delta.request_id]
                    if self.draining:
                        self.drain_counts["finished"] += 1
                    if delta.error is None:
                        self.metrics.observe_finished(delta.output)

    def _fail_running(self, message: str) -> None:
        with self._lock:
            for rid, q in list(self._streams.items()):
                if self.llm.is_running(rid):
                    self.llm.abort(rid)
                    del self._streams[rid]
                    self._loop.call_soon_threadsafe(q.put_nowait, (rid, RequestDelta(rid, [], "", True, error=message)))
                    self.metrics.failed.inc()

    @property
    def num_active(self) -> int:
        return len(self._streams)
