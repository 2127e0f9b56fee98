"""The ceilings of `lab.replay.engine_cost`, each measured by its own microbenchmark on the engine's model and
KV pool, in the run that then times the recomputes it predicts (issue 34 item 7).

- `forward_seconds`: the model's forward over W random tokens with a null attention context (attention returns
  its queries): the linears, norms, RoPE and activations of the window, reading every weight;
- `gather_rate`: the store's gather of the blocks holding the largest prefix, after a cache flush (in a step the
  pool's blocks are cold: the layer's weights and the previous layers' work have passed through the caches);
- `attention_rate`: `lab.models.attention.causal_attention` (the engine's prefill attention) of W random queries
  over a reference number of random keys, its FLOPs (`engine_cost.attention_flops`) over its time;
- the fixed cost: the engine's own step of two tokens after one block (the smallest step that takes a window's
  path, a prefill chunk over cached blocks), less its forward and its gather.

None of them times a recompute at a (prefix, window) the model is scored on.
"""

from __future__ import annotations

import math

import torch

from lab.models.attention import causal_attention
from lab.replay.engine_cost import Ceilings, attention_flops, gather_bytes
from lab.machine.timing import median_seconds


class NullAttention:
    """An attention context that attends to nothing: the forward's output has the queries' shape, and no KV is
    written or read, so the forward's time is everything but attention and the pool."""

    def attend(self, layer, q, k, v):
        return q


def forward_seconds(model, window: int, repeats: int, position: int = 0) -> float:
    """Median seconds of the model's forward over `window` random tokens at positions `position` onward, attention
    left out."""
    device = model.embed_tokens.weight.device
    ids = torch.randint(0, model.config.vocab_size, (window,), generator=torch.Generator().manual_seed(window))
    ids, pos = ids.to(device), torch.arange(position, position + window, device=device)
    with torch.inference_mode():
        return median_seconds(lambda: model(ids, pos, NullAttention()), repeats)


def gather_rate(store, block_table: list[int], tokens: int, block_size: int, repeats: int,
                flush_bytes: int = 64 * 1024**2) -> tuple[float, float]:
    """(bytes/s, bytes) of one layer's gather of the blocks holding `tokens` positions, each timed after writing a
    `flush_bytes` buffer through the caches (untimed)."""
    blocks = block_table[:math.ceil(tokens / block_size)]
    device = store.k_cache[0].device
    idx = torch.tensor(blocks, device=device)
    flush = torch.empty(flush_bytes, dtype=torch.uint8, device=device)
    k = store.k_cache[0]
    nbytes = gather_bytes(tokens, block_size, k.shape[-2], k.shape[-1], k.element_size())
    seconds = median_seconds(lambda: store.gather(0, idx), repeats, lambda: flush.fill_(1))
    return nbytes / seconds, nbytes


def attention_rate(heads: int, kv_heads: int, head_dim: int, queries: int, keys: int, dtype, device,
                   repeats: int) -> float:
    """FLOP/s of `causal_attention` for `queries` queries (the last of `keys` positions) on random tensors."""
    g = torch.Generator().manual_seed(queries)
    q = torch.randn(queries, heads, head_dim, generator=g).to(device, dtype)
    k, v = (torch.randn(keys, kv_heads, head_dim, generator=g).to(device, dtype) for _ in range(2))
    with torch.inference_mode():
        seconds = median_seconds(lambda: causal_attention(q, k, v), repeats)
    return attention_flops(heads, head_dim, queries, keys) / seconds


def reference_keys(prefixes, block_size: int) -> int:
    """The context the attention rate is measured at: the geometric mean of the smallest and largest prefix,
    in whole blocks (between the points the model is scored on, at none of their ends)."""
    mid = math.sqrt(min(prefixes) * max(prefixes))
    return max(block_size, block_size * round(mid / block_size))


def measure_ceilings(bench, windows, prefixes, repeats: int) -> Ceilings:
    """Every ceiling of `engine_cost.Ceilings` for the model `bench` (a `RecomputeBench`) holds, on its device in
    its dtype: forward and attention rate per window, the gather rate on the largest prefix, the fixed cost."""
    llm = bench.llm
    model, store, bs = llm.model, llm.kv_store, llm.config.block_size
    c = model.config
    weight = model.embed_tokens.weight
    forward = {w: forward_seconds(model, w, repeats) for w in windows}
    rate, _ = gather_rate(store, list(bench.block_table), max(prefixes) + max(windows), bs, max(repeats, 3))
    keys = reference_keys(prefixes, bs)
    attention = {w: attention_rate(c.num_attention_heads, c.num_key_value_heads, c.head_dim, w, keys + w,
                                   weight.dtype, weight.device, repeats) for w in windows}
    two = forward_seconds(model, 2, repeats)
    step = bench.seconds(bs, 2, repeats)  # two tokens after one block: the smallest chunk over a cached prefix
    fixed = step - two - c.num_hidden_layers * gather_bytes(bs + 2, bs, c.num_key_value_heads, c.head_dim,
                                                            weight.element_size()) / rate
    return Ceilings(layers=c.num_hidden_layers, heads=c.num_attention_heads, kv_heads=c.num_key_value_heads,
                    head_dim=c.head_dim, block_size=bs, dtype_bytes=weight.element_size(), fixed_s=max(0.0, fixed),
                    forward_s=forward, gather_Bps=rate, attention_Fps=attention, attention_keys=keys)
