"""GPTQ / AWQ checkpoint packing (lab.quant.formats): exact round trips, layouts, save -> load."""

import json

import pytest
import torch

from lab.quant.formats import load_quantized, pack_awq, pack_gptq, save_quantized, unpack_awq, unpack_gptq
from lab.quant.rtn import QuantSpec, dequantize, quantize

pytestmark = pytest.mark.usefixtures("one_thread")


def random_codes(out_f, in_f, group_size, bits, signed=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    groups = in_f // group_size
    if signed:
        q = torch.randint(-(2 ** (bits - 1)), 2 ** (bits - 1), (out_f, in_f), generator=g).to(torch.int8)
        zeros = torch.zeros(out_f, groups, dtype=torch.int32)
    else:
        q = torch.randint(0, 2 ** bits, (out_f, in_f), generator=g).to(torch.uint8)
        zeros = torch.randint(1, 2 ** bits, (out_f, groups), generator=g).to(torch.int32)  # GPTQ: zero >= 1
    scales = (torch.rand(out_f, groups, generator=g) * 0.1 + 1e-3).half().float()  # fp16-representable
    return q, scales, zeros


@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("shape,group_size", [((64, 128), 32), ((96, 96), 32), ((32, 256), 128), ((48, 64), 64)])
@pytest.mark.parametrize("act_order", [False, True])
def test_gptq_round_trip_exact(bits, shape, group_size, act_order):
    out_f, in_f = shape
    q, scales, zeros = random_codes(out_f, in_f, group_size, bits, seed=bits + in_f)
    g_idx = torch.arange(in_f) // group_size
    if act_order:
        g_idx = g_idx[torch.randperm(in_f, generator=torch.Generator().manual_seed(1))]
    packed = pack_gptq(q, scales, zeros, g_idx, bits)
    assert packed["qweight"].dtype == torch.int32 and packed["qweight"].shape == (in_f * bits // 32, out_f)
    assert packed["qzeros"].dtype == torch.int32 and packed["qzeros"].shape == (in_f // group_size, out_f * bits // 32)
    assert packed["scales"].dtype == torch.float16 and packed["scales"].shape == (in_f // group_size, out_f)
    assert packed["g_idx"].dtype == torch.int32 and torch.equal(packed["g_idx"].long(), g_idx)
    q2, s2, z2, g2 = unpack_gptq(packed["qweight"], packed["qzeros"], packed["scales"], packed["g_idx"], bits)
    assert torch.equal(q2, q) and torch.equal(s2, scales) and torch.equal(z2, zeros) and torch.equal(g2, g_idx)


@pytest.mark.parametrize("bits", [4, 8])
def test_gptq_symmetric_round_trip_and_layout(bits):
    q, scales, zeros = random_codes(32, 64, 32, bits, signed=True)
    packed = pack_gptq(q, scales, zeros, None, bits)
    # sym checkpoints store zero 2^(b-1) minus the offset: 0x77777777 at 4 bits, 0x7f7f7f7f at 8
    expected = {4: 0x77777777, 8: 0x7F7F7F7F}[bits]
    assert bool((packed["qzeros"] == expected).all())
    q2, s2, z2, _ = unpack_gptq(packed["qweight"], packed["qzeros"], packed["scales"], None, bits, signed=True)
    assert torch.equal(q2, q) and torch.equal(z2, zeros) and torch.equal(s2, scales)


def test_gptq_layout_hand_built():
    # 4 bits: input rows 0..7 of output column 0 hold codes 1..8 -> one word 0x87654321
    q = torch.zeros(8, 8, dtype=torch.uint8)
    q[0] = torch.arange(1, 9)
    zeros = torch.tensor([[1], [2], [3], [4], [5], [6], [7], [8]], dtype=torch.int32)  # one group
    packed = pack_gptq(q, torch.ones(8, 1), zeros, None, 4)
    assert packed["qweight"].shape == (1, 8) and int(packed["qweight"][0, 0]) & 0xFFFFFFFF == 0x87654321
    assert int(packed["qweight"][0, 1]) == 0
    assert int(packed["qzeros"][0, 0]) & 0xFFFFFFFF == 0x76543210  # zeros 1..8 stored minus one, along outputs


def test_awq_interleave_hand_built():
    # codes 0..7 in output channels 0..7 of one input row: nibbles hold channels 0,2,4,6,1,3,5,7
    q = torch.arange(8, dtype=torch.uint8)[:, None].expand(8, 32).contiguous()  # [out=8, in=32]
    zeros = torch.arange(8, dtype=torch.int32)[:, None]
    packed = pack_awq(q, torch.ones(8, 1), zeros, bits=4)
    assert packed["qweight"].shape == (32, 1)
    assert bool((packed["qweight"] == 0x75316420).all())  # top nibble 7: still positive
    assert int(packed["qzeros"][0, 0]) == 0x75316420  # zeros without offset, same order


@pytest.mark.parametrize("shape,group_size", [((64, 128), 32), ((96, 96), 32), ((16, 256), 128), ((40, 64), 64)])
@pytest.mark.parametrize("signed", [False, True])
def test_awq_round_trip_exact(shape, group_size, signed):
    out_f, in_f = shape
    q, scales, zeros = random_codes(out_f, in_f, group_size, 4, signed=signed, seed=in_f)
    if not signed:
        zeros[0, 0] = 0  # AWQ stores zeros without offset: 0 is fine
    packed = pack_awq(q, scales, zeros, bits=4)
    assert packed["qweight"].shape == (in_f, out_f // 8) and packed["qzeros"].shape == (in_f // group_size, out_f // 8)
    q2, s2, z2, g2 = unpack_awq(packed["qweight"], packed["qzeros"], packed["scales"], signed=signed)
    assert torch.equal(q2, q) and torch.equal(s2, scales) and torch.equal(z2, zeros)
    assert torch.equal(g2, torch.arange(in_f) // group_size)


def test_refusals():
    w = torch.randn(64, 576)
    q, s, z = quantize(w, QuantSpec(4, 128))  # ragged: 576 = 4 * 128 + 64
    for pack in (pack_gptq, pack_awq):
        with pytest.raises(ValueError, match=r"in_features=576 .*group_size=128"):
            pack(q, s, z, None, 4, 128)
        with pytest.raises(ValueError, match="576"):
            pack(q, s, z, None, 4)
    q, s, z = random_codes(32, 64, 32, 4)
    with pytest.raises(ValueError, match="3-bit"):
        pack_gptq(q, s, z, None, 3)
    with pytest.raises(ValueError, match="bits"):
        pack_awq(q, s, z, bits=8)
    z[0, 0] = 0
    with pytest.raises(ValueError, match="zero point of 0"):
        pack_gptq(q, s, z, None, 4)
    assert pack_gptq(q, s, z, None, 4, zero_offset=0)["qzeros"].dtype == torch.int32  # gptq_v2 can
    act = (torch.arange(64) // 32).flip(0)
    with pytest.raises(ValueError, match="act-order"):
        pack_awq(q, s, z, act)


def fake_quantized_tiny(spec):
    """random:tiny with every decoder linear RTN-quantized; weights set to what the checkpoint holds
    (fp16 scales), and the codes by module name."""
    from lab.models import load_model

    model, _ = load_model("random:tiny", dtype=torch.float32, device="cpu")
    results = {}
    with torch.no_grad():
        for name, module in model.layers.named_modules():
            if isinstance(module, torch.nn.Linear):
                q, scales, zeros = quantize(module.weight, spec)
                scales = scales.half().float()
                results[f"layers.{name}"] = (q, scales, zeros, spec.group_index(module.in_features))
                module.weight.copy_(dequantize(q, scales, zeros, group_size=spec.group_size))
    return model, results


@pytest.mark.parametrize("method,symmetric", [("gptq", False), ("gptq", True), ("awq", False)])
def test_save_load_matches_fake_quant_and_engine(tmp_path, method, symmetric):
    from lab.engine import LLM
    from lab.engine.request import SamplingParams

    spec = QuantSpec(bits=4, group_size=32, symmetric=symmetric)
    model, results = fake_quantized_tiny(spec)
    out = save_quantized(model, results, spec, method, tmp_path / method)
    qc = json.loads((out / "config.json").read_text())["quantization_config"]
    assert qc["quant_method"] == method
    if method == "gptq":
        assert (qc["bits"], qc["group_size"], qc["desc_act"], qc["sym"]) == (4, 32, False, symmetric)
    else:
        assert (qc["version"], qc["w_bit"], qc["q_group_size"], qc["zero_point"]) == ("gemm", 4, 32, True)
    from safetensors.torch import load_file

    names = load_file(out / "model.safetensors")
    for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
        assert f"model.layers.0.self_attn.{proj}.qweight" in names
    for proj in ("gate_proj", "up_proj", "down_proj"):
        assert f"model.layers.1.mlp.{proj}.qweight" in names
    assert "lm_head.weight" in names and "model.embed_tokens.weight" in names

    loaded, tok = load_quantized(out, dtype=torch.float32, device="cpu")
    assert tok is None
    ref = model.state_dict()
    for key, value in loaded.state_dict().items():
        assert torch.equal(value, ref[key]), key

    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    prompts = [[5, 17, 42, 9], [100, 3, 3, 77, 8, 1]]
    got = [o.token_ids for o in LLM(loaded, num_kv_blocks=64, max_model_len=64).generate(prompts, params)]
    want = [o.token_ids for o in LLM(model, num_kv_blocks=64, max_model_len=64).generate(prompts, params)]
    assert got == want and all(len(t) == 12 for t in got)


def test_gptq_zero_point_of_zero_is_saved_as_gptq_v2(tmp_path):
    """The classic format stores zero - 1; a checkpoint with an asymmetric zero of 0 is written as
    gptq_v2 (zeros as they are) and still loads back exactly; without one it stays classic."""
    spec = QuantSpec(bits=4, group_size=32)
    model, results = fake_quantized_tiny(spec)
    classic = save_quantized(model, results, spec, "gptq", tmp_path / "classic")
    assert json.loads((classic / "config.json").read_text())["quantization_config"]["checkpoint_format"] == "gptq"

    name = "layers.0.self_attn.qkv_proj"
    q, scales, zeros, g_idx = results[name]
    zeros = zeros.clone()
    zeros[0, 0] = 0
    results[name] = (q, scales, zeros, g_idx)
    with torch.no_grad():
        model.get_submodule(name).weight.copy_(dequantize(q, scales, zeros, group_size=32))
    out = save_quantized(model, results, spec, "gptq", tmp_path / "v2")
    assert json.loads((out / "config.json").read_text())["quantization_config"]["checkpoint_format"] == "gptq_v2"
    loaded, _ = load_quantized(out, dtype=torch.float32, device="cpu")
    ref = model.state_dict()
    assert all(torch.equal(v, ref[k]) for k, v in loaded.state_dict().items())


def test_save_refuses_ragged_groups(tmp_path):
    from lab.models import load_model

    model, _ = load_model("random:tiny", dtype=torch.float32, device="cpu")
    spec = QuantSpec(bits=4, group_size=64)  # hidden 96 is not a multiple of 64
    lin = model.layers[0].self_attn.qkv_proj
    q, s, z = quantize(lin.weight, spec)
    with pytest.raises(ValueError, match=r"qkv_proj: in_features=96 .*group_size=64"):
        save_quantized(model, {"layers.0.self_attn.qkv_proj": (q, s, z, None)}, spec, "gptq", tmp_path)


@pytest.mark.parametrize("symmetric", [False, True])
def test_gptq_result_act_order_round_trip(symmetric):
    from lab.quant.formats import _as_codes
    from lab.quant.gptq import GPTQConfig, gptq_quantize

    g = torch.Generator().manual_seed(0)
    w, x = torch.randn(32, 128, generator=g), torch.randn(256, 128, generator=g) * torch.linspace(0.1, 3, 128)
    spec = QuantSpec(bits=4, group_size=32, symmetric=symmetric)
    res = gptq_quantize(w, 2 / 256 * x.t() @ x, spec, GPTQConfig(act_order=True))
    q, scales, zeros, g_idx = _as_codes(res, spec)
    assert torch.equal(dequantize(q, scales, zeros, g_idx), res.weight)
    scales = scales.half().float()
    packed = pack_gptq(q, scales, zeros, g_idx, 4)
    back = unpack_gptq(packed["qweight"], packed["qzeros"], packed["scales"], packed["g_idx"], 4, signed=symmetric)
    assert torch.equal(dequantize(*back), dequantize(q, scales, zeros, g_idx))
