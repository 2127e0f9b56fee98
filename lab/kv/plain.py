"""The plain KV format (`kv_cache_dtype="auto"`): K and V in the model's own dtype.

Per layer, `num_blocks` blocks of `block_size` token slots for K and for V; `write` puts a step's keys and values
in their slots, `gather` copies whole blocks back (as nano-vllm's attention layer does its cache). Nothing to
calibrate and nothing outside the pool, so every feature can use it; the Triton kernels read it as it is
(`PagedKVCache` with no format: their PLAIN path).
"""

from __future__ import annotations

import torch

from .protocol import KVCapabilities, pool_bytes_per_token

CAPABILITIES = KVCapabilities(triton=True, speculation=True, attention_layouts=True, parallel=True)


class PlainKVStore:
    codec = "lab.kernels.kv_codec.PagedKVCache"
    fmt = None  # the model's dtype

    def __init__(self, n_layers: int, num_blocks: int, block_size: int, n_kv: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device):
        shape = (n_layers, num_blocks, block_size, n_kv, head_dim)
        self.num_layers, self.num_blocks, self.block_size = n_layers, num_blocks, block_size
        # Zero-filled: masked positions are multiplied by zero probabilities, and 0 * NaN would not be 0.
        self.k_cache = torch.zeros(shape, dtype=dtype, device=device)
        self.v_cache = torch.zeros(shape, dtype=dtype, device=device)

    @classmethod
    def build(cls, model, shape: tuple, fmt, dtype: torch.dtype, device: torch.device, kv_scales=None,
              num_lanes: int = 1, running=None) -> PlainKVStore:
        """The registry's constructor (`lab.kv.build_store`); a plain pool needs no scales and no lanes."""
        return cls(*shape, dtype, device)

    @staticmethod
    def capabilities_for(fmt) -> KVCapabilities:
        return CAPABILITIES

    @property
    def capabilities(self) -> KVCapabilities:
        return CAPABILITIES

    @staticmethod
    def bytes_per_block(n_layers, block_size, n_kv, head_dim, fmt, dtype: torch.dtype) -> int:
        return 2 * n_layers * block_size * n_kv * head_dim * dtype.itemsize

    @staticmethod
    def staging_bytes_for(n_layers, n_kv, head_dim, fmt, num_lanes: int, dtype: torch.dtype) -> int:
        return 0

    @property
    def nbytes(self) -> int:
        return self.k_cache.nbytes + self.v_cache.nbytes

    @property
    def bytes_per_token(self) -> float:
        return pool_bytes_per_token(self)

    @property
    def staging_bytes(self) -> int:
        return 0

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions=None,
              staging=None, exact_k=None) -> None:
        kc, vc = self.k_cache[layer], self.v_cache[layer]
        kc.view(-1, *kc.shape[-2:]).index_copy_(0, slots, k)
        vc.view(-1, *vc.shape[-2:]).index_copy_(0, slots, v)

    def staging_metadata(self, scheduled, num_tokens: int) -> None:
        return None

    def gather(self, layer: int, blocks: torch.Tensor, per_sequence: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        # index_select copies whole blocks (~2x faster than advanced indexing here).
        return self.k_cache[layer].index_select(0, blocks), self.v_cache[layer].index_select(0, blocks)

    def kernel_view(self, layer: int) -> dict:
        k, v = self.k_cache[layer], self.v_cache[layer]
        return dict(k=k, v=v, head_dim=k.shape[-1])
