"""The lab's AWQ against AutoAWQ's quantizer (AutoAWQ 0.2.9, deprecated but importable when installed with
--no-deps, as `make setup` does), on real SmolLM2 layers and their captured calibration inputs.

What is compared, and the differences that are explained rather than hidden:
- fake quantization: equal to AutoAWQ's `pseudo_quantize_tensor` on every group holding both signs. On a
  group of one sign the lab, like the GPTQ reference, widens the range to include 0 and AutoAWQ does not;
  such groups are counted, and the two grids are shown to differ exactly there;
- scale search (`_search_best_scale` on the up -> down and norm -> gate_up groups, duo scaling on and off):
  the same grid ratio and the same scales, once an AutoAWQ bug that only bites on CPU tensors is kept out
  of the way (its weight backup aliases the weights on a CPU; see `lab.quant.autoawq_peer`):
  `test_autoawq_cpu_aliasing_changes_duo_scaling_search` shows both halves. The attention
  group is not compared: AutoAWQ calls a Hugging Face attention module with its own keyword arguments,
  which the lab's attention does not take;
- clip search: with AutoAWQ's grid (its `n_grid=20, max_shrink=0.5` tries int(0.5 * 20) = 10 ratios,
  1 - i/20 for i < 10, so 1.0 down to 0.55), the same clipping thresholds. The lab's default grid is 20
  ratios from 1.0 to 0.5.
"""

import copy

import pytest
import torch
from torch import nn

from lab.quant import QuantSpec, fake_quantize
from lab.quant.awq import search_clip, search_scales
from lab.quant.layerwise import CalibrationPass

pytest.importorskip("awq.quantize.quantizer", reason="AutoAWQ is not installed (make setup installs it)")
from lab.quant import autoawq_peer as peer  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def layer_inputs(smollm, quant_prompt_ids):
    """Layer 2 of SmolLM2 and the inputs of its linears on the quantization prompts."""
    model, _ = smollm
    cal = CalibrationPass(model, quant_prompt_ids)
    for i in range(2):
        cal.advance(model.layers[i])
    layer = model.layers[2]
    names = ["mlp.gate_up_proj", "mlp.down_proj", "self_attn.o_proj"]
    inputs, _ = cal.capture(layer, names)
    return layer, {n: torch.cat(v) for n, v in inputs.items()}


def one_sign_groups(w: torch.Tensor, group: int) -> torch.Tensor:
    g = w.reshape(w.shape[0], -1, group)
    return (g.amin(-1) >= 0) | (g.amax(-1) <= 0)


@pytest.mark.parametrize("bits,group_size", [(4, 64), (4, 128), (3, 64), (8, 32)])
def test_fake_quant_equals_pseudo_quantize_tensor(smollm, bits, group_size):
    model, _ = smollm
    w = model.layers[5].mlp.down_proj.weight.detach().float()
    ref = peer.quantizer(bits, group_size).pseudo_quantize_tensor(w.clone())[0]
    ours = fake_quantize(w, QuantSpec(bits, group_size))
    assert not one_sign_groups(w, group_size).any()  # real weights: every group holds both signs
    assert torch.equal(ours, ref)
    sym = peer.quantizer(bits, group_size, zero_point=False).pseudo_quantize_tensor(w.clone())[0]
    assert torch.equal(fake_quantize(w, QuantSpec(bits, group_size, symmetric=True)), sym)


def test_fake_quant_differs_only_on_one_sign_groups():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(16, 128, generator=g)
    w[3, :64] = w[3, :64].abs() + 0.5  # a group of one sign, away from 0
    w[7, 64:] = -w[7, 64:].abs() - 0.5
    ours, ref = fake_quantize(w, QuantSpec(4, 64)), peer.quantizer(4, 64).pseudo_quantize_tensor(w.clone())[0]
    differs = (ours != ref).reshape(16, 2, 64).any(-1)
    assert torch.equal(differs, one_sign_groups(w, 64)) and differs.sum() == 2


@pytest.mark.parametrize("duo", [True, False])
def test_scale_search_down_proj_matches_autoawq(layer_inputs, duo):
    layer, inputs = layer_inputs
    x = inputs["mlp.down_proj"]
    down = peer.plain_linear(layer.mlp.down_proj)
    spec = QuantSpec(4, 64)
    ours, stats = search_scales(x, [down.weight], lambda ws: nn.functional.linear(x, ws[0]), spec,
                                n_grid=20, duo_scaling=duo)
    theirs = peer.search_scales(x, [peer.copying_state_dict(down)], duo_scaling=duo)
    assert torch.allclose(ours, theirs.float(), rtol=1e-5, atol=0), (stats.alpha, stats.losses)


@pytest.mark.parametrize("duo", [True, False])
def test_scale_search_gate_up_matches_autoawq(layer_inputs, duo):
    """The inspected block is the whole MLP; AutoAWQ scales the fused gate_up linear as one."""
    layer, inputs = layer_inputs
    x = inputs["mlp.gate_up_proj"]
    mlp = copy.deepcopy(layer.mlp)
    mlp.gate_up_proj = peer.plain_linear(layer.mlp.gate_up_proj)
    mlp.down_proj = peer.plain_linear(layer.mlp.down_proj)
    spec = QuantSpec(4, 64)
    probe = copy.deepcopy(mlp)

    def block(ws):
        probe.gate_up_proj.weight.data.copy_(ws[0])
        return probe(x)

    ours, stats = search_scales(x, [mlp.gate_up_proj.weight], block, spec, n_grid=20, duo_scaling=duo)
    theirs = peer.search_scales(x, [mlp.gate_up_proj], peer.copying_state_dict(mlp), duo_scaling=duo)
    assert torch.allclose(ours, theirs.float(), rtol=1e-5, atol=0), (stats.alpha, stats.losses)


def test_autoawq_cpu_aliasing_changes_duo_scaling_search(layer_inputs):
    layer, inputs = layer_inputs
    x = inputs["mlp.down_proj"]
    down = peer.plain_linear(layer.mlp.down_proj)
    ours, _ = search_scales(x, [down.weight], lambda ws: nn.functional.linear(x, ws[0]), QuantSpec(4, 64),
                            n_grid=20, duo_scaling=True)
    as_shipped = peer.search_scales(x, [copy.deepcopy(down)], duo_scaling=True)
    fixed = peer.search_scales(x, [peer.copying_state_dict(copy.deepcopy(down))], duo_scaling=True)
    assert torch.allclose(fixed, ours, rtol=1e-5, atol=0)
    assert not torch.allclose(as_shipped, ours, rtol=1e-2, atol=0)


def test_clip_search_matches_autoawq_on_its_grid(layer_inputs):
    layer, inputs = layer_inputs
    x = inputs["self_attn.o_proj"][:512]  # <= 512 tokens: both use every token, no subsampling
    w = layer.self_attn.o_proj.weight.detach().float().contiguous()
    spec = QuantSpec(4, 64)
    _, ratios, _ = search_clip(w, x, spec, n_grid=10, max_shrink=0.45, n_tokens=512)
    theirs = peer.clip_thresholds(w.clone(), x)
    absmax = w.reshape(w.shape[0], -1, 64).abs().amax(-1)
    agree = torch.isclose(ratios * absmax, theirs, rtol=1e-6, atol=0)
    # The ratios are 1 - i/20 there and linspace(1, 0.55, 10) here, equal up to an ulp, which can
    # flip a near-tie; anything beyond a rare tie is a real difference.
    assert agree.float().mean() > 0.995, agree.float().mean()
