"""The collectives a parallel step uses, each with a timeout and, on every rank, a clock and a byte count.

Two process groups over one rendezvous store (a `torch.distributed.TCPStore` that rank 0 opens on a free port):
the tensor group (NCCL on CUDA, gloo on the CPU) for the tensor-parallel all-reduces and logits gather and the
pipeline's point-to-point sends of hidden states and logits, and a gloo group
for the control channel, the per-step broadcast of the batch as pickled bytes (vLLM keeps such a CPU group beside
its device group for the same reason: metadata is small, host-side and of no fixed shape). The groups are
built directly rather than through `init_process_group`, so an engine leaves no global state behind and several
can live in one process.

Every call waits with a timeout: `timeout` inside a step, where a late peer means a hung or dead rank, and
`idle_timeout` for a worker waiting for the next step, which may come much later. Gloo reports a peer that died
at once ("connection closed by peer"); one that hangs is reported when the timeout expires. A failure marks the
channel broken, and every later call raises the same error at once (`on_error` turns it into the message the
caller sees: rank 0's group names the rank that failed).

The time of a collective on rank 0 includes waiting for the slowest rank to arrive, which is what a step
loses to it. On CUDA the clock synchronizes the device after each collective, so that it measures the transfer.
"""

from __future__ import annotations

import collections
import pickle
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from .sharding import split



def _gloo(store, rank: int, world: int, timeout: timedelta):
    opts = dist.ProcessGroupGloo._Options()
    opts._timeout = timeout
    opts._devices = [dist.ProcessGroupGloo.create_device(hostname="127.0.0.1")]
    return dist.ProcessGroupGloo(store, rank, world, opts)


class Collectives:
    def __init__(self, rank: int, world: int, device: torch.device, timeout: float, idle_timeout: float = 7 * 86400):
        self.rank, self.world, self.device = rank, world, torch.device(device)
        self.timeout, self.idle_timeout = timedelta(seconds=timeout), timedelta(seconds=idle_timeout)
        self.tensor_group = self.control_group = None
        self.error: Exception | None = None
        self.on_error = lambda error: error  # rank 0's group replaces it with one that names the failed rank
        self.seconds: dict[str, float] = collections.defaultdict(float)
        self.calls: dict[str, int] = collections.defaultdict(int)
        self.bytes: dict[str, int] = collections.defaultdict(int)

    def connect(self, host: str, port: int) -> None:
        """Join the rendezvous (rank 0 opened it: `open_store`) and build the two groups."""
        store = dist.TCPStore(host, port, self.world, is_master=False, timeout=self.timeout)
        self.connect_store(store)

    def connect_store(self, store) -> None:
        tensor_store, control_store = dist.PrefixStore("tensor", store), dist.PrefixStore("control", store)
        if self.device.type == "cuda":
            opts = dist.ProcessGroupNCCL.Options()
            opts._timeout = self.timeout
            self.tensor_group = dist.ProcessGroupNCCL(tensor_store, self.rank, self.world, opts)
        else:
            self.tensor_group = _gloo(tensor_store, self.rank, self.world, self.timeout)
        self.control_group = _gloo(control_store, self.rank, self.world, self.timeout)
        self._store = store  # the groups need the store alive

    def _run(self, kind: str, nbytes: int, start) -> None:
        """Start a collective (`start()` returns its work), wait for it and account for it."""
        if self.error is not None:
            raise self.error
        t = time.perf_counter()
        try:
            start().wait()
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
        except Exception as error:  # noqa: BLE001  the channel is broken for good: remember why
            self.error = self.on_error(error)
            raise self.error from error
        self.seconds[kind] += time.perf_counter() - t
        self.calls[kind] += 1
        self.bytes[kind] += nbytes

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum `x` over the ranks, in place; returns it."""
        x = x.contiguous()
        self._run("all_reduce", x.nbytes, lambda: self.tensor_group.allreduce(x, dist.ReduceOp.SUM, self.timeout))
        return x

    def gather_columns(self, x: torch.Tensor, total: int) -> torch.Tensor:
        """Rank 0: the ranks' column slices of `x` [rows, total // world ...] side by side, [rows, total]; other
        ranks: their own slice. Slices are `sharding.split(total, world)`, padded to the widest for the gather."""
        widths = [b - a for a, b in split(total, self.world)]
        padded = torch.nn.functional.pad(x, (0, widths[0] - x.shape[1])).contiguous()
        out = [torch.empty_like(padded) for _ in range(self.world)] if self.rank == 0 else []
        self._run("gather", padded.nbytes * (self.world - 1) if self.rank == 0 else padded.nbytes,
                  lambda: self.tensor_group.gather(out, padded, 0, self.timeout))
        return torch.cat([o[:, :w] for o, w in zip(out, widths)], 1) if self.rank == 0 else x

    def broadcast_object(self, obj=None, idle: bool = False):
        """Rank 0 sends `obj` (None: the stop signal), the others return it; `idle`: a worker waiting between
        steps, with `idle_timeout`. Two broadcasts: the pickled length, then the bytes."""
        timeout = self.idle_timeout if idle else self.timeout
        data = pickle.dumps(obj) if self.rank == 0 and obj is not None else b""
        header = torch.tensor([len(data)], dtype=torch.long)
        self._run("broadcast", header.nbytes, lambda: self.control_group.broadcast(header, 0, timeout))
        n = int(header.item())
        if n == 0:
            return None
        if self.rank == 0:
            buf = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        else:
            buf = torch.empty(n, dtype=torch.uint8)
        self._run("broadcast", n, lambda: self.control_group.broadcast(buf, 0, self.timeout))
        return obj if self.rank == 0 else pickle.loads(buf.numpy().tobytes())

    def all_gather_object(self, obj) -> list:
        """Every rank's `obj`, in rank order (at start-up: each rank's bytes); not timed as step traffic."""
        data = torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8)
        sizes = [torch.zeros(1, dtype=torch.long) for _ in range(self.world)]
        self.control_group.allgather([sizes], [torch.tensor([data.numel()])]).wait()
        width = int(max(s.item() for s in sizes))
        out = [torch.empty(width, dtype=torch.uint8) for _ in range(self.world)]
        self.control_group.allgather([out], [torch.nn.functional.pad(data, (0, width - data.numel()))]).wait()
        return [pickle.loads(o[:int(s.item())].numpy().tobytes()) for o, s in zip(out, sizes)]

    def send(self, x: torch.Tensor, dst: int, tag: int):
        """Start sending `x` to rank `dst`; returns a function that waits for it (and accounts for the wait)."""
        x = x.contiguous()
        if self.error is not None:
            raise self.error
        work = self.tensor_group.send([x], dst, tag)
        return lambda: self._run("send", x.nbytes, lambda: work)

    def recv(self, shape, dtype: torch.dtype, src: int, tag: int) -> torch.Tensor:
        """A tensor of `shape` and `dtype` from rank `src`, waiting for it."""
        x = torch.empty(shape, dtype=dtype, device=self.device)
        self._run("recv", x.nbytes, lambda: self.tensor_group.recv([x], src, tag))
        return x

    def stats(self, prefix: str, kinds: tuple[str, ...]) -> dict:
        """Seconds, calls and bytes of each of `kinds` and of all, as `{prefix}_*` entries for `LLM.stats()`."""
        out = {f"{prefix}_comm_seconds": sum(self.seconds.values()), f"{prefix}_comm_calls": sum(self.calls.values()),
               f"{prefix}_comm_bytes": sum(self.bytes.values())}
        for kind in kinds:
            out.update({f"{prefix}_{kind}_seconds": self.seconds[kind], f"{prefix}_{kind}_calls": self.calls[kind],
                        f"{prefix}_{kind}_bytes": self.bytes[kind]})
        return out


def open_store(world: int, timeout: float):
    """Rank 0's rendezvous on a free port of the loopback interface (the port is the store's `port`)."""
    return dist.TCPStore("127.0.0.1", 0, world, is_master=True, timeout=timedelta(seconds=timeout),
                         wait_for_workers=False)
