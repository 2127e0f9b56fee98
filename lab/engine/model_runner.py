"""Turns a scheduled step into tensors and runs the model on the paged KV cache; returns the logits it needs.

For each scheduled (sequence, n) the step feeds tokens num_computed .. num_computed + n - 1 at
those positions; their KV goes to slot block_table[p // block_size] * block_size + p % block_size.
Only sequences whose step reaches their last token produce logits (their last row, plus as many rows
before it as the engine asks for: a speculative round's drafts), so the LM head, the largest matrix of a
small model, runs on a handful of rows rather than every prompt token. Sampling and verification happen
in the engine, on the returned `ModelOutput`. `build_runner` makes the model, its KV pool and the runner for an
`EngineConfig`: in this process, or as rank 0 of a tensor- or pipeline-parallel group (`lab.engine.parallel`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from lab.models import LlamaModel, default_device, default_dtype, load_model
from lab.models.attention import AttentionLayout, PagedAttentionMetadata, TorchPagedAttention, length_groups

from .kv_store import build_kv_store, default_num_blocks
from .parallel import start_group
from .request import Sequence


def eager_step(model, input_ids: torch.Tensor, positions: torch.Tensor, context, rows: list[int]) -> torch.Tensor:
    """The reference path: the model's forward over the flat batch, then the LM head on the rows asked for."""
    hidden = model(input_ids, positions, context)
    return model.compute_logits(hidden[rows]) if rows else hidden.new_empty(0, 0)


class KeysNotRebuildable(ValueError):
    """This family's keys are more than the K projection and a full RoPE of a layer's input (a k_norm, a partial
    RoPE): K/V cannot be rebuilt from the layer inputs (HCache replay), only recomputed from the tokens."""


@dataclass
class ModelOutput:
    logits: torch.Tensor  # [rows, vocab]: the rows below, in schedule order
    rows: list[slice | None]  # per scheduled (sequence, n): its rows of `logits`; None if its step ends mid-prompt
    # per scheduled (sequence, n): rows of `logits` at the prompt positions 0 .. P - 2 this chunk covers, for a
    # request that wants prompt logprobs (row p predicts prompt token p + 1); None otherwise
    prompt_rows: list[slice | None] | None = None


class ModelRunner:
    def __init__(self, model: LlamaModel, kv, block_size: int, attention_backend: str = "torch",
                 enforce_eager: bool = True, step=None, layout: AttentionLayout | None = None):
        """`kv`: the pool, a `lab.kv.KVStore` (`lab.engine.kv_store.build_kv_store`); `enforce_eager=False` runs the
        forward and the LM head as one compiled graph (`lab.engine.compiled`); `step`, a forward in `eager_step`'s
        signature that replaces both (a tensor- or pipeline-parallel group's, `lab.parallel`); `layout`: the windows
        and soft cap attention applies (the model's by default; `binding_layout` drops windows max_model_len never
        fills)."""
        self.model, self.kv, self.block_size = model, kv, block_size
        self.layout = model.attention_layout if layout is None else layout
        if step is not None:
            self.step = step
        elif enforce_eager:
            self.step = eager_step
        else:
            from .compiled import CompiledStep
            self.step = CompiledStep(model)
        self.device = model.embed_tokens.weight.device
        self.dtype = model.embed_tokens.weight.dtype
        self.attention_backend = attention_backend
        if attention_backend == "triton":  # imported here: lab.kernels imports Triton (and may set its interpreter)
            from .triton_attention import TritonPagedAttention, check_layout
            check_layout(self.layout)
            self.attention = lambda meta: TritonPagedAttention(self.kernel_caches, meta)
        else:
            self.attention = lambda meta: TorchPagedAttention(self.kv, meta, self.layout)

    @property
    def free_window(self) -> int | None:
        """The window outside which a sequence's blocks can be freed (`BlockManager.sliding_window`): the widest,
        when every layer has one that binds; None when one layer attends globally, since it reads every block of
        the one pool all layers share."""
        windows = self.layout.windows
        return max(windows) if windows and all(w is not None for w in windows) else None

    @functools.cached_property
    def kernel_caches(self) -> list:
        """Each layer's pool as the Triton kernels read and write it (views of the store's tensors)."""
        from .triton_attention import kernel_caches
        return kernel_caches(self.kv)

    @property
    def kv_cache_bytes(self) -> int:
        return self.kv.nbytes

    def slots(self, seq: Sequence, start: int, end: int) -> list[int]:
        """Flat pool slots of positions start .. end - 1 of `seq`."""
        bs, table = self.block_size, seq.block_table
        return [table[p // bs] * bs + p % bs for p in range(start, end)]

    def prepare(self, scheduled: list[tuple[Sequence, int]]):
        """Flat input_ids, positions and attention metadata."""
        bs = self.block_size
        ids, positions, slots = [], [], []
        decode_rows, decode_tables, decode_lens, prefills = [], [], [], []
        row = 0
        for seq, n in scheduled:
            start, end = seq.num_computed_tokens, seq.num_computed_tokens + n
            # Blocks freed outside a sliding window are NULL_BLOCK in the table: read as block 0, never attended.
            table = [max(b, 0) for b in seq.block_table[:-(-end // bs)]]
            ids.extend(seq.tokens_to_compute(start, end))
            positions.extend(range(start, end))
            slots.extend(self.slots(seq, start, end))
            if n == 1:
                decode_rows.append(row)
                decode_tables.append(table)
                decode_lens.append(end)
            else:
                prefills.append((row, n, table, end))
            row += n
        width = max((len(t) for t in decode_tables), default=0)
        padded = [b for t in decode_tables for b in t + [0] * (width - len(t))]
        ids, positions, slots, decode_rows, tables, lens, *prefill_tables = self.to_device(
            ids, positions, slots, decode_rows, padded, decode_lens, *(p[2] for p in prefills))
        outside = torch.arange(width * bs, device=self.device)[None, :] >= lens[:, None]
        bias = torch.zeros(outside.shape, dtype=self.dtype, device=self.device).masked_fill_(outside, float("-inf"))
        meta = PagedAttentionMetadata(
            slot_mapping=slots,
            positions=positions,
            decode_rows=decode_rows,
            decode_blocks=tables,
            decode_bias=bias[:, None, None, :],
            decode_lens=lens,
            prefills=[(r, n, t, end) for (r, n, _, end), t in zip(prefills, prefill_tables)],
            staging=self.kv.staging_metadata(scheduled, row),
            max_decode_len=max(decode_lens, default=0),
            decode_groups=length_groups(decode_lens),
        )
        return ids, positions, meta

    def to_device(self, *lists: list[int]) -> list[torch.Tensor]:
        """Host integer lists as int64 tensors on the model's device, in one copy: a tensor per list would be one
        synchronous host-to-device copy each (eight a step); one pinned buffer is one asynchronous transfer."""
        flat = torch.tensor([v for values in lists for v in values], dtype=torch.long, device="cpu")
        if self.device.type != "cpu":
            flat = flat.pin_memory().to(self.device, non_blocking=True)
        return list(flat.split([len(values) for values in lists]))

    @torch.inference_mode()
    def execute(self, scheduled: list[tuple[Sequence, int]], extra_rows: dict[int, int] | None = None) -> ModelOutput:
        """Run one step. A sequence whose step reaches its last token gets the logits of its last row and of the
        `extra_rows[request id]` rows before it; one LM-head call covers them all."""
        extra_rows = extra_rows or {}
        picked, rows, prompt_rows, end = [], [], [], 0
        for seq, n in scheduled:
            end += n
            start, last = seq.num_computed_tokens, min(seq.num_computed_tokens + n, seq.num_prompt_tokens - 1)
            if seq.params.prompt_logprobs is not None and start < last:
                prompt_rows.append(slice(len(picked), len(picked) + last - start))
                picked.extend(range(end - n, end - n + last - start))
            else:
                prompt_rows.append(None)
            if n != seq.num_wanted_tokens:  # the step stops short of the sequence's end: no logits
                rows.append(None)
                continue
            first = end - 1 - extra_rows.get(seq.request_id, 0)
            rows.append(slice(len(picked), len(picked) + end - first))
            picked.extend(range(first, end))
        input_ids, positions, meta = self.prepare(scheduled)
        logits = self.step(self.model, input_ids, positions, self.attention(meta), picked)
        return ModelOutput(logits, rows, prompt_rows)

    # ---- for extensions that rebuild KV outside a forward (HCache replay, lab.replay.hidden) ------------
    def observe_attention_inputs(self, fn) -> list:
        """Call fn(layer index, x) with each layer's attention input x [step tokens, hidden] (after its RMSNorm,
        what the QKV projection multiplies) during every forward; returns the handles to remove. Refused for a
        family whose keys are more than the K projection and a full RoPE (what `rebuild_kv` recomputes)."""
        c = self.model.config
        if c.family.qk_norm != "none" or c.rotary_dim != c.head_dim:
            raise KeysNotRebuildable(f"rebuilding K/V from layer inputs covers keys made by the K projection and RoPE "
                                     f"over the whole head; {c.architecture}'s keys also pass "
                                     f"{'a k_norm' if c.family.qk_norm != 'none' else 'a partial RoPE'}: "
                                     f"use token replay")
        return [layer.self_attn.qkv_proj.register_forward_pre_hook(lambda module, args, i=i: fn(i, args[0]))
                for i, layer in enumerate(self.model.layers)]

    @torch.inference_mode()
    def rebuild_kv(self, seq: Sequence, start: int, end: int, inputs) -> None:
        """Drop the K/V of positions start .. end - 1 of `seq` from the pool (zero their slots) and rebuild them
        from `inputs(layer)` [end - start, hidden], the layers' attention inputs at those positions, by the K/V
        projections and RoPE alone (`lab.kernels.replay_kv` on the Triton backend, its reference otherwise)."""
        from lab.kernels import replay_kv, replay_kv_ref
        replay = replay_kv if self.attention_backend == "triton" else replay_kv_ref
        pos = torch.arange(start, end, device=self.device)
        slots = torch.tensor(self.slots(seq, start, end), device=self.device)
        rope = self.model.rope
        for i, (layer, cache) in enumerate(zip(self.model.layers, self.kernel_caches)):
            for pool in (cache.k, cache.v):
                pool.view(-1, *pool.shape[2:])[slots] = 0  # dropped: what attention reads next is rebuilt
            attn = layer.self_attn
            w = attn.qkv_proj.weight[attn.q_size:]  # the K rows, then the V rows
            b = None if attn.qkv_proj.bias is None else attn.qkv_proj.bias[attn.q_size:]
            replay(inputs(i), w, b, pos, rope.cos, rope.sin, cache, slots)


def build_runner(c) -> tuple[LlamaModel, object, ModelRunner, int, list]:
    """For an `EngineConfig`: (the model, its tokenizer, the runner on its KV pool, the pool's blocks, extensions
    the runner brings). The model is loaded here unless one was passed; with tensor or pipeline parallelism it is
    rank 0's part and the other ranks are running (`lab.engine.parallel`)."""
    if isinstance(c.model, LlamaModel):
        model, tokenizer = c.model, c.tokenizer
    else:
        device = default_device() if c.device is None else c.device
        model, tokenizer = load_model(c.model, dtype=c.torch_dtype or default_dtype(device), device=device,
                                      max_positions=c.max_model_len,
                                      prepack_weights=c.prepack_weights and not c.parallel)  # shards and stages are cut from plain weights
    layout = check_model(c, model)
    if c.parallel:
        model, kv, num_blocks, ext = start_group(model, c)
        return model, tokenizer, ModelRunner(model, kv, c.block_size, step=ext.group.step), num_blocks, [ext]
    if not layout.plain and not c.kv_capabilities.attention_layouts:
        raise ValueError(f"kv_cache_dtype {c.kv_cache_dtype!r} keeps exact copies or pre-RoPE keys, which the lab's "
                         f"sliding windows and soft-capped attention do not read ({model.config.architecture} at "
                         f"max_model_len {c.max_model_len} needs them); use a format without them")
    num_blocks = c.num_kv_blocks or default_num_blocks(model, c.block_size, c.max_model_len, c.max_num_seqs,
                                                       c.kv_format)
    kv = build_kv_store(model, num_blocks, c.block_size, c.kv_format, c.kv_scales, c.max_num_seqs)
    runner = ModelRunner(model, kv, c.block_size, c.attention_backend, c.enforce_eager, layout=layout)
    return model, tokenizer, runner, num_blocks, []


def binding_layout(layout: AttentionLayout, max_model_len: int) -> AttentionLayout:
    """`layout` without the windows no sequence of max_model_len tokens fills (they change nothing)."""
    return AttentionLayout(tuple(w if w is not None and w < max_model_len else None for w in layout.windows),
                           layout.softcap)


def check_model(c, model) -> AttentionLayout:
    """The options against the loaded model; returns the attention layout the engine applies. Sliding windows
    that bind are attended (`lab.models.attention`), so a max_model_len beyond the window is allowed; a parallel
    group's workers do not carry a layout."""
    if c.max_model_len > model.rope.max_positions:
        raise ValueError(f"max_model_len {c.max_model_len} exceeds the model's rotary table of "
                         f"{model.rope.max_positions} positions")
    layout = binding_layout(model.attention_layout, c.max_model_len)
    if c.parallel and not layout.plain:
        raise ValueError(f"{model.config.architecture} with max_model_len {c.max_model_len} needs sliding windows "
                         f"or soft-capped attention, which tensor and pipeline parallelism do not carry; run it in "
                         f"one process")
    if c.replay is not None and layout.windows and all(layout.windows):
        raise ValueError(f"replay rewinds num_computed_tokens, and its recomputed queries would read blocks the "
                         f"engine freed outside {model.config.architecture}'s sliding window of "
                         f"{max(layout.windows)}; use a max_model_len within the window, or no replay")
    if c.tensor_parallel_size > 1 and model.config.family.embed_scale:
        raise ValueError(f"tensor parallelism cannot run {model.config.architecture}: its vocabulary-parallel "
                         f"embedding (lab.parallel.sharding) does not scale the embeddings by sqrt(hidden_size) as "
                         f"the family does; run it in one process or with pipeline parallelism")
    return layout
