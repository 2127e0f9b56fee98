"""What the engine's recompute of a window costs on the machine it runs on: a sum of terms, each its work over a
ceiling measured by its own microbenchmark in the same run (issue 34 item 7).

Recomputing W tokens after an M-token prefix is one engine step (`lab.replay.measure.RecomputeBench.seconds`). A
roofline with the machine's square-matmul peak and its GEMV read rate (`lab.replay.cost`'s terms) missed it by
1.7-5.9x on this CPU: the step does more than FLOPs and weight bytes. It pays, in order of the step:

    t(M, W) = fixed + forward(W) + L x gather(M + W) + L x attention(W, M + W)

- **fixed**: what any step pays beyond its forward's work: building the step's metadata (slots, block tables,
  masks) and, in each layer, the calls that write, gather and attend. Measured as the engine's step of two tokens
  after one block (a window's path at its smallest), less `forward(2)` and that step's own gather.
- **forward(W)**: the model's forward over W tokens with attention left out (every layer's linears, which read all
  the weights, its norms, RoPE and activations): the window's linear work at the rate the model's own shapes get,
  not a square matmul's. Measured per window with a null attention context (`lab.replay.microbench`).
- **gather**: the paged store copies the blocks that hold the S = M + W positions' K and V out of its pool, per
  layer: 2 ceil(S / block) block n_kv d b bytes read and as many written; a fused kernel reading blocks in place
  (the Triton backend) would not. Ceiling: the store's gather rate on the largest prefix, caches flushed.
- **attention**: the window's W queries against all S keys; the masked SDPA computes every W x S score, 4 H d W S
  FLOPs (QK^T and PV). Ceiling: `causal_attention`'s achieved FLOP/s at W queries over a reference context
  between the smallest and largest prefix (its rate depends on W, how full its query tiles are, and barely on S).

Every coefficient is a rate or a time from its own microbenchmark, none fitted to the recompute times the model
then predicts; `Terms` keeps each term, so a point the sum misses says which term is short.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


def gather_bytes(tokens: int, block_size: int, kv_heads: int, head_dim: int, dtype_bytes: float) -> float:
    """Bytes one layer's gather reads out of the pool for `tokens` positions: whole blocks of K and of V."""
    if tokens < 0 or block_size < 1:
        raise ValueError(f"tokens must be >= 0 and block_size >= 1, got {tokens}, {block_size}")
    return 2.0 * math.ceil(tokens / block_size) * block_size * kv_heads * head_dim * dtype_bytes


def attention_flops(heads: int, head_dim: int, queries: int, keys: int) -> float:
    """FLOPs of one layer's masked attention of `queries` over `keys`: QK^T and PV, 2 x 2 H d per (query, key),
    every pair computed (an explicit mask skips none)."""
    return 4.0 * heads * head_dim * queries * keys


@dataclass(frozen=True)
class Terms:
    """The seconds each term of one recompute costs; `total` is their sum."""
    fixed: float
    forward: float
    gather: float
    attention: float

    NAMES = ("fixed", "forward", "gather", "attention")

    @property
    def total(self) -> float:
        return self.fixed + self.forward + self.gather + self.attention

    def largest(self) -> str:
        return max(self.NAMES, key=lambda n: getattr(self, n))


@dataclass(frozen=True)
class Ceilings:
    """One model's shape on the engine and the ceilings measured for it in this run: `fixed_s` (s a step),
    `forward_s` (s per window W), `gather_Bps` (bytes/s a gather reads), `attention_Fps` (FLOP/s per window W, at
    `attention_keys` keys)."""
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    block_size: int
    dtype_bytes: float
    fixed_s: float
    forward_s: dict[int, float] = field(default_factory=dict)
    gather_Bps: float = math.inf
    attention_Fps: dict[int, float] = field(default_factory=dict)
    attention_keys: int = 0

    def predict(self, prefix: int, window: int) -> Terms:
        """The recompute of `window` tokens after `prefix` cached ones, term by term. Needs the window's forward and
        attention rate measured (they depend on W through the shapes of its matmuls and tiles)."""
        if window not in self.forward_s or window not in self.attention_Fps:
            raise KeyError(f"no ceiling measured for window {window}: have {sorted(self.forward_s)}")
        keys = prefix + window
        gather = self.layers * gather_bytes(keys, self.block_size, self.kv_heads, self.head_dim,
                                            self.dtype_bytes) / self.gather_Bps
        attention = self.layers * attention_flops(self.heads, self.head_dim, window, keys) / self.attention_Fps[window]
        return Terms(self.fixed_s, self.forward_s[window], gather, attention)
