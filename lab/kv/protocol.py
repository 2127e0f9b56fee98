"""What every KV store is: the paged pool's two operations, its size, and what it can do.

A store holds, per layer, `num_blocks` blocks of `block_size` token slots for K and V. Paged attention asks it
for two things: `write` a step's keys and values to their slots, and `gather` whole blocks back as
[n, block_size, n_kv_heads, head_dim] in the compute dtype. Everything else about a format (how its codes sit in
the pool, its scales, the exact copies it keeps outside the pool) stays inside its module of `lab.kv`.

The engine and its features never test a format to decide what they may do: they ask the store's
`capabilities` (or, before a store exists, `lab.kv.capabilities(fmt)`), so a refusal names the capability a
format lacks, and a new format states its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Protocol, runtime_checkable

import torch


@dataclass(frozen=True)
class KVCapabilities:
    """What a store supports. Each field is asked by exactly one kind of caller (named beside it)."""

    # attention_backend="triton" (lab.engine.config): the Triton kernels read and write the pool in place, which
    # needs every token's codes and scale in the pool and keys stored after RoPE.
    triton: bool
    # speculative decoding (lab.speculative): rejected drafts rewind a sequence, so nothing the store keeps
    # outside the pool may depend on positions already written (staged exact copies would be left behind).
    speculation: bool
    # sliding windows and soft-capped logits (lab.models.attention.AttentionLayout): the attention that applies
    # them reads only the pool, not exact copies or pre-RoPE keys.
    attention_layouts: bool
    # tensor and pipeline parallelism (lab.engine.parallel): each rank builds its own part of the pool.
    parallel: bool


@runtime_checkable
class KVStore(Protocol):
    """The paged KV pool as the engine, the attention backends and the memory account use it."""

    # The kernels' view of one layer's pool (`lab.kernels.kv_codec.PagedKVCache`), built from `kernel_view`; a
    # dotted name, since the kernels import `lab.kv.format` and lab.kv must not import them back.
    codec: ClassVar[str]
    fmt: object  # the lab.kv.format.KVCacheFormat it stores, or None for the model's own dtype
    num_layers: int
    num_blocks: int
    block_size: int

    @property
    def capabilities(self) -> KVCapabilities: ...

    @property
    def nbytes(self) -> int:
        """Bytes of the block pool (codes and per-token scales; static scales and staging are outside it)."""

    @property
    def bytes_per_token(self) -> float:
        """Pool bytes per cached token over all layers, K and V: nbytes / (num_blocks * block_size)."""

    @property
    def staging_bytes(self) -> int:
        """Bytes kept outside the pool for exact copies (0 for a store without staging lanes)."""

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              positions: torch.Tensor | None = None, staging=None, exact_k: torch.Tensor | None = None) -> None:
        """This step's keys and values [T, n_kv, head_dim] into their flat `slots` [T]."""

    def gather(self, layer: int, blocks: torch.Tensor,
               per_sequence: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of `blocks` as [n, block_size, n_kv, head_dim] in the compute dtype."""

    def staging_metadata(self, scheduled: list, num_tokens: int):
        """Where a step's exact copies come from and go to (`lab.kv.staging.StagingMetadata`), or None. A store
        that returns metadata also offers `exact_source`, `stage` and `exact_mask`, which attention then calls."""

    def kernel_view(self, layer: int) -> dict:
        """The keyword arguments of `codec` for one layer: views of the pool's tensors, no copies (static
        scales excepted, repeated per KV head)."""


def pool_bytes_per_token(store) -> float:
    """`KVStore.bytes_per_token` from a store's pool size (the arithmetic every caller used to repeat)."""
    return store.nbytes / (store.num_blocks * store.block_size)
