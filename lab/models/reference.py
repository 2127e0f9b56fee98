"""A contiguous KV cache for one sequence: the reference the paged engine is checked against.

Each layer keeps its keys and values in one growing tensor, as `transformers`' dynamic cache does.
Nothing is shared, paged or scheduled, so it is easy to believe; `greedy_generate` on it is the
"contiguous" side of the paged == contiguous invariant.
"""

from __future__ import annotations

import torch

from .attention import AttentionLayout, causal_attention
from .llama import LlamaModel


class ContiguousKVCache:
    """An `AttentionContext` holding one sequence's K/V per layer in a single tensor."""

    def __init__(self, num_layers: int, layout: AttentionLayout | None = None):
        """`layout`: the model's windows and soft cap (`LlamaModel.attention_layout`); none, plain attention."""
        self.k: list[torch.Tensor | None] = [None] * num_layers
        self.v: list[torch.Tensor | None] = [None] * num_layers
        self.layout = layout or AttentionLayout()

    def __len__(self) -> int:
        return 0 if self.k[0] is None else self.k[0].shape[0]

    def attend(self, layer, q, k, v):
        if self.k[layer] is not None:
            k, v = torch.cat([self.k[layer], k]), torch.cat([self.v[layer], v])
        self.k[layer], self.v[layer] = k, v
        return causal_attention(q, k, v, self.layout.window(layer), self.layout.softcap)


@torch.inference_mode()
def forward_logits(model: LlamaModel, token_ids: list[int], cache=None) -> torch.Tensor:
    """Logits [T, vocab] for every position of one sequence, in one causal forward (on `cache`, an empty
    one-sequence `AttentionContext`; a fresh `ContiguousKVCache` by default)."""
    device = model.embed_tokens.weight.device
    ids = torch.tensor(token_ids, device=device)
    cache = ContiguousKVCache(len(model.layers), model.attention_layout) if cache is None else cache
    return model.compute_logits(model(ids, torch.arange(len(ids), device=device), cache))


@torch.inference_mode()
def greedy_generate(model: LlamaModel, token_ids: list[int], max_new_tokens: int, cache=None) -> list[int]:
    """Greedy continuation of `token_ids` (no stop on EOS), one token per forward after the prompt, on
    `cache` (a fresh `ContiguousKVCache` by default; any empty `AttentionContext` of one sequence)."""
    device = model.embed_tokens.weight.device
    cache = ContiguousKVCache(len(model.layers), model.attention_layout) if cache is None else cache
    ids, out = list(token_ids), []
    new = ids
    for _ in range(max_new_tokens):
        start = len(cache)
        pos = torch.arange(start, start + len(new), device=device)
        hidden = model(torch.tensor(new, device=device), pos, cache)
        nxt = int(model.compute_logits(hidden[-1:]).argmax(-1))
        out.append(nxt)
        new = [nxt]
    return out
