"""The Triton kernels against their PyTorch references, in Triton's interpreter on the CPU (small shapes).

Shapes cover what the issue names: ragged context lengths including 1 and non-multiples of the block size,
block sizes 8/16/32, head_dim 64/80/96/128/256, KV head counts that are not powers of two (3), GQA groups of
1, 2, 3 and 4, split-KV decode, and every KV format the kernels read. Large shapes run only where CUDA is.
"""

import pytest
import torch
import triton
import triton.language as tl

from lab.kernels import (PagedKVCache, paged_decode_attention, paged_decode_attention_ref, paged_prefill_attention,
                         paged_prefill_attention_ref, replay_kv, replay_kv_ref, reshape_and_cache,
                         reshape_and_cache_ref)
from lab.kernels.paged_attention import decode_traffic, prefill_traffic
from lab.kernels.replay import replay_traffic
from lab.kernels.kv_codec import FP8_E4M3, FP8_E5M2, load_tile
from lab.kernels.kv_write import write_traffic
from lab.kernels.traffic import measure_traffic
from lab.kv.format import FP8_TYPES, KVCacheFormat

FORMATS = [None, KVCacheFormat("int8"), KVCacheFormat("int4"), KVCacheFormat("int2"),
           KVCacheFormat("fp8_e4m3", "per-token"), KVCacheFormat("fp8_e5m2", "per-token"), KVCacheFormat("fp8_e4m3"),
           KVCacheFormat("fp8_e5m2", "per-head"), KVCacheFormat("int8", "per-head"), KVCacheFormat("int4", "per-tensor")]
FORMAT_IDS = ["plain" if f is None else f"{f.dtype}-{f.granularity}" for f in FORMATS]


def _cache_like(fmt, n_kv, head_dim, num_blocks=32, block_size=16, static_scale=0.05, **kwargs):
    return PagedKVCache.allocate(num_blocks, block_size, n_kv, head_dim, fmt, static_scale=static_scale, **kwargs)


def _filled(lens, n_kv, head_dim, block_size, fmt, seed=0, dtype=torch.float32, device="cpu"):
    """A pool holding sequences of `lens` tokens in shuffled blocks; their block tables and lengths."""
    g = torch.Generator().manual_seed(seed)
    blocks = [-(-n // block_size) for n in lens]
    cache = _cache_like(fmt, n_kv, head_dim, sum(blocks) + 3, block_size, dtype=dtype, device=device)
    order = torch.randperm(sum(blocks) + 3, generator=g)
    tables = torch.zeros(len(lens), max(blocks), dtype=torch.int32)
    used = 0
    for i, (n, nb) in enumerate(zip(lens, blocks)):
        tables[i, :nb] = order[used:used + nb]
        used += nb
        pos = torch.arange(n)
        slots = tables[i][pos // block_size].long() * block_size + pos % block_size
        k, v = torch.randn(2, n, n_kv, head_dim, generator=g) * torch.tensor([2.0, 1.0]).view(2, 1, 1, 1)
        reshape_and_cache_ref(k.to(device, dtype), v.to(device, dtype), cache, slots.to(device))
    return cache, tables.to(device), torch.tensor(lens, dtype=torch.int32, device=device)


# ---- KV write -------------------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", FORMATS, ids=FORMAT_IDS)
@pytest.mark.parametrize("n_kv,head_dim", [(3, 64), (1, 80), (2, 96)])
def test_reshape_and_cache_writes_the_references_codes_and_scales(fmt, n_kv, head_dim):
    g = torch.Generator().manual_seed(1)
    T = 29
    k = torch.randn(T, n_kv, head_dim, generator=g) * 3
    v = torch.randn(T, n_kv, head_dim, generator=g)
    k[2] = 0  # an all-zero token: the smallest scale, zero codes
    k[3, 0, :8] = 0.5  # repeated values: ties in the rounding
    v[4] *= 40  # beyond a static scale's range: saturates alike
    slots = torch.randperm(32 * 16, generator=g)[:T]
    slots[5] = -1  # padding: skipped
    kernel, ref = _cache_like(fmt, n_kv, head_dim), _cache_like(fmt, n_kv, head_dim)
    reshape_and_cache(k, v, kernel, slots)
    reshape_and_cache_ref(k, v, ref, slots)
    for name in ("k", "v", "k_scale", "v_scale", "k_zero", "v_zero"):
        a, b = getattr(kernel, name), getattr(ref, name)
        if a is not None:
            assert torch.equal(a, b), name
    # and what was written reads back as the format's round trip
    assert kernel.read("v", slots[:2]).shape == (2, n_kv, head_dim)


@triton.jit
def _read_all_codes(codes_ptr, scale_ptr, out_ptr, KIND: tl.constexpr):
    rows, cols = tl.arange(0, 16), tl.arange(0, 16)
    mask = (rows[:, None] < 16) & (cols[None, :] < 16)
    x = load_tile(codes_ptr, scale_ptr, scale_ptr, rows, 0, cols, mask, 16, 16, 0, 1, KIND, 8, False, False)
    tl.store(out_ptr + rows[:, None] * 16 + cols[None, :], x)


@pytest.mark.parametrize("dtype", ["fp8_e4m3", "fp8_e5m2"])
def test_every_finite_fp8_code_reads_back_as_torch_reads_it(dtype):
    """The kernels decode fp8 from its fields (Ampere has no e4m3 type): all 256 bytes but NaN/inf."""
    codes = torch.arange(256, dtype=torch.uint8)
    out = torch.empty(256)
    _read_all_codes[(1,)](codes, torch.ones(1), out, KIND=FP8_E4M3 if dtype == "fp8_e4m3" else FP8_E5M2)
    want = codes.view(FP8_TYPES[dtype]).float()
    finite = want.isfinite()
    assert finite.sum() >= 248 and torch.equal(out[finite], want[finite])


def test_written_values_round_trip_within_half_a_step():
    fmt = KVCacheFormat("int4")
    cache = _cache_like(fmt, 2, 64)
    k = torch.randn(10, 2, 64)
    slots = torch.arange(10)
    reshape_and_cache(k, k.clone(), cache, slots)
    step = cache.k_scale.view(-1, 2, 1)[:10].float()
    assert ((cache.read("k", slots) - k).abs() <= step / 2 + 1e-6).all()


# ---- decode attention -----------------------------------------------------------------------------

DECODE_SHAPES = [  # (n_heads, n_kv, head_dim, block_size)
    (9, 3, 64, 16),  # SmolLM2-135M
    (4, 4, 80, 8),  # no GQA, head_dim not a power of two
    (8, 2, 96, 32),
    (12, 3, 128, 16),
    (4, 1, 256, 8),
]


@pytest.mark.parametrize("n_heads,n_kv,head_dim,block_size", DECODE_SHAPES)
@pytest.mark.parametrize("num_splits", [1, 3])
def test_decode_matches_reference(n_heads, n_kv, head_dim, block_size, num_splits):
    lens = [1, block_size + 3, 3 * block_size, 70]
    cache, tables, context = _filled(lens, n_kv, head_dim, block_size, None)
    q = torch.randn(len(lens), n_heads, head_dim)
    out = paged_decode_attention(q, cache, tables, context, num_splits=num_splits, block_n=16)
    torch.testing.assert_close(out, paged_decode_attention_ref(q, cache, tables, context), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("fmt", FORMATS[1:], ids=FORMAT_IDS[1:])
def test_decode_dequantizes_every_format_on_read(fmt):
    lens = [1, 21, 40]
    cache, tables, context = _filled(lens, 3, 64, 16, fmt)
    q = torch.randn(len(lens), 9, 64)
    out = paged_decode_attention(q, cache, tables, context, num_splits=2, block_n=16)
    torch.testing.assert_close(out, paged_decode_attention_ref(q, cache, tables, context), atol=1e-5, rtol=1e-4)


def test_splits_past_a_short_sequences_end_change_nothing():
    # 4 splits of 16 tokens over contexts of 1 and 64: three of the first sequence's splits are empty.
    cache, tables, context = _filled([1, 64], 2, 64, 16, None)
    q = torch.randn(2, 4, 64)
    one = paged_decode_attention(q, cache, tables, context, num_splits=1, block_n=16)
    four = paged_decode_attention(q, cache, tables, context, num_splits=4, block_n=16)
    torch.testing.assert_close(one, four, atol=1e-5, rtol=1e-4)


# ---- prefill / extend attention -------------------------------------------------------------------

@pytest.mark.parametrize("n_heads,n_kv,head_dim,block_size", DECODE_SHAPES[:4])
def test_prefill_matches_reference_over_ragged_chunks(n_heads, n_kv, head_dim, block_size):
    # a fresh prompt, a chunk after a cached prefix (prefix hit or chunked prefill), one query, a long chunk
    lens = [19, 2 * block_size + 5, 9, 50]
    qlens = [19, 7, 1, 45]
    cache, tables, context = _filled(lens, n_kv, head_dim, block_size, None)
    starts = torch.tensor([0, 19, 26, 27], dtype=torch.int32)
    qlen = torch.tensor(qlens, dtype=torch.int32)
    q = torch.randn(sum(qlens), n_heads, head_dim)
    out = paged_prefill_attention(q, cache, tables, starts, qlen, context, block_rows=16, block_n=16)
    ref = paged_prefill_attention_ref(q, cache, tables, starts, qlen, context)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("fmt", [KVCacheFormat("int4"), KVCacheFormat("fp8_e4m3"), KVCacheFormat("int8", "per-head")],
                         ids=["int4", "fp8-static", "int8-per-head"])
def test_prefill_dequantizes_on_read(fmt):
    cache, tables, context = _filled([30, 12], 3, 64, 8, fmt)
    starts, qlen = torch.tensor([0, 10], dtype=torch.int32), torch.tensor([10, 12], dtype=torch.int32)
    q = torch.randn(22, 9, 64)
    out = paged_prefill_attention(q, cache, tables, starts, qlen, context)
    torch.testing.assert_close(out, paged_prefill_attention_ref(q, cache, tables, starts, qlen, context),
                               atol=1e-5, rtol=1e-4)


def test_prefill_rows_in_any_order_and_others_left_alone():
    """The engine interleaves decodes and prefill chunks in one step: the kernel writes only its rows."""
    cache, tables, context = _filled([10, 20], 2, 64, 16, None)
    starts, qlen = torch.tensor([6, 0], dtype=torch.int32), torch.tensor([4, 5], dtype=torch.int32)
    q = torch.randn(12, 4, 64)
    out = torch.full_like(q, 7.0)
    paged_prefill_attention(q, cache, tables, starts, qlen, context, out=out)
    ref = paged_prefill_attention_ref(q, cache, tables, starts, qlen, context)
    rows = [6, 7, 8, 9, 0, 1, 2, 3, 4]
    torch.testing.assert_close(out[rows], ref[rows], atol=1e-5, rtol=1e-4)
    assert (out[[5, 10, 11]] == 7.0).all()


def test_prefill_of_one_query_is_decode():
    cache, tables, context = _filled([33, 5], 3, 64, 16, KVCacheFormat("int8"))
    q = torch.randn(2, 9, 64)
    one = torch.ones(2, dtype=torch.int32)
    extend = paged_prefill_attention(q, cache, tables, torch.tensor([0, 1], dtype=torch.int32), one, context)
    torch.testing.assert_close(extend, paged_decode_attention(q, cache, tables, context), atol=1e-5, rtol=1e-4)


# ---- replay recompute -----------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", [None, KVCacheFormat("int8")], ids=["plain", "int8"])
@pytest.mark.parametrize("n_kv,head_dim,bias", [(3, 64, False), (2, 80, True)])
def test_replay_matches_reference(fmt, n_kv, head_dim, bias):
    g = torch.Generator().manual_seed(2)
    N, E = 21, 96
    x = torch.randn(N, E, generator=g)
    w = (torch.randn(E, 5 * n_kv * head_dim, generator=g) * 0.1).t()[3 * n_kv * head_dim:]  # transposed storage
    b = torch.randn(2 * n_kv * head_dim, generator=g) if bias else None
    angles = torch.randn(300, head_dim // 2, generator=g)
    pos, slots = torch.randint(0, 300, (N,), generator=g), torch.randperm(8 * 16, generator=g)[:N]
    kernel, ref = _cache_like(fmt, n_kv, head_dim, 8), _cache_like(fmt, n_kv, head_dim, 8)
    replay_kv(x, w, b, pos, angles.cos(), angles.sin(), kernel, slots)
    replay_kv_ref(x, w, b, pos, angles.cos(), angles.sin(), ref, slots)
    for role in "kv":
        a, r = kernel.read(role, slots), ref.read(role, slots)
        # float sums in another order; a quantized cache may then round one code the other way
        step = 0 if fmt is None else getattr(ref, f"{role}_scale").view(-1, n_kv, 1)[slots].float()
        assert ((a - r).abs() <= step + 1e-5).all()


def test_replay_rebuilds_the_keys_and_values_the_model_wrote(smollm):
    """Replay from a layer's stored inputs gives the K/V that the engine's forward wrote into its cache."""
    from lab.engine import LLM, SamplingParams

    model, tok = smollm
    llm = LLM(model, tokenizer=tok, num_kv_blocks=8, max_model_len=128)
    layer, bs = 5, llm.config.block_size
    attn = model.layers[layer].self_attn
    inputs = []
    hook = attn.qkv_proj.register_forward_hook(lambda m, a, o: inputs.append(a[0].clone()))
    try:
        ids = tok.encode("Replay recomputes keys and values from the layer input.", add_special_tokens=False)
        rid = llm.add_request(ids, SamplingParams(max_tokens=2, temperature=0))
        llm.step()  # the prompt's prefill
    finally:
        hook.remove()
    table = llm.sequences[rid].block_table
    pos = torch.arange(len(ids))
    slots = torch.tensor(table)[pos // bs] * bs + pos % bs
    store = llm.runner.kv
    written = PagedKVCache(store.k_cache[layer], store.v_cache[layer], attn.d)
    replayed = _cache_like(None, attn.n_kv, attn.d, store.k_cache.shape[1], bs)
    w_kv = attn.qkv_proj.weight[attn.q_size:]  # the K rows, then the V rows
    b_kv = None if attn.qkv_proj.bias is None else attn.qkv_proj.bias[attn.q_size:]
    replay_kv(inputs[0], w_kv, b_kv, pos, model.rope.cos, model.rope.sin, replayed, slots)
    for role in "kv":
        torch.testing.assert_close(replayed.read(role, slots), written.read(role, slots), atol=1e-5, rtol=1e-5)


# ---- memory traffic: the docstrings' formulas against the bytes the programs touch -------------------

@pytest.mark.parametrize("fmt", [None, KVCacheFormat("int4"), KVCacheFormat("fp8_e4m3")], ids=["plain", "int4", "fp8"])
def test_attention_moves_the_bytes_its_formula_states(fmt):
    lens, qlens = [19, 37, 100], [19, 5, 70]
    cache, tables, context = _filled(lens, 3, 64, 16, fmt)
    q = torch.randn(sum(qlens), 9, 64)
    starts, qlen = torch.tensor([0, 19, 24], dtype=torch.int32), torch.tensor(qlens, dtype=torch.int32)
    with measure_traffic(k=cache.k, v=cache.v) as prefill:
        paged_prefill_attention(q, cache, tables, starts, qlen, context)
    assert prefill.total("read") + prefill.total("written") == prefill_traffic(qlens, lens, cache, 9, 4)
    for splits in (1, 3):
        with measure_traffic(k=cache.k, v=cache.v) as decode:
            paged_decode_attention(q[:3], cache, tables, context, num_splits=splits)
        assert decode.total("read") + decode.total("written") == decode_traffic(lens, cache, 9, 4, splits)
        # GQA: the 3 query heads of a KV head share its tiles, so each K/V byte is requested once (a packed
        # int4 byte once per element it holds), not once per query head.
        per_byte = 1 if fmt is None or fmt.is_fp8 else 8 // fmt.bits
        k_bytes = sum(lens) * 3 * cache.k.shape[-1] * cache.k.element_size()
        assert decode.requested["k"]["read"] == per_byte * decode.unique["k"]["read"] == per_byte * k_bytes


@pytest.mark.parametrize("fmt", [None, KVCacheFormat("int4"), KVCacheFormat("fp8_e4m3")], ids=["plain", "int4", "fp8"])
def test_write_moves_the_bytes_its_formula_states(fmt):
    cache = _cache_like(fmt, 3, 64)
    k, v = torch.randn(2, 23, 3, 64)
    with measure_traffic() as traffic:
        reshape_and_cache(k, v, cache, torch.randperm(32 * 16)[:23])
    assert traffic.total("read") + traffic.total("written") == write_traffic(23, cache, 4)


def test_replay_moves_the_bytes_its_formula_states():
    cache = _cache_like(None, 2, 64)
    N, E = 23, 96
    x, w, angles = torch.randn(N, E), torch.randn(2 * 2 * 64, E), torch.randn(100, 32)
    with measure_traffic() as traffic:
        replay_kv(x, w, None, torch.randperm(100)[:N], angles.cos(), angles.sin(), cache, torch.randperm(32 * 16)[:N])
    assert traffic.total("read") + traffic.total("written") == replay_traffic(N, E, cache, 4)


# ---- bad input ------------------------------------------------------------------------------------

def test_bad_input_is_refused_with_the_value_and_the_limit():
    cache, tables, context = _filled([20, 5], 3, 64, 16, None)
    q = torch.randn(2, 9, 64)
    with pytest.raises(ValueError, match=r"context lengths must be in \[1, 32\]"):
        paged_decode_attention(q, cache, tables, torch.tensor([33, 5], dtype=torch.int32))
    with pytest.raises(ValueError, match=r"block ids must be in \[0, 6\)"):
        paged_decode_attention(q, cache, tables + 4, context)
    with pytest.raises(ValueError, match="not a multiple of the cache's 3 KV heads"):
        paged_decode_attention(torch.randn(2, 8, 64), cache, tables, context)
    with pytest.raises(ValueError, match="query lengths"):
        paged_prefill_attention(q, cache, tables, torch.tensor([0, 1], dtype=torch.int32),
                                torch.tensor([1, 6], dtype=torch.int32), context)
    with pytest.raises(ValueError, match="slot 96 is outside the pool of 96 slots"):
        reshape_and_cache(q[:, :3], q[:, :3], cache, torch.tensor([0, 96]))
    with pytest.raises(ValueError, match="cannot be packed"):
        PagedKVCache.allocate(4, 16, 1, 66, KVCacheFormat("int2"))


# ---- large shapes: only where a GPU runs them -----------------------------------------------------

@pytest.mark.skipif(not torch.cuda.is_available(), reason="large shapes need a GPU (hours in the interpreter)")
@pytest.mark.parametrize("fmt", [None, KVCacheFormat("fp8_e4m3", "per-token"), KVCacheFormat("int8")],
                         ids=["bf16", "fp8-per-token", "int8"])
def test_large_shapes_on_gpu(fmt):
    lens = [16384, 3001, 1, 40000]
    cache, tables, context = _filled(lens, 8, 128, 16, fmt, dtype=torch.bfloat16, device="cuda")
    q = torch.randn(len(lens), 32, 128, device="cuda", dtype=torch.bfloat16)
    ref = paged_decode_attention_ref(q, cache, tables, context)
    torch.testing.assert_close(paged_decode_attention(q, cache, tables, context), ref, atol=2e-2, rtol=2e-2)
    qlen = torch.tensor([2048, 3001, 1, 512], dtype=torch.int32, device="cuda")
    starts = torch.cumsum(qlen, 0, dtype=torch.int32) - qlen
    q = torch.randn(int(qlen.sum()), 32, 128, device="cuda", dtype=torch.bfloat16)
    torch.testing.assert_close(paged_prefill_attention(q, cache, tables, starts, qlen, context),
                               paged_prefill_attention_ref(q, cache, tables, starts, qlen, context),
                               atol=2e-2, rtol=2e-2)
