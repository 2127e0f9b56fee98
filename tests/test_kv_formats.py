"""KV-cache quantization formats (lab.kv.format): round trips within each format's error bound, static
scales required and saturation counted, windows exact, codes packed losslessly."""

import itertools
from dataclasses import replace

import pytest
import torch

from lab.kv.format import (GRANULARITIES, KV_CACHE_DTYPES, KVCacheFormat, dequantize, exact_mask, fake_quantize,
                          fp8_max, pack_codes, quantize, staging_length, static_scale, unpack_codes)


def kv(seed=0, t=37, h=3, d=64):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(t, h, d, generator=g)
    x[:, :, 5] *= 20  # an outlier channel, as keys have
    return x


def scale_for(x, fmt, role):
    if not fmt.static:
        return None
    gran = fmt.granularity_of(role)
    absmax = x.abs().amax() if gran == "per-tensor" else x.abs().amax(dim=(0, 2))
    return static_scale(absmax, fmt)


@pytest.mark.parametrize("dtype,granularity,role",
                         list(itertools.product(KV_CACHE_DTYPES, GRANULARITIES, ("k", "v"))))
def test_round_trip_within_the_format_bound(dtype, granularity, role):
    fmt = KVCacheFormat(dtype, granularity, token_group=8)
    x = kv()
    q = quantize(x, fmt, role, scale_for(x, fmt, role))
    y = dequantize(q, fmt)
    assert q.clipped == 0 and y.shape == x.shape
    if fmt.is_fp8:
        mantissa = 3 if dtype == "fp8_e4m3" else 2
        tiny = torch.finfo(torch.float8_e4m3fn if dtype == "fp8_e4m3" else torch.float8_e5m2).tiny
        bound = x.abs() * 2.0 ** -(mantissa + 1) + tiny * q.scale  # subnormals: absolute half-ulp
        assert ((x - y).abs() <= bound * (1 + 1e-6)).all()
    else:
        assert ((x - y).abs() <= q.scale / 2 * (1 + 1e-5)).all()
    assert torch.equal(dequantize(quantize(torch.zeros_like(x), fmt, role, scale_for(x, fmt, role)), fmt),
                       torch.zeros_like(x))


def test_fewer_bits_more_error_and_keys_per_channel_beat_per_token_on_outlier_channels():
    x = kv()
    err = {d: float((fake_quantize(x, KVCacheFormat(d, "per-token"), "k") - x).norm()) for d in ("int8", "int4", "int2")}
    assert err["int8"] < err["int4"] < err["int2"]
    per_channel = float((fake_quantize(x, KVCacheFormat("int4", "per-channel", token_group=8), "k") - x).norm())
    assert per_channel < err["int4"]


def test_static_scales_required_and_saturation_counted():
    x = kv()
    with pytest.raises(ValueError, match="static"):
        quantize(x, KVCacheFormat("fp8_e4m3", "per-tensor"), "k")
    with pytest.raises(ValueError, match="dynamic"):
        quantize(x, KVCacheFormat("int8", "per-token"), "k", torch.tensor(1.0))
    with pytest.raises(ValueError, match="3 scale"):
        quantize(x, KVCacheFormat("int8", "per-head"), "k", torch.ones(2))
    # vLLM's default scale 1.0 on e4m3 (max 448) does not saturate these values, but a small scale does:
    small = quantize(x * 100, KVCacheFormat("fp8_e4m3", "per-tensor"), "k", torch.tensor(1.0))
    big = x.abs().amax() * 100
    assert small.clipped == int((x.abs() * 100 > fp8_max("fp8_e4m3")).sum()) > 0 and big > 448
    assert dequantize(small, KVCacheFormat("fp8_e4m3", "per-tensor")).abs().max() == fp8_max("fp8_e4m3")


def test_exact_reads_are_the_window_and_a_filling_key_group():
    pos = torch.arange(12)
    q, k = pos[:, None], pos[None, :]
    assert exact_mask(KVCacheFormat("int4"), "k", q, k) is None
    window = exact_mask(KVCacheFormat("int2", window=3), "v", q, k)
    assert window[7].tolist()[:8] == [j in (5, 6, 7) for j in range(8)]  # keys after 7: causality hides them
    fmt = KVCacheFormat("int4", "per-channel", token_group=4)
    assert exact_mask(fmt, "v", q, k) is None  # values are per-token: nothing waits for a group
    keys = exact_mask(fmt, "k", q, k)
    assert keys[6].tolist()[:7] == [False] * 4 + [True] * 3  # group 4..7 still filling at query 6
    assert keys[7].tolist()[:8] == [False] * 4 + [True] * 4  # it completes at 7, read exactly at 7 itself
    both = exact_mask(replace(fmt, window=2), "k", q, k)
    assert both[8].tolist()[:9] == [False] * 7 + [True] * 2  # new group at 8, window reaches back to 7
    assert staging_length(fmt) == 3 and staging_length(replace(fmt, window=6)) == 6


def test_per_channel_groups_run_along_tokens_with_a_ragged_last_group():
    x = kv(t=20)
    fmt = KVCacheFormat("int4", "per-channel", token_group=8)
    q = quantize(x, fmt, "k")
    assert torch.equal(q.scale[0], q.scale[7]) and not torch.equal(q.scale[7], q.scale[8])
    assert torch.equal(q.scale[16], q.scale[19])  # the last group: 4 tokens
    assert quantize(x, fmt, "v").scale.shape == (20, 3, 1)  # values per token


@pytest.mark.parametrize("bits", [2, 4, 8])
def test_pack_unpack_exact(bits):
    g = torch.Generator().manual_seed(bits)
    codes = torch.randint(0, 2 ** bits, (5, 3, 64), generator=g, dtype=torch.uint8)
    packed = pack_codes(codes, bits)
    assert packed.shape == (5, 3, 64 * bits // 8) and torch.equal(unpack_codes(packed, bits), codes)
    with pytest.raises(ValueError):
        pack_codes(codes[..., :3], 2)


def test_bad_formats_named():
    with pytest.raises(ValueError, match="int3"):
        KVCacheFormat("int3")
    with pytest.raises(ValueError, match="per-block"):
        KVCacheFormat("int8", "per-block")
    with pytest.raises(ValueError, match="window"):
        KVCacheFormat("int8", window=-1)
    assert KVCacheFormat("fp8_e5m2").granularity == "per-tensor" and KVCacheFormat("int4").granularity == "per-token"
