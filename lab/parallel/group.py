"""Rank 0's side of a group of worker processes: it starts them, runs each step with them and stops them.

`WorkerGroup` is what tensor and pipeline parallelism share: processes, rendezvous, failure, close, stats.
`TensorParallelGroup` adds the shard and the tensor-parallel step; `lab.parallel.pipeline.PipelineGroup` the
stage and the pipeline's. The caller's process is rank 0: it holds the engine (scheduler, block manager,
extensions, sampling) and its own part. `start` spawns ranks 1 .. N - 1 (`torch.multiprocessing`, spawn: a fork
would copy the caller's threads and CUDA state), waits until each has loaded its part (a watchdog polls their
liveness and start-up reports), then joins the rendezvous. A tensor-parallel step (`TensorParallelGroup.step`,
the model runner's forward):

    rank 0: broadcast (input_ids, positions, attention metadata, LM-head rows)       control group, 2 broadcasts
    all:    embedding all-reduce; per layer: o_proj all-reduce, down_proj all-reduce  tensor group, 2 L + 1
    all:    LM head on the vocabulary slice; rank 0 gathers the logits             tensor group, 1 gather

so a step of L layers has 2 L + 2 collectives on the tensor group, each timed on rank 0 (`stats`).

Failure: a worker that raises reports its traceback and exits; one that dies closes its connections; either way
rank 0's next collective fails at once (or after `timeout` seconds if a rank hangs), and `RankFailure` names the
rank and the cause. An error on rank 0 after the batch went out stops the group too (`timed`): the ranks would
otherwise wait in different collectives. The workers are terminated and joined by `close`, by garbage
collection of the group and at interpreter exit (`weakref.finalize`), so none outlives the engine.
"""

from __future__ import annotations

import queue
import time
import weakref

import torch
import torch.multiprocessing as mp

from lab.machine.procs import proc_stat
from lab.models import prepack

from .collectives import Collectives, open_store
from .spawning import check_main_module, log_tail, remove_logs, start_logged
from .sharding import plan_shards, shard_for_rank, shard_model, weight_bytes
from .worker import WorkerSpec, run_worker, serve_steps, to_device

# Start-up (spawn, imports, loading the model) may take this many collective timeouts.
START_TIMEOUTS = 5


class RankFailure(RuntimeError):
    """A rank of a tensor- or pipeline-parallel group died, raised or hung: the group cannot compute another step."""


def _stop(processes: list, seconds: float = 5.0) -> None:
    """Terminate the workers that are still running (SIGTERM, then SIGKILL after `seconds`) and reap them all.
    `close` has sent the stop signal and waited before; garbage collection and interpreter exit come here
    directly, with the workers idle between steps."""
    for p in processes:
        if p.pid is None:  # never started
            continue
        if p.is_alive():
            p.terminate()
        p.join(seconds)
        if p.is_alive():
            p.kill()
            p.join()


def _stopped(pid: int) -> bool:
    """Whether process `pid` is stopped by a signal or traced (state T or t in /proc; False where there is none)."""
    stat = proc_stat(pid)
    return stat is not None and stat.state in "Tt"


class WorkerGroup:
    kind = "parallel"  # how messages name a rank ("tensor-parallel rank 1")

    def __init__(self, model, source: str, world: int, timeout: float, seed: int, prepack_weights: bool = False):
        """Rank 0 of `world` ranks for `model`, loaded from `source` (a name or path for `lab.models.load_model`,
        which each worker loads too); the other ranks start in `start`. `prepack_weights`: every rank's part
        prepacked where that pays (`lab.models.prepack.wanted`), as a single-process engine's model is: the parts
        are cut from plain weights, and left plain they made every rank's matmuls slower than TP=1's."""
        self.world, self.source, self.timeout, self.seed = world, source, timeout, seed
        self.prepack_weights = prepack_weights
        self.device = model.embed_tokens.weight.device
        self.dtype, self.max_positions = model.embed_tokens.weight.dtype, model.rope.max_positions
        self.comm = Collectives(0, world, self.device, timeout)
        self.comm.on_error = self._failure
        self.processes: list = []
        self.rank_bytes: list[dict] = []
        self.steps, self.step_seconds, self.last_step = 0, 0.0, {}
        self._finalizer, self._threads = None, None
        self.logs: list = []  # each worker's stderr (lab.parallel.spawning)

    def start(self, module, make_attention, kv_bytes: int, build, serve) -> None:
        """Spawn ranks 1 .. N - 1, each building its part with `build` and running steps with `serve` (see
        `WorkerSpec`); returns once every rank has connected. `module` and `kv_bytes` are rank 0's part."""
        check_main_module(self.kind)
        if self.device.type == "cpu":
            self._threads = torch.get_num_threads()  # restored by close
            torch.set_num_threads(1)  # rank 0 too: N ranks of one thread each share the cores
        if self.prepack_weights:
            prepack.where_it_pays(module)
        store = open_store(self.world, self.timeout)
        spec = WorkerSpec(self.source, self.dtype, self.device.type, self.max_positions, self.seed, self.world,
                          "127.0.0.1", store.port, self.timeout, make_attention, build, serve, self.prepack_weights)
        ctx = mp.get_context("spawn")
        self.events = ctx.Queue()
        self.processes = [ctx.Process(target=run_worker, args=(r, spec, self.events), daemon=True,
                                      name=f"lab-rank{r}") for r in range(1, self.world)]
        self._finalizer = weakref.finalize(self, _stop, self.processes)
        self.logs = start_logged(self.processes)
        self._wait_ready()
        self.comm.connect_store(store)
        self.rank_bytes = self.comm.all_gather_object({"weight_bytes": weight_bytes(module), "kv_bytes": kv_bytes,
                                                       "prepacked_linears": prepack.count(module)})

    def _wait_ready(self) -> None:
        """The watchdog of start-up: every worker reports ready, or one reports an error or dies, or time is up."""
        ready, deadline = set(), time.monotonic() + START_TIMEOUTS * self.timeout
        while len(ready) < self.world - 1:
            try:
                rank, kind, payload = self.events.get(timeout=0.2)
            except queue.Empty:
                failure = self._failure(None) if any(not p.is_alive() for p in self.processes) else None
                if failure is None and time.monotonic() > deadline:
                    failure = RankFailure(f"{self.kind} workers did not start within "
                                          f"{START_TIMEOUTS * self.timeout:.0f} s")
                if failure is not None:
                    self.close()
                    raise failure
                continue
            if kind == "error":
                self.close()
                raise RankFailure(f"{self.kind} rank {rank} failed to start:\n{payload}")
            ready.add(rank)

    def _failure(self, error: Exception | None) -> RankFailure:
        """The error to report for a failed collective: the rank that raised (its traceback's last line) or died
        (its exit code), else the collective's own message. The workers are stopped."""
        deadline = time.monotonic() + 2.0  # a worker that raised is still writing its report, or exiting
        while time.monotonic() < deadline and all(p.is_alive() for p in self.processes):
            time.sleep(0.05)
        reports = []
        while True:
            try:
                reports.append(self.events.get(timeout=0.1))
            except (queue.Empty, OSError, ValueError):
                break
        errors = [(rank, payload) for rank, kind, payload in reports if kind == "error"]
        dead = [(r, p.exitcode) for r, p in enumerate(self.processes, 1) if not p.is_alive()]
        if errors:
            rank, trace = errors[0]
            failure = RankFailure(f"{self.kind} rank {rank} raised: {trace.strip().splitlines()[-1]}")
        elif dead:
            rank, code = dead[0]
            tail = log_tail(self.logs[rank - 1] if rank <= len(self.logs) else None)
            failure = RankFailure(f"{self.kind} rank {rank} died (exit code {code})"
                                  + (f"; the end of its stderr ({self.logs[rank - 1]}):\n{tail}" if tail else ""))
        else:
            failure = RankFailure(f"a {self.kind} collective failed or timed out ({self.timeout:.0f} s): {error}")
        if self._finalizer is not None:
            self._finalizer()
        return failure

    def timed(self, forward):
        """Run rank 0's part of a step, `forward()`, timing it and its communication. Once the batch is sent, an
        error on rank 0 leaves the ranks in different collectives: the group is stopped and it is a
        `RankFailure`."""
        t, comm_before = time.perf_counter(), sum(self.comm.seconds.values())
        try:
            out = forward()
        except RankFailure:
            raise
        except Exception as error:  # noqa: BLE001
            self.comm.error = RankFailure(f"a {self.kind} step failed on rank 0 ({type(error).__name__}: "
                                          f"{error}); the group is stopped")
            self._finalizer()
            raise self.comm.error from error
        seconds = time.perf_counter() - t
        self.steps += 1
        self.step_seconds += seconds
        self.last_step = {"seconds": seconds, "comm_seconds": sum(self.comm.seconds.values()) - comm_before}
        return out

    def send_batch(self, batch) -> None:
        """Broadcast a step's batch (tensors travel through the host)."""
        self.comm.broadcast_object(batch if self.device.type == "cpu" else to_device(batch, torch.device("cpu")))

    def stats(self, prefix: str, kinds: tuple[str, ...]) -> dict:
        """Communication on rank 0 (`Collectives.stats`), the steps' total time, and each rank's bytes."""
        return {f"{prefix}_steps": self.steps, f"{prefix}_step_seconds": self.step_seconds,
                **self.comm.stats(prefix, kinds),
                f"{prefix}_rank_weight_bytes": [b["weight_bytes"] for b in self.rank_bytes],
                f"{prefix}_rank_kv_bytes": [b["kv_bytes"] for b in self.rank_bytes],
                f"{prefix}_rank_prepacked_linears": [b["prepacked_linears"] for b in self.rank_bytes]}

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.processes]

    def failure_now(self) -> str | None:
        """Why the group cannot compute another step, seen from outside it, without waiting: a rank that has died
        (its exit code) or is stopped (SIGSTOP, a debugger: it holds its connections open and would answer no
        collective until the timeout). None while every rank runs. Reads only; safe from another thread while a
        step runs (a server's watchdog: `lab.serve.async_engine`)."""
        if self.comm.error is not None:
            return str(self.comm.error).splitlines()[0]
        for rank, p in enumerate(self.processes, 1):
            if p.pid is None:
                continue
            if p.exitcode is not None:  # reaped: Popen.poll, without blocking
                return f"{self.kind} rank {rank} died (exit code {p.exitcode})"
            if _stopped(p.pid):
                return f"{self.kind} rank {rank} is stopped (pid {p.pid}, state T): it will answer no collective"
        return None

    def close(self) -> None:
        """Send the stop signal (if the group still works), join the workers and give rank 0 its threads back;
        safe to call twice."""
        if self._finalizer is not None and self._finalizer.alive:
            if self.comm.error is None and self.comm.control_group is not None:
                try:
                    self.comm.broadcast_object(None)
                    for p in self.processes:
                        p.join(self.timeout)
                except RankFailure:
                    pass  # _failure has stopped them already
            self._finalizer()
            if self.comm.error is None:
                remove_logs(self.logs)
        if self._threads is not None:
            torch.set_num_threads(self._threads)
            self._threads = None


class TensorParallelGroup(WorkerGroup):
    kind = "tensor-parallel"

    def __init__(self, model, source: str, world: int, timeout: float = 60.0, seed: int = 0,
                 prepack_weights: bool = False):
        """Shard `model` for rank 0 of `world` ranks (ValueError if its heads cannot be split `world` ways)."""
        super().__init__(model, source, world, timeout, seed, prepack_weights)
        self.plan = plan_shards(model.config, world)
        self.shard = shard_model(model, self.plan[0], self.comm)

    def start(self, make_attention, kv_bytes: int) -> None:
        super().start(self.shard, make_attention, kv_bytes, shard_for_rank, serve_steps)

    def step(self, model, input_ids: torch.Tensor, positions: torch.Tensor, context, rows: list[int]) -> torch.Tensor:
        """The model runner's forward on rank 0 (in place of `lab.engine.model_runner.eager_step`): send the batch,
        run rank 0's shard with the others, return the gathered logits of `rows` [len(rows), vocab]."""
        def forward():
            self.send_batch((input_ids, positions, context.meta, rows))
            hidden = model(input_ids, positions, context)
            return model.compute_logits(hidden[rows]) if rows else hidden.new_empty(0, 0)
        return self.timed(forward)

    def stats(self) -> dict:
        return {"tensor_parallel_size": self.world, **super().stats("tp", ("all_reduce", "gather", "broadcast"))}
