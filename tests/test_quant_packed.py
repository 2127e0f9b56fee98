"""Packed low-bit linears (lab.quant.packed): kernel arithmetic against the lab's dequantized weights,
whole packed models against their dequantized twins, checkpoints loaded packed, refusals by name.

Tolerances come from the kernels' arithmetic, not from fitting: the kernels take bf16 activations,
keep scales and zeros in bf16 (relative rounding <= 2^-9), accumulate in float32 and round outputs
to bf16 (<= 2^-9 relative). See `bound` for the per-element bound each test asserts.
"""

import copy

import pytest
import torch

from lab.quant.packed import INT4_GROUP_SIZES, PackedLinear, checkpoint_codes, load_packed, pack_linear, pack_model
from lab.quant.rtn import QuantSpec, dequantize, quantize

pytestmark = pytest.mark.usefixtures("one_thread")

U = 2.0 ** -9  # unit roundoff of bfloat16 (8 significant bits)


def weight_error(q, s, z, g_idx, bits, kernel):
    """(|W_kernel - W_lab| bound, |pieces rounded to bf16 before the sum| bound), elementwise [out, in].

    int4: w = (q - 8) S + Z, S = bf16(s), Z = bf16(s (8 - z)): error <= U s (|q - 8| + |8 - z|).
    int8 (per channel): w = (q - 128) S + s (128 - z) in float32: error <= U s |q - 128|.
    int8x2: planes 16 S (hi - 8) + Z_hi and S (lo - 8) + Z_lo, Z_lo = bf16(c - Z_hi), c = s (136 - z):
    error <= U s |q - 136| + U^2 |c|. Each plane's output is rounded to bf16 on its own.
    """
    qu, zu = q.long(), z.long()
    if q.dtype == torch.int8:
        qu, zu = qu + 2 ** (bits - 1), zu + 2 ** (bits - 1)
    s, zu = s.float()[:, g_idx], zu.float()[:, g_idx]
    qu = qu.float()
    if kernel == "int4":
        return U * s * ((qu - 8).abs() + (8 - zu).abs()), s * (qu - zu).abs() + U * s * 16
    if kernel == "int8":
        return U * s * (qu - 128).abs(), s * (qu - 128).abs() + s * (128 - zu).abs()
    c = s * (136 - zu)
    hi, lo = torch.div(qu, 16, rounding_mode="floor"), qu % 16
    parts = 16 * s * (hi - 8).abs() + s * (lo - 8).abs() + 2 * c.abs()
    return U * s * (qu - 136).abs() + U * U * c.abs() * 2, parts


def bound(x, d_w, parts):
    """|y_kernel - x_b W_lab^T| <= |x_b| d_w^T (weights) + (2U + K 2^-23) |x_b| parts^T: bf16 output
    rounding (U, doubled for slack on what is rounded) and float32 accumulation over K terms."""
    xa = x.abs().double()
    return xa @ d_w.double().t() + (2 * U + x.shape[-1] * 2.0 ** -23) * (xa @ parts.double().t())


def check_linear(lin: PackedLinear, x, q, s, z, g_idx, bits):
    w_lab = dequantize(q, s, z, g_idx)
    xb = x.to(torch.bfloat16).float()  # what the kernel sees
    y = lin(x)
    assert y.dtype == x.dtype and y.shape == (*x.shape[:-1], q.shape[0])
    ref = xb.double() @ w_lab.double().t()
    d_w, parts = weight_error(q, s, z, g_idx, bits, lin.kernel)
    err = (y.double() - ref).abs()
    tol = bound(xb, d_w, parts)
    assert bool((err <= tol).all()), (lin.kernel, float((err - tol).max()), float(err.max()))
    return err, tol


def random_codes(out_f, in_f, group_size, bits, symmetric, seed=0):
    g = torch.Generator().manual_seed(seed)
    groups = -(-in_f // group_size)
    if symmetric:
        q = torch.randint(-(2 ** (bits - 1)), 2 ** (bits - 1), (out_f, in_f), generator=g).to(torch.int8)
        z = torch.zeros(out_f, groups, dtype=torch.int32)
    else:
        q = torch.randint(0, 2 ** bits, (out_f, in_f), generator=g).to(torch.uint8)
        z = torch.randint(0, 2 ** bits, (out_f, groups), generator=g).to(torch.int32)
    return q, torch.rand(out_f, groups, generator=g) * 0.02 + 1e-4, z


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("shape,group_size,kernel_group", [
    ((96, 576), 64, 64), ((48, 1536), 128, 128), ((40, 256), 256, 256),  # 40 rows: padded to 48
    ((64, 576), 128, 64),  # ragged last group (4 x 128 + 64): served at 64 with repeated scales
    ((32, 576), 576, 64)])  # per channel
@pytest.mark.parametrize("symmetric", [False, True])
def test_packed_linear_random_codes_within_kernel_rounding(bits, shape, group_size, kernel_group, symmetric):
    q, s, z = random_codes(*shape, group_size, bits, symmetric, seed=bits + shape[0])
    g_idx = torch.arange(shape[1]) // group_size
    lin = pack_linear(q, s, z, g_idx, bits)
    per_channel = group_size == shape[1]
    assert lin.kernel == ("int4" if bits == 4 else "int8" if per_channel else "int8x2")
    if lin.kernel != "int8":
        assert lin.group_size == kernel_group
    x = torch.randn(5, shape[1]) * 3
    check_linear(lin, x, q, s, z, g_idx, bits)
    check_linear(lin, x[:1], q, s, z, g_idx, bits)  # the decode shape, M = 1
    assert lin(torch.zeros(0, shape[1])).shape == (0, shape[0])


def test_packed_linear_follows_the_model_dtype():
    """model.to(bf16) / .float() cast floating buffers; the kernels still get bf16 scales, and the
    output comes back in the input's dtype."""
    q, s, z = random_codes(32, 128, 64, 4, False, seed=1)
    lin = pack_linear(q, s, z, torch.arange(128) // 64, 4, bias=torch.randn(32))
    x = torch.randn(3, 128)
    y = lin(x)
    assert lin.to(torch.bfloat16).scales.dtype == torch.bfloat16 and lin(x.bfloat16()).dtype == torch.bfloat16
    assert torch.allclose(lin(x.bfloat16()).float(), y, rtol=2 ** -7, atol=1e-2)
    assert lin.float().scales.dtype == torch.bfloat16 and lin.bias.dtype == torch.float32
    assert torch.allclose(lin(x), y, rtol=2 ** -7, atol=1e-2)  # the bias went through bf16 and back
    assert lin(x.reshape(1, 3, 128)).shape == (1, 3, 32)


def test_packed_linear_act_order_permutes_inputs():
    q, s, z = random_codes(64, 256, 64, 4, False, seed=3)
    g_idx = (torch.arange(256) // 64)[torch.randperm(256, generator=torch.Generator().manual_seed(0))]
    lin = pack_linear(q, s, z, g_idx, 4)
    assert lin.perm is not None
    check_linear(lin, torch.randn(7, 256), q, s, z, g_idx, 4)


def test_bound_is_tight_enough_to_catch_a_wrong_zero():
    """The tolerance is not loose: the kernel's zero convention off by one code (s (8 - z) vs
    s (7 - z), a shift of one step s) breaks it."""
    q, s, z = random_codes(64, 256, 64, 4, False, seed=5)
    z = z.clamp(max=14)
    g_idx = torch.arange(256) // 64
    wrong = pack_linear(q, s, z + 1, g_idx, 4)
    with pytest.raises(AssertionError):
        check_linear(wrong, torch.randn(4, 256), q, s, z, g_idx, 4)


@pytest.mark.parametrize("bits,group_size", [(4, 64), (4, 128), (8, 64), (8, None)])
def test_packed_linear_real_weights_and_activations(smollm, layer3_inputs, bits, group_size):
    """Layer 3's qkv and down projections on the activations that reach them (SmolLM2's outlier
    channels included), on the RTN grid."""
    model, _ = smollm
    spec = QuantSpec(bits, group_size)
    for key, lin in (("qkv", model.layers[3].self_attn.qkv_proj), ("down", model.layers[3].mlp.down_proj)):
        q, s, z = quantize(lin.weight.detach(), spec)
        g_idx = spec.group_index(lin.in_features)
        err, tol = check_linear(pack_linear(q, s, z, g_idx, bits), layer3_inputs[key][:64], q, s, z, g_idx, bits)
        assert float(err.max()) > 0  # bf16 activations: the packed linear is not the float one


def test_refusals_name_the_value():
    q, s, z = random_codes(32, 576, 16, 4, False)
    with pytest.raises(ValueError, match=r"group size 16 .*\[32, 64, 128, 256\]"):
        pack_linear(q, s, z, torch.arange(576) // 16, 4)
    q, s, z = random_codes(32, 80, 80, 4, False)
    with pytest.raises(ValueError, match=r"group size 80 .*in_features=80"):
        pack_linear(q, s, z, torch.zeros(80, dtype=torch.long), 4)
    q, s, z = random_codes(32, 72, 72, 8, False)
    with pytest.raises(ValueError, match=r"in_features=72 is not a multiple of 16"):
        pack_linear(q, s, z, torch.zeros(72, dtype=torch.long), 8)
    q, s, z = random_codes(32, 64, 32, 3, False)
    with pytest.raises(ValueError, match=r"bits=3.*\(4, 8\)"):
        pack_linear(q, s, z, torch.arange(64) // 32, 3)
    q, s, z = random_codes(32, 64, 32, 8, False)
    with pytest.raises(ValueError, match=r"codes do not fit 4 bits"):
        pack_linear(q, s, z, torch.arange(64) // 32, 4)
    assert INT4_GROUP_SIZES == (256, 128, 64, 32)


# --------------------------------------------------------------------------- whole models

def rtn_results(model, spec):
    """RTN codes of every decoder linear, the model's weights set to their dequantized values."""
    from lab.quant.pipeline import decoder_linears

    results = {}
    with torch.no_grad():
        for name, lin in decoder_linears(model).items():
            q, s, z = quantize(lin.weight.detach(), spec)
            lin.weight.copy_(dequantize(q, s, z, group_size=spec.group_size))
            results[name] = (q, s, z)
    return results


def assert_greedy_close(packed, reference, prompt, steps, margin):
    """Greedy tokens of `packed` are the reference's choices on the same prefix, or within `margin`
    logits of them: packed and dequantized models differ by bf16 rounding (~0.1 logits rms on
    SmolLM2), so where the reference's top two are closer than that (a near-tie) the token may
    legitimately differ; a wrong kernel would pick tokens far below the reference's best."""
    from lab.models.reference import forward_logits, greedy_generate

    tokens = greedy_generate(packed, prompt, steps)
    ref = forward_logits(reference, prompt + tokens)[len(prompt) - 1:-1]
    chosen = ref.gather(1, torch.tensor(tokens)[:, None]).squeeze(1)
    gap = ref.max(-1).values - chosen
    assert float(gap.max()) <= margin, gap
    return int((gap == 0).sum())


def rms(t):
    return float(t.pow(2).mean().sqrt())


@pytest.mark.parametrize("bits", [4, 8])
def test_packed_model_matches_dequantized_model(smollm, quant_prompt_ids, bits):
    """Every decoder linear RTN-quantized (group 64): the packed model's logits stay within bf16
    rounding of the dequantized model's (measured 0.08-0.2 rms, max 0.7), far below what the
    quantization itself moves them at 4 bits (3.5-4.2 rms); greedy tokens agree but at near-ties."""
    from lab.models.reference import forward_logits

    model, _ = smollm
    spec = QuantSpec(bits, 64)
    deq = copy.deepcopy(model)
    results = rtn_results(deq, spec)
    packed = pack_model(copy.deepcopy(deq), results, spec)
    assert sum(isinstance(m, PackedLinear) for m in packed.modules()) == 4 * len(model.layers)
    assert packed.lm_head.weight is packed.embed_tokens.weight  # not asked to pack: still tied, float
    agree = total = 0
    for ids in quant_prompt_ids[:3]:
        ref, got = forward_logits(deq, ids), forward_logits(packed, ids)
        assert rms(got - ref) < 0.4 and float((got - ref).abs().max()) < 2.0
        if bits == 4:
            assert rms(got - ref) < 0.1 * rms(ref - forward_logits(model, ids))
        agree += assert_greedy_close(packed, deq, ids, 12, margin=0.5)
        total += 12
    assert agree >= 0.8 * total


def test_packed_lm_head_unties_and_matches(smollm, quant_prompt_ids):
    from lab.models.reference import forward_logits

    model, _ = smollm
    spec, head_spec = QuantSpec(4, 64), QuantSpec(4, 64)
    deq = copy.deepcopy(model)
    results = rtn_results(deq, spec)
    packed = pack_model(copy.deepcopy(deq), results, spec, lm_head=head_spec)
    assert isinstance(packed.lm_head, PackedLinear) and packed.lm_head.out_features == model.config.vocab_size
    assert torch.equal(packed.embed_tokens.weight, model.embed_tokens.weight)  # the lookup stays float
    q, s, z = quantize(model.lm_head.weight.detach(), head_spec)
    deq.lm_head = torch.nn.Linear(model.config.hidden_size, model.config.vocab_size, bias=False)
    deq.lm_head.weight = torch.nn.Parameter(dequantize(q, s, z, group_size=64), requires_grad=False)
    ids = quant_prompt_ids[0]
    ref, got = forward_logits(deq, ids), forward_logits(packed, ids)
    assert rms(got - ref) < 0.4
    with pytest.raises(ValueError, match="lm_head is in results already"):
        pack_model(copy.deepcopy(deq), {"lm_head": (q, s, z)}, spec, lm_head=head_spec)


# --------------------------------------------------------------------------- checkpoints

def tiny_calibrated(method, spec, act_order=False):
    """random:tiny quantized with the lab's GPTQ or AWQ on a few random sequences: (model, codes)."""
    from lab.models import load_model
    from lab.quant.gptq import GPTQConfig, gptq_quantize_model

    model, _ = load_model("random:tiny", dtype=torch.float32, device="cpu")
    g = torch.Generator().manual_seed(0)
    calib = [torch.randint(3, 512, (24,), generator=g).tolist() for _ in range(4)]
    codes: dict = {}
    if method == "gptq":
        gptq_quantize_model(model, calib, spec, GPTQConfig(act_order=act_order), progress=False, results=codes)
    else:
        from lab.quant.awq import awq_quantize_model

        awq_quantize_model(model, calib, spec, progress=False, results=codes, n_grid=4, clip_grid=4)
    return model, codes


@pytest.mark.parametrize("method,bits,act_order", [("gptq", 4, True), ("gptq", 8, False), ("awq", 4, False)])
def test_checkpoint_loads_packed_and_matches_dequantized_load(tmp_path, method, bits, act_order):
    from lab.models.reference import forward_logits
    from lab.quant.formats import load_quantized, save_quantized

    spec = QuantSpec(bits, 32)
    model, codes = tiny_calibrated(method, spec, act_order)
    out = save_quantized(model, codes, spec, method, tmp_path / method)
    deq, _ = load_quantized(out, dtype=torch.float32, device="cpu")
    packed, tok = load_packed(out)
    assert tok is None
    kinds = {m.kernel for m in packed.modules() if isinstance(m, PackedLinear)}
    assert kinds == {"int4" if bits == 4 else "int8x2"}
    perms = [m.perm is not None for m in packed.modules() if isinstance(m, PackedLinear)]
    assert any(perms) == act_order
    fused, got_bits = checkpoint_codes(out)
    assert got_bits == bits and sorted(fused) == sorted(codes)
    # the fused checkpoint codes are the lab's own (the act-order case keeps its g_idx)
    for name, (q, s, z, g) in fused.items():
        w = model.get_submodule(name).weight
        assert torch.equal(dequantize(q, s, z, g), deq.get_submodule(name).weight.float()), name
        assert q.shape == w.shape
    for name, mod in packed.named_modules():
        if isinstance(mod, PackedLinear):
            q, s, z, g = fused[name]
            x = torch.randn(6, mod.in_features)
            check_linear(mod, x, q, s, z, g, bits)
    # random:tiny's logits are small (|max| ~0.7) and its top two often close (gaps down to 0.005):
    # measured max difference 0.5% of the largest logit, so tokens are checked up to near-ties.
    prompt = [5, 17, 42, 9, 100, 3]
    ref, got = forward_logits(deq, prompt), forward_logits(packed, prompt)
    assert float((got - ref).abs().max()) < 0.02 * float(ref.abs().max())
    assert assert_greedy_close(packed, deq, prompt, 8, margin=0.02) >= 6


@pytest.mark.parametrize("method,act_order", [("gptq", True), ("gptq", False), ("awq", False)])
def test_pack_model_takes_gptq_and_awq_results(method, act_order):
    """pack_model reads GPTQResults (codes re-derived from the fake-quantized weight) and AWQ's
    (q, scales, zeros, None) tuples; the quantizers leave the model dequantized, its twin."""
    from lab.models.reference import forward_logits

    spec = QuantSpec(4, 32)
    model, codes = tiny_calibrated(method, spec, act_order)
    packed = pack_model(copy.deepcopy(model), codes, spec)
    for name, result in codes.items():
        mod = packed.get_submodule(name)
        if method == "gptq":
            assert (mod.perm is not None) == (act_order and not torch.equal(result.g_idx, spec.group_index(mod.in_features)))
        w = model.get_submodule(name).weight.detach()
        x = torch.randn(4, mod.in_features)
        # the dequantized weight is the quantizer's own: the packed linear is it up to bf16 rounding
        assert float((mod(x) - x @ w.t()).abs().max()) < 2 ** -6 * float((x.abs() @ w.abs().t()).max())
    prompt = [11, 12, 13, 14, 15]
    ref, got = forward_logits(model, prompt), forward_logits(packed, prompt)
    assert float((got - ref).abs().max()) < 0.02 * float(ref.abs().max())
