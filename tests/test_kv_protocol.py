"""The KV store protocol (lab.kv, issue 50): every registered format is a `KVStore` whose sizes agree with the
registry's, its capabilities (not checks of the format) drive the engine's refusals, and nothing outside lab.kv
probes a store's attributes with getattr."""

import ast
import importlib
from pathlib import Path

import pytest
import torch

from lab.engine import LLM, EngineConfig
from lab.kv import (KV_CACHE_DTYPES, STORES, KVCacheFormat, KVCapabilities, KVStore, build_store, bytes_per_block,
                    capabilities, staging_bytes, store_class)
from lab.kv.integer import IntKVStore
from lab.kv.plain import PlainKVStore
from lab.models import load_model
from lab.models.attention import AttentionLayout, TorchPagedAttention

ROOT = Path(__file__).resolve().parents[1]
NUM_BLOCKS, BLOCK_SIZE, LANES = 6, 8, 3
# One format per registered name, and the staging ones (a window, per-channel keys) beside them.
FORMATS = [None, *(KVCacheFormat(name) for name in STORES if name != "auto"),
           KVCacheFormat("int4", "per-channel", token_group=4), KVCacheFormat("int8", window=5),
           KVCacheFormat("fp8_e4m3", "per-token", pre_rope=True)]


def _id(fmt) -> str:
    return "auto" if fmt is None else f"{fmt.dtype}-{fmt.granularity}{'-w' if fmt.window else ''}" \
                                      f"{'-prerope' if fmt.pre_rope else ''}"


@pytest.fixture(scope="module")
def tiny():
    model, _ = load_model("random:tiny", dtype=torch.float32, device="cpu")
    return model


def test_the_registry_names_every_kv_cache_dtype():
    assert set(STORES) == {"auto", *KV_CACHE_DTYPES}
    assert store_class(None) is PlainKVStore and store_class(KVCacheFormat("int4")) is IntKVStore
    with pytest.raises(ValueError, match="kv_cache_dtype 'nf4' has no store"):
        store_class(type("Fmt", (), {"dtype": "nf4"})())


@pytest.mark.parametrize("fmt", FORMATS, ids=_id)
def test_every_format_is_a_kv_store_sized_as_the_registry_says(tiny, fmt):
    store = build_store(tiny, NUM_BLOCKS, BLOCK_SIZE, fmt, max_num_seqs=LANES, running=lambda seq: True)
    assert isinstance(store, KVStore)
    assert isinstance(store.capabilities, KVCapabilities) and store.capabilities == capabilities(fmt)
    assert store.fmt is fmt and store.num_layers == len(tiny.layers) and store.num_blocks == NUM_BLOCKS
    assert store.bytes_per_token == store.nbytes / (NUM_BLOCKS * BLOCK_SIZE)
    assert store.nbytes == NUM_BLOCKS * bytes_per_block(tiny, BLOCK_SIZE, fmt)
    assert store.bytes_per_token == pytest.approx(bytes_per_block(tiny, BLOCK_SIZE, fmt) / BLOCK_SIZE)
    assert store.staging_bytes == staging_bytes(tiny, LANES, fmt)
    module, _, name = store.codec.rpartition(".")
    assert hasattr(importlib.import_module(module), name)  # the kernels' entry point exists where it says


@pytest.mark.parametrize("fmt", [f for f in FORMATS if capabilities(f).triton], ids=_id)
def test_a_store_the_kernels_read_gives_them_its_pool_in_place(tiny, fmt):
    from lab.kernels import PagedKVCache

    store = build_store(tiny, NUM_BLOCKS, BLOCK_SIZE, fmt)
    cache = PagedKVCache(**store.kernel_view(1))
    pool = store.k_cache if fmt is None else store.codes["k"]
    assert cache.k.data_ptr() == pool[1].data_ptr() and cache.fmt is fmt
    if fmt is None:  # the plain pool: what the kernels read is the model's dtype, as stored
        assert cache.bytes_per_token * store.num_layers == store.bytes_per_token


def test_the_plain_store_reads_back_what_it_wrote(tiny):
    store = build_store(tiny, NUM_BLOCKS, BLOCK_SIZE)
    k, v = torch.randn(2, 5, 3, 16).unbind(0)
    slots = torch.tensor([0, 1, 2, 9, 10])
    store.write(1, slots, k, v)
    got_k, got_v = store.gather(1, torch.tensor([0, 1]))
    assert torch.equal(got_k.reshape(-1, 3, 16)[slots], k) and torch.equal(got_v.reshape(-1, 3, 16)[slots], v)
    assert store.staging_metadata([], 5) is None


class NoSpeculation(IntKVStore):
    """int8 as it is, but declaring it cannot be rewound: the refusals must follow the capability."""

    @staticmethod
    def capabilities_for(fmt):
        return KVCapabilities(triton=False, speculation=False, attention_layouts=False, parallel=False)


def test_a_store_without_the_speculation_capability_is_refused_by_name(tiny, monkeypatch):
    from lab.speculative import SpeculativeConfig

    LLM(tiny, tokenizer=None, num_kv_blocks=16, max_model_len=64, kv_cache_dtype="int8",
        speculative=SpeculativeConfig())  # int8 per-token can be rewound
    monkeypatch.setitem(STORES, "int8", NoSpeculation)
    with pytest.raises(ValueError, match="speculative decoding needs a KV format without staged exact copies; "
                                         "kv_cache_dtype 'int8'"):
        LLM(tiny, tokenizer=None, num_kv_blocks=16, max_model_len=64, kv_cache_dtype="int8",
            speculative=SpeculativeConfig())


def test_the_configs_refusals_ask_the_capabilities(monkeypatch):
    assert EngineConfig(kv_cache_dtype="int8", attention_backend="triton").kv_capabilities.triton
    monkeypatch.setitem(STORES, "int8", NoSpeculation)
    with pytest.raises(ValueError, match="cannot read kv_cache_dtype 'int8' in place .* attention_backend='torch'"):
        EngineConfig(kv_cache_dtype="int8", attention_backend="triton")
    plain = PlainKVStore.capabilities_for(None)
    monkeypatch.setattr(PlainKVStore, "capabilities_for", staticmethod(
        lambda fmt: KVCapabilities(plain.triton, plain.speculation, plain.attention_layouts, parallel=False)))
    with pytest.raises(ValueError, match="tensor_parallel_size 2 does not support kv_cache_dtype='auto'"):
        EngineConfig(tensor_parallel_size=2)


def test_attention_with_a_layout_asks_the_store(tiny):
    store = NoSpeculation.build(tiny, (2, 4, 8, 3, 16), KVCacheFormat("int8"), torch.float32, torch.device("cpu"))
    TorchPagedAttention(store, None)  # plain causal attention reads any store
    with pytest.raises(ValueError, match="kv_cache_dtype int8 keeps exact copies or pre-RoPE keys"):
        TorchPagedAttention(store, None, AttentionLayout(windows=(4, None)))


STORE_MEMBERS = {"staging_bytes", "bytes_per_token", "nbytes", "stages", "fmt", "capabilities", "codec",
                 "staging_metadata", "kernel_view", "pre_rope", "static", "codes", "k_cache"}


def test_nothing_outside_lab_kv_probes_a_store_with_getattr():
    """getattr(x, "<a store attribute>", ...) outside lab.kv is the duck typing the protocol replaces: a store has
    every member of `KVStore`, and what it supports is `capabilities`."""
    found = {}
    for path in sorted((ROOT / "lab").rglob("*.py")):
        rel = str(path.relative_to(ROOT))
        if rel.startswith("lab/kv/"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id in ("getattr", "hasattr") and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant)
                    and node.args[1].value in STORE_MEMBERS):
                found.setdefault(rel, set()).add(node.args[1].value)
    assert found == {}
