"""AWQ (lab.quant.awq): scales of 1 are RTN, folding the scales keeps the float model, the chosen
scales and the clip beat RTN on a real SmolLM2 layer, and two AWQ layers move the logits less than RTN."""

import copy

import pytest
import torch
import torch.nn.functional as F

from lab.eval.scores import score_sequences
from lab.quant import QuantSpec, fake_quantize
from lab.quant.awq import (activation_mean, awq_quantize_model, awq_scales, fold_scales, scaled_fake_quantize,
                           search_clip, search_scales, weight_mean)

# Dozens of small quantize/matmul steps: with a second thread contending for the two cores they ran
# far slower than on one (see conftest.one_thread).
pytestmark = pytest.mark.usefixtures("one_thread")



@pytest.mark.parametrize("spec", [QuantSpec(4, 128), QuantSpec(3, 64, True), QuantSpec(4, None)])
def test_unit_scales_are_rtn(spec):
    torch.manual_seed(0)
    w, x = torch.randn(40, 200), torch.randn(30, 200) * torch.rand(200) * 3
    assert torch.equal(awq_scales(activation_mean(x), 0.0), torch.ones(200))
    assert torch.equal(scaled_fake_quantize(w, torch.ones(200), spec), fake_quantize(w, spec))
    scales, stats = search_scales(x, [w], lambda ws: x @ ws[0].t(), spec, n_grid=10)
    rtn_loss = float(((x @ fake_quantize(w, spec).t() - x @ w.t()) ** 2).mean())
    assert stats.loss_rtn == pytest.approx(rtn_loss, rel=1e-6) and stats.losses[0] == stats.loss_rtn
    assert stats.loss_awq == min(stats.losses) <= stats.loss_rtn
    assert stats.alpha == stats.losses.index(stats.loss_awq) / 10
    # Normalised by sqrt(max * min): the scales straddle 1.
    for alpha in (0.3, 0.9):
        s = awq_scales(activation_mean(x), alpha, weight_mean([w], spec))
        assert float(s.max() * s.min()) == pytest.approx(1.0, rel=1e-5)


def test_folding_scales_keeps_the_float_layer(smollm, quant_prompt_ids):
    from lab.models.reference import ContiguousKVCache

    model, tok = smollm
    layer = copy.deepcopy(model.layers[3])
    ids = torch.tensor(quant_prompt_ids[0])
    x = model.embed_tokens(ids)
    rope = model.rope(torch.arange(len(ids)))
    n = len(model.layers)
    with torch.inference_mode():
        ref = layer(x, rope, ContiguousKVCache(n))
    torch.manual_seed(0)
    hidden, inter = layer.mlp.down_proj.out_features, layer.mlp.down_proj.in_features
    with torch.no_grad():
        fold_scales(layer.input_layernorm, [layer.self_attn.qkv_proj], torch.randn(hidden).mul(0.5).exp())
        fold_scales(layer.post_attention_layernorm, [layer.mlp.gate_up_proj], torch.randn(hidden).mul(0.5).exp())
        fold_scales(layer.mlp.gate_up_proj, [layer.mlp.down_proj], torch.randn(inter).mul(0.5).exp(),
                    slice(inter, 2 * inter))
    assert layer.mlp.down_proj.weight.t().is_contiguous()  # the transposed layout is kept
    assert not torch.equal(layer.mlp.down_proj.weight, model.layers[3].mlp.down_proj.weight)
    with torch.inference_mode():
        out = layer(x, rope, ContiguousKVCache(n))
    assert float((out - ref).abs().max() / ref.abs().max()) < 1e-5


def _mlp(x, gate_up, down):
    gate, up = F.linear(x, gate_up).chunk(2, dim=-1)
    return F.linear(F.silu(gate) * up, down)


@pytest.mark.parametrize("spec", [QuantSpec(4, 128), QuantSpec(3, 64)])
@pytest.mark.parametrize("duo", [False, True])
def test_awq_scales_beat_rtn_on_real_layer(smollm, layer3_inputs, spec, duo):
    model, _ = smollm
    mlp = model.layers[3].mlp
    x, w_gu, w_down = layer3_inputs["gate_up"], mlp.gate_up_proj.weight.detach(), mlp.down_proj.weight.detach()
    ref = _mlp(x, w_gu, w_down)
    scales, stats = search_scales(x, [w_gu], lambda ws: _mlp(x, ws[0], w_down), spec, duo_scaling=duo)
    # The loss, recomputed the deployed way: x / s (folded into the norm) into the rounded W diag(s).
    err = lambda out: float(((out - ref) ** 2).mean())
    rtn = err(_mlp(x, fake_quantize(w_gu, spec), w_down))
    awq = err(_mlp(x / scales, fake_quantize(w_gu * scales, spec), w_down))
    assert stats.loss_rtn == pytest.approx(rtn, rel=1e-5) and awq == pytest.approx(stats.loss_awq, rel=1e-3)
    # Measured AWQ/RTN loss: 0.94 (duo 0.94) at w4 g128, 0.90 (duo 0.89) at w3 g64; alpha = 0 is RTN.
    assert awq < 0.97 * rtn and 0 < stats.alpha < 1, (awq, rtn, stats.alpha)


@pytest.mark.parametrize("spec", [QuantSpec(4, 128), QuantSpec(3, 64), QuantSpec(4, None, True)])
@pytest.mark.parametrize("which", ["gate_up", "down"])
def test_clip_never_increases_the_error(smollm, layer3_inputs, spec, which):
    model, _ = smollm
    mlp = model.layers[3].mlp
    lin = mlp.gate_up_proj if which == "gate_up" else mlp.down_proj
    w, x = lin.weight.detach().float(), layer3_inputs[which]
    clipped, ratios, stats = search_clip(w, x, spec)
    assert ratios.shape == (w.shape[0], spec.num_groups(w.shape[1]))
    assert float(ratios.min()) >= 0.5 - 1e-6 and float(ratios.max()) <= 1.0
    assert stats.err_after <= stats.err_before
    # The objective is per (row, group); the whole output error also did not rise here.
    err = lambda wq: float(((x @ wq.t() - x @ w.t()) ** 2).mean())
    assert err(fake_quantize(clipped, spec)) <= err(fake_quantize(w, spec))
    assert torch.equal(search_clip(w, x, spec, max_shrink=0.0, n_grid=1)[0], w)  # ratio 1 only: no clip



@pytest.mark.parametrize("spec", [QuantSpec(4, 64), QuantSpec(3, 128, True), QuantSpec(4, None)])
@pytest.mark.parametrize("tokens", [40, 300])  # fewer tokens than a group's columns, and more (the Gram form)
def test_clip_ratio_is_the_direct_objectives_argmin(spec, tokens):
    """The search's choice per (row, group) against mean over tokens of (x_g (Q(clamp(w_g)) - w_g)^T)^2 taken
    directly, in float64, on a weight whose last group is ragged (200 = 3 x 64 + 8 columns)."""
    torch.manual_seed(0)
    w, x = torch.randn(48, 200) * 0.02, torch.randn(tokens, 200) * torch.rand(200) * 3
    clipped, ratios, stats = search_clip(w, x, spec, n_grid=8, max_shrink=0.4)
    grid = torch.linspace(1.0, 0.6, 8).tolist()
    width = spec.group_width(200)
    errs = []
    for c0 in range(0, 200, width):
        wg, xg = w[:, c0:c0 + width], x[:, c0:c0 + width].double()
        m, per_ratio = wg.abs().amax(1, keepdim=True), []
        for r in grid:
            q = fake_quantize(wg.clamp(-r * m, r * m), QuantSpec(spec.bits, None, spec.symmetric))
            per_ratio.append((xg @ (q - wg).double().t()).pow(2).mean(0))
        errs.append(torch.stack(per_ratio, 1))  # [rows, ratios]
    errs = torch.stack(errs, 1)  # [rows, groups, ratios]
    assert stats.err_before == pytest.approx(float(errs[..., 0].sum()), rel=1e-5)
    assert stats.err_after == pytest.approx(float(errs.amin(-1).sum()), rel=1e-5)
    best = torch.tensor(grid)[errs.argmin(-1)].float()
    top2 = errs.topk(2, dim=-1, largest=False).values
    clear = (top2[..., 1] - top2[..., 0]) > 1e-5 * top2[..., 0]  # not a tie within float32's rounding
    assert clear.float().mean() > 0.9 and torch.equal(ratios[clear], best[clear])
    absmax = torch.stack([w[:, c0:c0 + width].abs().amax(1) for c0 in range(0, 200, width)], 1)
    m = (ratios * absmax).repeat_interleave(width, 1)[:, :200]
    assert torch.equal(clipped, w.clamp(-m, m))

def test_awq_model_first_layers_beats_rtn_on_logits(smollm, quant_prompt_ids, rtn_copy):
    model, tok = smollm
    spec, layers = QuantSpec(4, 128), [0, 1]
    calib = quant_prompt_ids
    probe = tok.encode("The quick brown fox jumps over the lazy dog because")

    def kl_to_float(quantized):
        return score_sequences(model, quantized, [probe]).kl_mean().value

    rtn = rtn_copy(model, layers, spec)
    awq = copy.deepcopy(model)
    stats = awq_quantize_model(awq, calib, spec, layers=layers, progress=False)
    assert sorted(stats) == ["layers.0", "layers.1"]
    for s in stats.values():
        assert sorted(s.groups) == ["input_layernorm->qkv_proj", "post_attention_layernorm->gate_up_proj",
                                    "up->down_proj"]
        assert "grouped-query" in s.skipped["v->o_proj"]
        assert all(g.loss_awq <= g.loss_rtn for g in s.groups.values())
        assert all(c.err_after <= c.err_before for c in s.clip.values())
        assert s.layer_loss_awq < s.layer_loss_rtn and s.seconds > 0
    assert awq.layers[0].mlp.down_proj.weight.t().is_contiguous()
    assert torch.equal(awq.layers[2].mlp.down_proj.weight, model.layers[2].mlp.down_proj.weight)
    assert not torch.equal(awq.layers[0].input_layernorm.weight, model.layers[0].input_layernorm.weight)
    assert len(torch.unique(awq.layers[1].mlp.down_proj.weight[0, :128])) <= 16  # on a 4-bit grid
    # Measured KL on this probe: RTN 0.167, AWQ 0.093 (w4 g128, clip on). At w3 g64 AWQ did not
    # beat RTN on this probe (0.50 vs 0.50 with clip, 0.75 without), though its layer MSE was lower.
    kl_rtn, kl_awq = kl_to_float(rtn), kl_to_float(awq)
    assert 0 < kl_awq < 0.8 * kl_rtn, (kl_awq, kl_rtn)
