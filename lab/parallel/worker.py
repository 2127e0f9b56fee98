"""A worker: ranks 1 .. N - 1 of a tensor- or pipeline-parallel group, each a process started by
`lab.parallel.group` (spawn).

A worker loads the model from the same source as rank 0 (a name or path, or a `random:` preset with the same
seed, through `lab.models.load_model`), keeps only its part (`WorkerSpec.build`: a tensor-parallel shard,
`lab.parallel.sharding`, or a pipeline stage, `lab.parallel.pipeline`), builds its KV pool and attention with the
engine's factory (`WorkerSpec.make_attention`: the engine passes it in, so this package does not import the
engine), then loops (`WorkerSpec.serve`): receive a step's batch from rank 0, run its part (whose collectives meet
the other ranks'), wait for the next. The scheduler, block manager and sampling live on rank 0 only.

A worker reports start-up to rank 0 through `events` ("ready", or "error" with its traceback) and an exception in
a step the same way before it exits, so rank 0 can name the rank and the cause. The stop signal (an empty
broadcast) ends the loop; so does rank 0's death (gloo reports the closed connection).
"""

from __future__ import annotations

import dataclasses
import traceback
from dataclasses import dataclass
from typing import Callable

import torch

from .collectives import Collectives
from .sharding import weight_bytes


@dataclass
class WorkerSpec:
    """What a worker needs to rebuild its part of the engine; picklable (it crosses a spawn)."""

    source: str  # the model name or path (`load_model`)
    dtype: torch.dtype
    device: str  # rank 0's device type: "cpu", or "cuda" (rank r uses cuda:r)
    max_positions: int | None
    seed: int
    world: int
    host: str
    port: int
    timeout: float
    # the rank's part -> (meta -> attention context, the KV pool's bytes); a module-level function of the engine
    make_attention: Callable
    build: Callable  # (model, rank, world, comm) -> the rank's part (`sharding.shard_for_rank`, a pipeline stage)
    serve: Callable  # (part, attention, comm, device): run steps until the stop signal (`serve_steps`, ...)
    prepack: bool = False  # the part's linears prepacked for oneDNN where that pays, as rank 0's (`lab.models.prepack`)


def device_for(device: str, rank: int) -> torch.device:
    return torch.device(f"cuda:{rank}") if device == "cuda" else torch.device(device)


def to_device(obj, device: torch.device):
    """`obj` (tensors inside tuples, lists and dataclasses) with every tensor on `device`."""
    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_device(x, device) for x in obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.replace(obj, **{f.name: to_device(getattr(obj, f.name), device)
                                           for f in dataclasses.fields(obj) if f.init})
    return obj


def run_worker(rank: int, spec: WorkerSpec, events) -> None:
    """The process's main function (`torch.multiprocessing` passes the rank)."""
    try:
        torch.set_num_threads(1)  # one intra-op thread per rank: N ranks share the machine's cores
        from lab.models import load_model, prepack

        device = device_for(spec.device, rank)
        if device.type == "cuda":
            torch.cuda.set_device(device)  # NCCL binds a rank to the current device
        model, _ = load_model(spec.source, dtype=spec.dtype, device=device, max_positions=spec.max_positions,
                              seed=spec.seed, tokenizer=False)  # rank 0 tokenizes: a rank computes only
        comm = Collectives(rank, spec.world, device, spec.timeout)
        part = spec.build(model, rank, spec.world, comm)
        del model
        if spec.prepack:
            prepack.where_it_pays(part)
        attention, kv_bytes = spec.make_attention(part)
        events.put((rank, "ready", None))
        comm.connect(spec.host, spec.port)
        comm.all_gather_object({"weight_bytes": weight_bytes(part), "kv_bytes": kv_bytes,
                                "prepacked_linears": prepack.count(part)})
        spec.serve(part, attention, comm, device)
    except BaseException:  # noqa: BLE001  rank 0 reads the cause, then sees this process exit
        events.put((rank, "error", traceback.format_exc()))
        raise SystemExit(1) from None


@torch.inference_mode()
def serve_steps(shard, attention, comm: Collectives, device: torch.device) -> None:
    """A tensor-parallel rank: run the steps rank 0 broadcasts until it sends the stop signal. The forward and the
    choice of LM-head rows mirror rank 0's (`TensorParallelGroup.step`), so every collective has all ranks."""
    while (step := comm.broadcast_object(idle=True)) is not None:
        input_ids, positions, meta, rows = to_device(step, device)
        hidden = shard(input_ids, positions, attention(meta))
        if rows:
            shard.compute_logits(hidden[rows])
