"""The engine's side of tensor and pipeline parallelism, `LLM(model, tensor_parallel_size=N)` or
`pipeline_parallel_size=N` (the splitting, the processes and the per-step protocols are `lab.parallel`'s).

`start_group` builds rank 0's part of the model (a shard: its heads, features and vocabulary rows; or a stage: its
layers), sizes the KV pool for that part (its own KV heads or layers), starts ranks 1 .. N - 1 with
`paged_attention` as their pool and attention (every rank's pool has the same number of blocks, so rank 0's block
tables address all of them), and hands the model runner the group's `step` as its forward. The group joins the
engine as an extension only for `stats()` (the `tp_*` or `pp_*` entries: seconds, calls and bytes of each
collective on rank 0, each rank's weight and KV bytes) and `close()`.
"""

from __future__ import annotations

import functools

from lab.parallel.group import TensorParallelGroup
from lab.parallel.pipeline import PipelineGroup

from lab.models.attention import TorchPagedAttention
from .extension import EngineExtension
from .kv_store import build_kv_store, default_num_blocks


def paged_attention(model, num_blocks: int, block_size: int):
    """A worker's KV pool for its part, as (metadata -> attention context, pool bytes). Module-level, so that
    it pickles by name into the worker process."""
    kv = build_kv_store(model, num_blocks, block_size)
    return functools.partial(TorchPagedAttention, kv), kv.nbytes


class ParallelExtension(EngineExtension):
    def __init__(self, group, name: str):
        self.group, self.name = group, name

    def stats(self) -> dict:
        return self.group.stats()

    def health(self) -> str | None:
        return self.group.failure_now()

    def close(self) -> None:
        self.group.close()


def start_group(model, config):
    """(rank 0's part, its KV pool, the pool's blocks, the extension holding the running group) for an engine
    `config` with tensor_parallel_size or pipeline_parallel_size > 1."""
    c = config
    prepack = c.prepack_weights and c.enforce_eager  # as a single-process engine's model (`build_runner`)
    if c.tensor_parallel_size > 1:
        group = TensorParallelGroup(model, str(c.model), c.tensor_parallel_size, c.parallel_timeout,
                                    prepack_weights=prepack)
        part, name = group.shard, "tensor_parallel"
    else:
        group = PipelineGroup(model, str(c.model), c.pipeline_parallel_size,
                              c.pipeline_micro_batches or c.pipeline_parallel_size, c.parallel_timeout,
                              prepack_weights=prepack)
        part, name = group.stage, "pipeline_parallel"
    # rank 0's part is the largest; on a CPU every rank's pool comes out of the same memory
    sharers = group.world if group.device.type == "cpu" else 1
    num_blocks = c.num_kv_blocks or default_num_blocks(part, c.block_size, c.max_model_len, c.max_num_seqs, None,
                                                       sharers)
    kv = build_kv_store(part, num_blocks, c.block_size)
    group.start(functools.partial(paged_attention, num_blocks=num_blocks, block_size=c.block_size), kv.nbytes)
    return part, kv, num_blocks, ParallelExtension(group, name)
