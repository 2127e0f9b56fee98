"""Drafters: what proposes the tokens a speculative round verifies, behind one interface.

- `NgramDrafter`: prompt lookup decoding (Saxena, 2023, "Prompt Lookup Decoding"; vLLM's `ngram` method): the
  tokens that followed the latest earlier occurrence of the sequence's last n tokens (n from max_n down to
  min_n). No model forward (c ~ 0), deterministic (q one-hot), nothing proposed without a match.
- `ModelDrafter`: any small model sharing the target's vocabulary, run autoregressively k times on its own paged
  KV pool (its own `BlockManager` and `ModelRunner`, prefix caching included: the round that catches up on a
  prompt names its full blocks, so a later request with the same prefix skips them). It samples each draft from its
  own distribution q under the request's sampling parameters and hands q to verification. Built by
  `layer_skip_model` (self-speculation: the target's first N layers with its final norm and LM head, as in
  LayerSkip, Elhoushi et al., 2024, arXiv:2404.16710, and Draft & Verify, Zhang et al., 2023,
  arXiv:2309.08168; SmolLM2 was not trained for early exit, so its acceptance is expected to be low), by
  `quantized_copy` (the target with weights quantized by `lab.quant`), or passed in as a separate model.

A drafter's KV for a request lives as a *shadow* sequence: before each round it is synced to the target's
tokens (accepted drafts stay computed, rejected ones are recomputed over), so a rollback costs nothing here
either. Unlike LayerSkip, the layer-skip drafter does not share the target's cache for its N layers: it keeps
N layers' worth of its own (`kv_cache_bytes`).
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import nn

from lab.engine.kv_store import build_kv_store
from lab.engine.model_runner import ModelRunner
from lab.engine.request import Sequence, Status
from lab.engine.sampler import probabilities
from lab.engine.block_manager import BlockManager
from lab.engine.probe import forward_probe
from lab.models.llama import LlamaModel


@dataclass
class Draft:
    tokens: list[int]
    probs: torch.Tensor | None = None  # [len(tokens), vocab]: q each was drawn from; None: deterministic


class Drafter(Protocol):
    name: str

    def propose(self, requests: list[tuple[Sequence, int]]) -> dict[int, Draft]:
        """Up to `room` drafts for each (sequence, room); a request may get none. Keys: request ids."""

    def forget(self, request_id: int) -> None:
        """The request finished: release what the drafter holds for it."""

    def stats(self) -> dict:
        """Counters for the engine's stats() (prefixed spec_draft_)."""


@dataclass
class NgramDrafter:
    min_n: int = 1
    max_n: int = 3
    name: str = "ngram"

    def __post_init__(self):
        if not 1 <= self.min_n <= self.max_n:
            raise ValueError(f"need 1 <= min_n <= max_n, got min_n={self.min_n}, max_n={self.max_n}")

    def lookup(self, token_ids: list[int], k: int) -> list[int]:
        """Up to k tokens that followed the latest earlier match of the trailing n-gram (none: no match)."""
        for n in range(min(self.max_n, len(token_ids) - 1), self.min_n - 1, -1):
            tail = token_ids[-n:]
            for start in range(len(token_ids) - n - 1, -1, -1):  # latest match first, not the tail itself
                if token_ids[start:start + n] == tail:
                    return token_ids[start + n:start + n + k]
        return []

    def propose(self, requests: list[tuple[Sequence, int]]) -> dict[int, Draft]:
        drafts = {seq.request_id: Draft(self.lookup(seq.token_ids, room)) for seq, room in requests}
        return {rid: d for rid, d in drafts.items() if d.tokens}

    def forget(self, request_id: int) -> None:
        pass

    def stats(self) -> dict:
        return {}


class ModelDrafter:
    def __init__(self, model: LlamaModel, num_blocks: int, block_size: int, name: str = "model"):
        self.model, self.name = model, name
        self.block_manager = BlockManager(num_blocks, block_size, enable_prefix_caching=True)
        self.runner = ModelRunner(model, build_kv_store(model, num_blocks, block_size), block_size)
        self.shadows: dict[int, tuple[Sequence, Sequence]] = {}  # request id -> (target sequence, shadow)
        self.forwards = 0  # draft forwards run (k a round at batch 1; the first also catches up on the prompt)
        self.catch_up_tokens = 0  # tokens fed beyond one a forward (the prompt, accepted drafts' successors)
        self.pool_full = 0  # requests left without drafts because the draft pool had no room

    @property
    def kv_cache_bytes(self) -> int:
        return self.runner.kv_cache_bytes

    def forward_probe(self, context: int):
        """The draft model's one-token step after `context` cached tokens, to time (`lab.engine.probe`)."""
        return forward_probe(self.runner, self.block_manager, context, 1, draft=True)

    def _sync(self, seq: Sequence) -> Sequence:
        """The shadow of `seq`, holding the target's tokens; its KV stays valid up to the common prefix."""
        if seq.request_id not in self.shadows:
            shadow = Sequence(seq.token_ids, seq.params, seq.cache_salt)
            blocks, hashes = self.block_manager.find_cached_prefix(shadow)
            self.block_manager.allocate(shadow, len(blocks) * self.block_manager.block_size, blocks, hashes)
            self.block_manager.update(shadow, len(blocks) * self.block_manager.block_size)
            shadow.status = Status.RUNNING
            self.shadows[seq.request_id] = (seq, shadow)
            return shadow
        shadow = self.shadows[seq.request_id][1]
        common = next((i for i, (a, b) in enumerate(zip(shadow.token_ids, seq.token_ids)) if a != b),
                      min(len(shadow), len(seq)))
        shadow.token_ids = list(seq.token_ids)
        self.block_manager.update(shadow, min(shadow.num_computed_tokens, common))
        self.block_manager.cache_full_blocks(shadow)  # only true tokens are computed now
        return shadow

    def propose(self, requests: list[tuple[Sequence, int]]) -> dict[int, Draft]:
        for rid, (seq, _) in list(self.shadows.items()):  # preempted or aborted: drop, rebuilt on return
            if seq.status is not Status.RUNNING:
                self.forget(rid)
        active = []
        for seq, room in requests:
            shadow = self._sync(seq)
            if not self.block_manager.allocate(shadow, len(shadow) + room - 1):
                self.pool_full += 1
                continue
            active.append((seq, shadow, room, [], []))
        for j in range(max((room for _, _, room, _, _ in active), default=0)):
            step = [a for a in active if j < a[2]]
            batch = [(shadow, len(shadow) - shadow.num_computed_tokens) for _, shadow, _, _, _ in step]
            self.forwards += 1
            self.catch_up_tokens += sum(n - 1 for _, n in batch)
            logits = self.runner.execute(batch).logits  # every shadow's step ends at its last token: one row each
            for (seq, shadow, _, tokens, probs), row in zip(step, logits):
                self.block_manager.update(shadow, len(shadow))
                if j == 0:  # the caught-up tokens are the target's, no draft among them yet: name their blocks
                    self.block_manager.cache_full_blocks(shadow)  # (a one-round request never syncs again)
                if seq.params.greedy:  # deterministic: verification needs no q
                    token = int(row.argmax())
                else:
                    q = probabilities(row[None], seq.params)[0]
                    token = int(torch.multinomial(q, 1, generator=seq.generator(q.device)))
                    probs.append(q)
                shadow.token_ids.append(token)
                tokens.append(token)
        return {seq.request_id: Draft(tokens, None if seq.params.greedy else torch.stack(probs))
                for seq, _, _, tokens, probs in active if tokens}

    def forget(self, request_id: int) -> None:
        entry = self.shadows.pop(request_id, None)
        if entry is not None:
            self.block_manager.free_sequence(entry[1])

    def stats(self) -> dict:
        return {"forwards": self.forwards, "catch_up_tokens": self.catch_up_tokens,
                "kv_cache_bytes": self.kv_cache_bytes, "pool_full": self.pool_full}


def layer_skip_model(model: LlamaModel, num_layers: int) -> LlamaModel:
    """The target's first `num_layers` decoder layers with its embedding, final norm and LM head: the weights are
    shared, not copied."""
    total = model.config.num_hidden_layers
    if not isinstance(num_layers, int) or not 1 <= num_layers < total:
        raise ValueError(f"draft_layers must be an int in [1, {total - 1}] (the target has {total} layers), "
                         f"got {num_layers!r}")
    with torch.device("meta"):
        draft = LlamaModel(dataclasses.replace(model.config, num_hidden_layers=num_layers), model.rope.max_positions)
    draft.rope, draft.embed_tokens, draft.norm = model.rope, model.embed_tokens, model.norm
    draft.layers = nn.ModuleList(model.layers[:num_layers])
    draft.lm_head = model.lm_head
    return draft


def quantized_copy(model: LlamaModel, tokenizer=None, method: str = "rtn", bits: int = 4,
                   group_size: int | None = 64, calib_samples: int = 32, calib_tokens: int = 256,
                   packed: bool = True) -> LlamaModel:
    """A copy of the target whose decoder linears are quantized by `lab.quant` (RTN, GPTQ or AWQ; the last two
    calibrate on the lab's calibration set and need the tokenizer).

    `packed` (the default, on a CPU at 4 or 8 bits): the codes run on torch's packed low-bit kernels
    (`lab.quant.packed`) and the LM head is RTN-quantized and packed too (it is a fifth of the weights), so the
    copy reads about a quarter of the target's bytes per token, as a deployed quantized drafter would. Otherwise
    the weights are dequantized in place and the copy costs what the target does: its c then shows the
    acceptance a quantized drafter keeps, not its speed (`weight_bytes_ratio` gives the bandwidth-bound c)."""
    from lab.models import prepack
    from lab.quant.packed import PACKED_BITS, pack_model
    from lab.quant.pipeline import QuantJob, quantize_model

    job = QuantJob(method=method, bits=bits, group_size=group_size, calib_samples=calib_samples,
                   calib_tokens=calib_tokens)
    if method != "rtn" and tokenizer is None:
        raise ValueError(f"a {method} draft calibrates on text: pass the tokenizer")
    draft = prepack.unprepack(copy.deepcopy(model))  # quantization rewrites weights a blocked copy would not follow
    codes, _ = quantize_model(job, draft, tokenizer, progress=False)
    if packed and bits in PACKED_BITS and next(draft.parameters()).device.type == "cpu":
        pack_model(draft, codes, job.spec(), lm_head=job.spec())
    return draft


def weight_bytes_ratio(bits: int, group_size: int | None, model: LlamaModel, head: bool = True) -> float:
    """Bytes a decode step reads for a weight-quantized copy over the 16-bit target's: decoder linears (and with
    `head`, the LM head, as `quantized_copy` packs it) at `bits` plus a 16-bit scale and zero per group, the
    rest at 16 bits. The c a bandwidth-bound int-`bits` GEMM would reach, for comparison with the measured c."""
    linear = sum(p.numel() for n, p in model.named_parameters() if n.startswith("layers.") and p.dim() == 2)
    rest = sum(p.numel() for p in model.parameters()) - linear
    quantized = linear + (model.config.vocab_size * model.config.hidden_size if head else 0)
    per_weight = bits / 8 + (4 / group_size if group_size else 0)
    return (quantized * per_weight + (linear + rest - quantized) * 2) / ((linear + rest) * 2)
