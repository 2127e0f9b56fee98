"""Pipeline parallelism: the layers split into stages on separate ranks, micro-batches flowing through them.

GPipe (Huang et al., 2019, arXiv:1811.06965), forward only: rank r holds layers [a_r, b_r) (`sharding.split` of
the layer count), rank 0 also the embedding, the last rank the final norm and the LM head; each rank's KV pool
holds its own layers only. A step's flat batch is cut at sequence boundaries into m micro-batches of near-equal
tokens (`micro_batches`); rank 0 runs its stage on micro-batch k and sends the hidden states [tokens, hidden] to
rank 1 without waiting, then goes on with micro-batch k + 1 while rank 1 works on k, and so on down the pipeline;
the last rank sends the logits of the rows the engine asked for back to rank 0. With p stages of equal time t per
micro-batch a step takes (m + p - 1) t, of which each rank idles (p - 1) t: the bubble, (p - 1) / (m + p - 1).
Rank 0's wait for the logits (`pp_recv_seconds` in `LLM.stats()`) is where it shows.

The batch itself (token ids, positions, attention metadata, LM-head rows, the cuts) is broadcast once per step,
as in tensor parallelism; every rank cuts the metadata the same way (`split_meta`). Computation per token is
exactly the single-process model's, layer by layer; only the batch a matmul sees is smaller.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from lab.models.attention import length_groups
from lab.models.llama import LlamaModel

from .collectives import Collectives
from .group import WorkerGroup
from .sharding import split
from .worker import to_device


@torch.no_grad()
def stage_model(model: LlamaModel, rank: int, world: int) -> LlamaModel:
    """A new `LlamaModel` holding stage `rank`'s layers (copies), with layer indices from 0 so that its KV pool
    holds its layers only; the embedding on the first stage (and on the last when the LM head is tied to it), the
    final norm and LM head on the last. Parts a stage does not hold are `nn.Identity`. Its `config` is the whole
    model's."""
    config = model.config
    if world > config.num_hidden_layers:
        raise ValueError(f"pipeline_parallel_size {world} exceeds the model's {config.num_hidden_layers} layers")
    a, b = split(config.num_hidden_layers, world)[rank]
    first, last, tied = rank == 0, rank == world - 1, config.tie_word_embeddings
    net = LlamaModel.empty(dataclasses.replace(config, num_hidden_layers=b - a), model.embed_tokens.weight.device,
                           model.rope.max_positions, first_layer=a)  # which layers are sparse: the whole model's count
    state = {f"layers.{i - a}.{k}": w for i in range(a, b) for k, w in model.layers[i].state_dict().items()}
    if first or (last and tied):
        state["embed_tokens.weight"] = model.embed_tokens.weight
    if last:
        state["norm.weight"] = model.norm.weight
        if not tied:
            state["lm_head.weight"] = model.lm_head.weight
    missing, unexpected = net.load_state_dict({k: w.contiguous().clone() for k, w in state.items()}, strict=False,
                                              assign=True)
    if unexpected or any(k.startswith("layers.") for k in missing):  # a layer built unlike the model's would be garbage
        raise ValueError(f"stage {rank}'s layers do not match the model's: missing {missing[:3]}, "
                         f"unexpected {unexpected[:3]}")
    net.tie_weights()
    net.store_weights_transposed()
    if not (first or (last and tied)):
        net.embed_tokens = nn.Identity()
    if not last:
        net.norm, net.lm_head = nn.Identity(), nn.Identity()
    net.config = config
    return net.eval()


def stage_for_rank(model: LlamaModel, rank: int, world: int, comm) -> LlamaModel:
    """A worker's stage (`lab.parallel.worker.WorkerSpec.build`)."""
    return stage_model(model, rank, world)


def run_stage(stage: LlamaModel, x: torch.Tensor, positions: torch.Tensor, ctx, first: bool, last: bool):
    """The stage's part of the forward: token ids in on the first stage, hidden states in on the others; the
    final norm on the last."""
    if first:
        x = stage.embed_tokens(x)
    rope = stage.rope(positions)
    for layer in stage.layers:
        x = layer(x, rope, ctx)
    return stage.norm(x) if last else x


def micro_batches(meta, num_tokens: int, m: int) -> list[tuple[int, int]]:
    """Rows [r0, r1) of up to `m` micro-batches of near-equal tokens, cut where a sequence starts (a sequence's
    rows stay together: its attention reads them as one query block)."""
    starts = sorted(meta.decode_rows.tolist() + [start for start, *_ in meta.prefills])
    cuts, r0 = [], 0
    for k in range(1, m):
        later = [s for s in starts if s > r0]
        if not later:
            break
        r1 = min(later, key=lambda s: abs(s - num_tokens * k / m))
        cuts.append((r0, r1))
        r0 = r1
    return cuts + [(r0, num_tokens)]


def split_meta(meta, r0: int, r1: int):
    """The attention metadata of rows [r0, r1) of a step (whole sequences), re-indexed from 0."""
    rows = meta.decode_rows
    keep = (rows >= r0) & (rows < r1)
    bd = rows.numel()
    blocks = meta.decode_blocks.view(bd, -1)[keep].reshape(-1) if bd else meta.decode_blocks
    return dataclasses.replace(meta, slot_mapping=meta.slot_mapping[r0:r1], positions=meta.positions[r0:r1],
                               decode_rows=rows[keep] - r0, decode_blocks=blocks, decode_bias=meta.decode_bias[keep],
                               decode_lens=meta.decode_lens[keep],
                               decode_groups=length_groups(meta.decode_lens[keep].tolist()),
                               prefills=[(s - r0, q, b, c) for s, q, b, c in meta.prefills if r0 <= s < r1])


def rows_in(rows: list[int], r0: int, r1: int) -> list[int]:
    return [r - r0 for r in rows if r0 <= r < r1]


class PipelineGroup(WorkerGroup):
    kind = "pipeline-parallel"

    def __init__(self, model, source: str, world: int, micro_batches: int, timeout: float = 60.0, seed: int = 0,
                 prepack_weights: bool = False):
        super().__init__(model, source, world, timeout, seed, prepack_weights)
        self.set_micro_batches(micro_batches)
        self.stage = stage_model(model, 0, world)

    def set_micro_batches(self, m: int) -> None:
        """Cut each later step into up to `m` micro-batches. Only rank 0 reads the count (the cuts travel with
        each step's batch), so one running group can be measured at several counts without restarting its
        ranks (notebook 08's bubble against m)."""
        if isinstance(m, bool) or not isinstance(m, int) or m < 1:
            raise ValueError(f"micro_batches must be a positive integer, got {m!r}")
        self.micro_batches = m

    def start(self, make_attention, kv_bytes: int) -> None:
        super().start(self.stage, make_attention, kv_bytes, stage_for_rank, serve_stage)

    def step(self, model, input_ids: torch.Tensor, positions: torch.Tensor, context, rows: list[int]) -> torch.Tensor:
        """The model runner's forward on rank 0: send the batch, push its micro-batches through stage 0, collect
        the logits of `rows` [len(rows), vocab] from the last stage. `context` is the engine's attention context
        for the whole step; each micro-batch gets one of the same type over the same pool."""
        def forward():
            meta, vocab = context.meta, model.config.vocab_size
            cuts = micro_batches(meta, input_ids.numel(), self.micro_batches)
            self.send_batch((input_ids, positions, meta, rows, cuts))
            sends = []
            for k, (r0, r1) in enumerate(cuts):
                ctx = type(context)(context.store, split_meta(meta, r0, r1))
                x = run_stage(model, input_ids[r0:r1], positions[r0:r1], ctx, first=True, last=False)
                sends.append(self.comm.send(x, 1, k))
            for wait in sends:
                wait()
            logits = [self.comm.recv((n, vocab), torch.float32, self.world - 1, k)
                      for k, (r0, r1) in enumerate(cuts) if (n := len(rows_in(rows, r0, r1)))]
            return torch.cat(logits) if logits else input_ids.new_empty(0, 0, dtype=torch.float32)
        return self.timed(forward)

    def stats(self) -> dict:
        return {"pipeline_parallel_size": self.world, "pp_micro_batches": self.micro_batches,
                **super().stats("pp", ("send", "recv", "broadcast"))}


@torch.inference_mode()
def serve_stage(stage: LlamaModel, attention, comm: Collectives, device: torch.device) -> None:
    """Stage `comm.rank` > 0: for each micro-batch, receive the hidden states from the stage before, run the
    layers, send them on, or, on the last stage, send the logits of the rows asked for to rank 0."""
    rank, last = comm.rank, comm.rank == comm.world - 1
    width, dtype = stage.config.hidden_size, stage.layers[0].post_attention_layernorm.weight.dtype
    while (batch := comm.broadcast_object(idle=True)) is not None:
        _, positions, meta, rows, cuts = to_device(batch, device)
        sends = []
        for k, (r0, r1) in enumerate(cuts):
            x = comm.recv((r1 - r0, width), dtype, rank - 1, k)
            x = run_stage(stage, x, positions[r0:r1], attention(split_meta(meta, r0, r1)), first=False, last=last)
            if not last:
                sends.append(comm.send(x, rank + 1, k))
            elif picked := rows_in(rows, r0, r1):
                sends.append(comm.send(stage.compute_logits(x[picked]), 0, k))
        for wait in sends:
            wait()
