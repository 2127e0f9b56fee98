"""Which store serves each `kv_cache_dtype`, and the questions asked of a format before its store exists.

`STORES` is the one table: a `kv_cache_dtype` name (the dtype a `lab.kv.format.KVCacheFormat` names, or "auto"
for the model's own dtype) -> the store class of its module. Building a pool (`build_store`), sizing one
(`bytes_per_block`, `staging_bytes`) and asking what a format supports (`capabilities`) all go through it.
"""

from __future__ import annotations

from .format import KVCacheFormat
from .fp8 import FP8KVStore
from .integer import IntKVStore
from .plain import PlainKVStore
from .protocol import KVCapabilities

STORES: dict[str, type] = {
    "auto": PlainKVStore,
    "fp8_e4m3": FP8KVStore,
    "fp8_e5m2": FP8KVStore,
    "int8": IntKVStore,
    "int4": IntKVStore,
    "int2": IntKVStore,
}


def store_class(fmt: KVCacheFormat | None) -> type:
    """The store of `fmt` (None: the model's dtype)."""
    name = "auto" if fmt is None else fmt.dtype
    if name not in STORES:
        raise ValueError(f"kv_cache_dtype {name!r} has no store in lab.kv.registry.STORES ({', '.join(STORES)})")
    return STORES[name]


def capabilities(fmt: KVCacheFormat | None) -> KVCapabilities:
    """What a store of `fmt` supports, known before one is built (the engine's checks ask this)."""
    return store_class(fmt).capabilities_for(fmt)


def pool_dims(model) -> tuple[int, int]:
    """(layers, KV heads) the pool holds: the model's, or a tensor-parallel shard's or a pipeline stage's own
    (`lab.parallel`), whose config is the whole model's."""
    return len(model.layers), model.layers[0].self_attn.n_kv


def bytes_per_block(model, block_size: int, fmt: KVCacheFormat | None) -> int:
    """Pool bytes of one block of `model`'s cache in `fmt` (None: the model's dtype)."""
    layers, heads = pool_dims(model)
    return store_class(fmt).bytes_per_block(layers, block_size, heads, model.config.head_dim, fmt,
                                            model.embed_tokens.weight.dtype)


def staging_bytes(model, max_num_seqs: int, fmt: KVCacheFormat | None) -> int:
    """Bytes of the exact copies a store of `fmt` keeps per running sequence (windows, filling key groups)."""
    layers, heads = pool_dims(model)
    return store_class(fmt).staging_bytes_for(layers, heads, model.config.head_dim, fmt, max_num_seqs,
                                              model.embed_tokens.weight.dtype)


def build_store(model, num_blocks: int, block_size: int, fmt: KVCacheFormat | None = None, kv_scales=None,
                max_num_seqs: int = 1, running=None):
    """The pool for `model` in `fmt`: `num_blocks` blocks of `block_size` slots, `max_num_seqs` staging lanes
    for a store that stages; `running(sequence)` says whether a lane's sequence still runs (the engine's)."""
    # A pipeline stage may hold no embedding; every norm layout has post_attention_layernorm (OLMo 2 has no input norm).
    c, w = model.config, model.layers[0].post_attention_layernorm.weight
    layers, heads = pool_dims(model)
    shape = (layers, num_blocks, block_size, heads, c.head_dim)
    return store_class(fmt).build(model, shape, fmt, w.dtype, w.device, kv_scales, max_num_seqs, running)
