"""AWQ's screened scale search (lab.quant.awq_screen): the screens estimate the exact loss closely, the
confirmation evaluates exactly whatever a screen cannot rule out (even a screen worse than it claims), and
on real SmolLM2 layers the screened search chooses, and the model ends, exactly as the exact search does."""

import copy

import pytest
import torch
import torch.nn.functional as F

from lab.quant import QuantSpec, awq
from lab.quant.awq import activation_mean, awq_quantize_model, awq_scales, scaled_fake_quantize, search_scales
from lab.quant.awq_screen import AttentionScreen, LinearScreen, MLPScreen, confirm
from lab.quant.layerwise import CalibrationPass

pytestmark = pytest.mark.usefixtures("one_thread")


def test_confirm_evaluates_what_the_screen_cannot_rule_out():
    exact = [1.0, 0.99, 1.2, 1.5, 0.995]
    calls = []

    def evaluate(k):
        calls.append(k)
        return exact[k]

    # Within rtol: the best estimate, then the points within the margin of the best exact loss.
    assert confirm([1.0005, 0.9895, 1.2, 1.5, 0.9947], evaluate, rtol=1e-3) == {1: 0.99}
    calls.clear()
    checked = confirm([1.02, 0.9895, 1.2, 1.5, 0.9903], evaluate, rtol=1e-3)
    assert calls == [1, 4] and min(checked, key=checked.get) == 1
    # A screen 5% off while claiming 0.1%: the error seen at its best point widens the margin.
    calls.clear()
    checked = confirm([0.95, 1.04, 1.2, 1.5, 1.06], evaluate, rtol=1e-3)
    assert calls[0] == 0 and min(checked, key=checked.get) == 1
    # NaN estimates are never ruled out.
    assert 3 in confirm([1.0, 1.2, 1.3, float("nan"), 1.4], evaluate, rtol=1e-3)


@pytest.mark.parametrize("spec", [QuantSpec(4, 64), QuantSpec(3, 128)])
def test_linear_screen_is_the_exact_loss(smollm, layer3_inputs, spec):
    model, _ = smollm
    x, w = layer3_inputs["down"], model.layers[3].mlp.down_proj.weight.detach().float()
    screen = LinearScreen(x, w)
    for alpha in (0.0, 0.3, 0.8):
        wq = scaled_fake_quantize(w, awq_scales(activation_mean(x), alpha), spec)
        exact = float(F.mse_loss(F.linear(x, wq), F.linear(x, w)))
        assert screen([wq]) == pytest.approx(exact, rel=LinearScreen.rtol)


def test_mlp_screen_is_close_and_its_reference_exact(smollm, layer3_inputs):
    model, _ = smollm
    mlp, x, spec = model.layers[3].mlp, layer3_inputs["gate_up"], QuantSpec(4, 64)
    screen = MLPScreen(mlp, x)
    ref = mlp(x)
    assert torch.equal(screen.reference(), ref)
    w = mlp.gate_up_proj.weight.detach().float()
    for alpha in (0.0, 0.3, 0.8):
        wq = scaled_fake_quantize(w, awq_scales(activation_mean(x), alpha), spec)
        exact = float(F.mse_loss(awq._with_weights([mlp.gate_up_proj], [wq], lambda: mlp(x)), ref))
        # Measured 2e-4..4e-4 on these 63 tokens (~1e-4 with 32 x 512).
        assert screen([wq]) == pytest.approx(exact, rel=MLPScreen.rtol)
    assert torch.equal(mlp.gate_up_proj.weight, model.layers[3].mlp.gate_up_proj.weight)


def test_attention_screen_is_close(smollm, quant_prompt_ids):
    """Over the calibration pass's groups of equal-length sequences (several here), as the search runs it."""
    model, _ = smollm
    cal, layer, spec = CalibrationPass(model, quant_prompt_ids), model.layers[0], QuantSpec(4, 64)
    inputs, _ = cal.capture(layer, ["self_attn.qkv_proj"])
    x_in = inputs["self_attn.qkv_proj"]
    assert len(x_in) > 1
    x, attn = torch.cat(x_in), layer.self_attn
    screen = AttentionScreen(attn, lambda xs: cal.attention(layer, xs), x, [v.shape[0] for v in x_in])
    ref = cal.attention(layer, x_in)
    w = attn.qkv_proj.weight.detach().float()
    for alpha in (0.0, 0.3, 0.8):
        wq = scaled_fake_quantize(w, awq_scales(activation_mean(x), alpha), spec)
        exact = float(F.mse_loss(awq._with_weights([attn.qkv_proj], [wq], lambda: cal.attention(layer, x_in)), ref))
        assert screen([wq]) == pytest.approx(exact, rel=AttentionScreen.rtol)


@pytest.mark.parametrize("duo", [False, True])
@pytest.mark.parametrize("which", ["gate_up", "down"])
def test_screened_search_chooses_as_the_exact_one(smollm, layer3_inputs, which, duo):
    model, _ = smollm
    mlp, spec = model.layers[3].mlp, QuantSpec(4, 64)
    x = layer3_inputs[which]
    if which == "gate_up":
        lin, screen, block = mlp.gate_up_proj, MLPScreen(mlp, x), lambda: mlp(x)
    else:
        lin, screen, block = mlp.down_proj, LinearScreen(x, mlp.down_proj.weight), lambda: mlp.down_proj(x)
    search = lambda **kw: search_scales(x, [lin.weight], lambda ws: awq._with_weights([lin], ws, block), spec,
                                        duo_scaling=duo, **kw)
    exact_scales, exact = search()
    scales, screened = search(screen=screen)
    assert torch.equal(scales, exact_scales) and screened.alpha == exact.alpha
    assert screened.loss_awq == exact.loss_awq  # the chosen point is always evaluated exactly
    agree = sum(a == b for a, b in zip(screened.losses, exact.losses))
    assert 1 <= agree < len(exact.losses)  # the others are the screen's estimates


def test_screening_leaves_the_quantized_model_unchanged(smollm, quant_prompt_ids, monkeypatch):
    model, _ = smollm
    spec, layers = QuantSpec(4, 128), [0, 1]
    screened, exact = copy.deepcopy(model), copy.deepcopy(model)
    codes_screened, codes_exact = {}, {}
    stats = awq_quantize_model(screened, quant_prompt_ids, spec, layers=layers, progress=False,
                               results=codes_screened)
    monkeypatch.setattr(awq, "_screen", lambda *_: None)  # every group searched exactly
    stats_exact = awq_quantize_model(exact, quant_prompt_ids, spec, layers=layers, progress=False,
                                     results=codes_exact)
    for name, p in screened.state_dict().items():
        assert torch.equal(p, exact.state_dict()[name]), name
    for name, codes in codes_exact.items():
        assert all(torch.equal(a, b) for a, b in zip(codes[:3], codes_screened[name][:3])), name
    for layer, s in stats.items():
        assert {g: v.alpha for g, v in s.groups.items()} == {g: v.alpha for g, v in stats_exact[layer].groups.items()}
