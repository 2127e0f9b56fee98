"""HCache-style replay: rebuild a window's KV from the layer inputs kept for it, instead of from token ids.

HCache (Gao et al., 2024, "Fast State Restoration in LLM Serving with HCache", arXiv:2410.05004) keeps each
token's hidden states and restores the KV with the K/V projections alone, skipping the rest of every layer. The
lab's version keeps, per running sequence, the attention input of every layer (the layer's input after its
RMSNorm, what `qkv_proj` multiplies) for its last `window` positions, captured by hooks as the engine computes
them; `restore` asks the model runner to drop the window's K/V from the pool (zero its slots) and rebuild them
(`ModelRunner.rebuild_kv`: `lab.kernels.replay_kv` with attention_backend="triton", its PyTorch reference
otherwise).

What it stores per token is L x hidden numbers against the KV's L x 2 n_kv d: for SmolLM2 576 vs 384, so under
GQA the kept inputs are larger than the KV they stand for (`lab.replay.cost.WindowCost.hidden_bytes`).
"""

from __future__ import annotations

import weakref

import torch

from lab.engine.request import Sequence


class HiddenStateStore:
    def __init__(self, runner, window: int):
        """Keep the attention inputs of `runner`'s forwards (`ModelRunner.observe_attention_inputs`) and rebuild
        K/V through `ModelRunner.rebuild_kv`."""
        self.runner, self.window = runner, window
        self.num_layers = runner.model.config.num_hidden_layers
        self.inputs: dict[int, torch.Tensor] = {}  # request id -> [layers, window, hidden], a ring by position
        self.first_kept: dict[int, int] = {}  # request id -> first position whose inputs this sequence computed
        self.step: list[tuple[Sequence, int, int, int]] = []  # this step's (sequence, first position, first row, n)
        # The hooks hold the store weakly: an engine that is gone leaves hooks that do nothing, not stale writes.
        ref = weakref.ref(self)

        def observe(layer: int, x: torch.Tensor) -> None:
            store = ref()
            if store is not None:
                store.record(layer, x)

        self.hooks = runner.observe_attention_inputs(observe)
        # The model outlives the engine (notebooks and tests share one): the hooks go when the store goes.
        weakref.finalize(self, _remove, self.hooks)

    def begin_step(self, scheduled: list[tuple[Sequence, int]]) -> None:
        """Tell the hooks which rows of the coming forward belong to which sequence and position."""
        self.step, row = [], 0
        for seq, n in scheduled:
            self.step.append((seq, seq.num_computed_tokens, row, n))
            row += n

    def record(self, layer: int, x: torch.Tensor) -> None:
        """Keep layer `layer`'s attention inputs x [tokens of the step, hidden] of this step's sequences."""
        for seq, start, row, n in self.step:
            rid = seq.request_id
            if rid not in self.inputs:
                self.inputs[rid] = x.new_zeros(self.num_layers, self.window, x.shape[1])
            if layer == 0 and (rid not in self.first_kept or start < self.first_kept[rid]):
                self.first_kept[rid] = start  # recomputed from here (a new sequence, or after preemption)
            keep = min(n, self.window)  # only the last `window` positions matter
            pos = torch.arange(start + n - keep, start + n, device=x.device)
            self.inputs[rid][layer, pos % self.window] = x[row + n - keep:row + n]

    def end_step(self) -> None:
        self.step = []  # forwards outside engine steps (a study calling the model) are not recorded

    def restorable_from(self, seq: Sequence) -> int:
        """The first position of the window whose inputs are kept (prefix-cache hits never ran the forward)."""
        return max(self.first_kept.get(seq.request_id, seq.num_computed_tokens),
                   seq.num_computed_tokens - self.window)

    def restore(self, seq: Sequence, start: int, end: int) -> None:
        """Drop the K/V of positions start .. end - 1 from the pool and rebuild them from the kept inputs."""
        ring = torch.arange(start, end, device=self.runner.device) % self.window
        kept = self.inputs[seq.request_id]
        self.runner.rebuild_kv(seq, start, end, lambda layer: kept[layer, ring])

    def forget(self, request_id: int) -> None:
        self.inputs.pop(request_id, None)
        self.first_kept.pop(request_id, None)

    def close(self) -> None:
        _remove(self.hooks)
        self.hooks = []


def _remove(hooks: list) -> None:
    for h in hooks:
        h.remove()  # removing twice is harmless: a handle forgets its hook once removed
