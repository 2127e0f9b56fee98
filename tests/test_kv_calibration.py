"""Static KV scales from calibration, and the contiguous cache that stores K/V through a format."""

import pytest
import torch

from lab.models.reference import ContiguousKVCache
from lab.kv.format import KVCacheFormat
from lab.kv.calibration import KVScales, QuantizedContiguousKVCache, calibrate_kv_absmax

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def tiny():
    from lab.models import load_model

    model, _ = load_model("random:tiny", dtype=torch.float32, device="cpu")
    g = torch.Generator().manual_seed(0)
    seqs = [torch.randint(0, model.config.vocab_size, (n,), generator=g).tolist() for n in (40, 23)]
    return model, seqs


@torch.inference_mode()
def logits(model, ids, cache, chunks=None):
    chunks = chunks or [len(ids)]
    out, start = [], 0
    for n in chunks:
        pos = torch.arange(start, start + n)
        out.append(model.compute_logits(model(torch.tensor(ids[start:start + n]), pos, cache)))
        start += n
    return torch.cat(out)


def test_calibration_shapes_order_and_round_trip(tiny, tmp_path):
    model, seqs = tiny
    mx = calibrate_kv_absmax(model, seqs, "max")
    pct = calibrate_kv_absmax(model, seqs, "percentile", 90.0)
    shape = (len(model.layers), model.config.num_key_value_heads)
    assert mx.k.shape == mx.v.shape == mx.k_pre_rope.shape == shape
    assert (pct.k <= mx.k).all() and (pct.v <= mx.v).all() and (pct.k < mx.k).any()
    back = KVScales.load(mx.save(tmp_path / "kv_scales.safetensors"))
    assert torch.equal(back.k, mx.k) and torch.equal(back.k_pre_rope, mx.k_pre_rope) and back.method == "max"
    fmt = KVCacheFormat("fp8_e4m3", "per-head")
    assert torch.allclose(mx.scale(fmt, 0, "k") * 448, mx.k[0])
    assert mx.scale(KVCacheFormat("int8", "per-tensor"), 1, "v").numel() == 1
    with pytest.raises(ValueError, match="dynamic"):
        mx.scale(KVCacheFormat("int8", "per-token"), 0, "k")
    with pytest.raises(ValueError, match="method"):
        calibrate_kv_absmax(model, seqs, "mean")


def test_window_covering_everything_is_exact(tiny):
    model, seqs = tiny
    ids = seqs[0]
    exact = logits(model, ids, ContiguousKVCache(len(model.layers)))
    for pre_rope in (False, True):
        fmt = KVCacheFormat("int2", "per-token", window=len(ids), pre_rope=pre_rope)
        assert torch.allclose(logits(model, ids, QuantizedContiguousKVCache(model, fmt)), exact, atol=1e-4)


@pytest.mark.parametrize("pre_rope", [False, True])
def test_error_grows_as_bits_shrink(tiny, pre_rope):
    model, seqs = tiny
    ids = seqs[0]
    exact = logits(model, ids, ContiguousKVCache(len(model.layers)))
    err = {}
    for dtype in ("int8", "int4", "int2"):
        got = logits(model, ids, QuantizedContiguousKVCache(model, KVCacheFormat(dtype, "per-token", pre_rope=pre_rope)))
        err[dtype] = float((got - exact).norm() / exact.norm())
    assert 0 < err["int8"] < err["int4"] < err["int2"], err


def test_per_token_chunked_writes_equal_one_write(tiny):
    model, seqs = tiny
    ids = seqs[0]
    fmt = KVCacheFormat("int4", "per-token")
    one = logits(model, ids, QuantizedContiguousKVCache(model, fmt))
    chunked = logits(model, ids, QuantizedContiguousKVCache(model, fmt), chunks=[17, 1, 22])
    assert torch.allclose(one, chunked, atol=1e-5)


@pytest.mark.parametrize("fmt", [KVCacheFormat("int4", "per-channel", token_group=8),
                                 KVCacheFormat("int2", "per-channel", token_group=4, window=6, pre_rope=True),
                                 KVCacheFormat("int2", window=5)])
def test_groups_and_windows_chunked_equal_one_write(tiny, fmt):
    """Key groups are re-quantized as they fill and windows are per query, so writing a sequence in chunks
    that cut groups (17, then single tokens as in decoding) reads what one write reads."""
    model, seqs = tiny
    ids = seqs[0]
    one = logits(model, ids, QuantizedContiguousKVCache(model, fmt))
    chunked = logits(model, ids, QuantizedContiguousKVCache(model, fmt), chunks=[17, 1, 1, 1, 20])
    assert torch.allclose(one, chunked, atol=1e-4)
    exact = logits(model, ids, ContiguousKVCache(len(model.layers)))
    assert float((one - exact).norm()) > 0


def test_static_formats_need_scales_and_use_them(tiny):
    model, seqs = tiny
    fmt = KVCacheFormat("fp8_e4m3", "per-tensor")
    with pytest.raises(ValueError, match="KVScales"):
        QuantizedContiguousKVCache(model, fmt)
    scales = calibrate_kv_absmax(model, seqs)
    ids = seqs[1]
    exact = logits(model, ids, ContiguousKVCache(len(model.layers)))
    calibrated = logits(model, ids, QuantizedContiguousKVCache(model, fmt, scales))
    ones = KVScales(torch.full_like(scales.k, 448.0), torch.full_like(scales.v, 448.0),
                    torch.full_like(scales.k, 448.0), "max", None)  # scale 1.0, vLLM's default
    default = logits(model, ids, QuantizedContiguousKVCache(model, fmt, ones))
    assert ones.scale(fmt, 0, "k").item() == 1.0
    assert float((calibrated - exact).norm()) <= float((default - exact).norm())
