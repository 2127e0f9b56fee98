"""`lab.quant.gguf_grids`: llama.cpp's Q4_0, Q4_1 and Q8_0 block grids, against the `gguf` package's own
quantizers and on the embedded model, whose decoder linears were stored as Q4_1 (issue 39: its "unquantized"
baseline is already 4-bit, so re-quantizing it on its own grid must cost exactly nothing)."""

import numpy as np
import pytest
import torch
import torch.nn as nn

from lab.quant.gguf_grids import already_quantized, distinct_per_block, fake_quantize_gguf, quantize_gguf
from lab.quant.rtn import QuantSpec, fake_quantize

QTYPES = {"q4_0": "Q4_0", "q4_1": "Q4_1", "q8_0": "Q8_0"}


@pytest.mark.parametrize("grid", sorted(QTYPES))
def test_the_grids_match_the_gguf_packages_quantizers(grid):
    from gguf.quants import GGMLQuantizationType, dequantize, quantize

    w = torch.randn(48, 256, generator=torch.Generator().manual_seed(0)) * 0.05
    w[3, :32] = 0.0  # an all-zero block: scale 0, every code decodes to 0
    qtype = getattr(GGMLQuantizationType, QTYPES[grid])
    want = dequantize(quantize(w.numpy(), qtype), qtype)
    assert np.array_equal(fake_quantize_gguf(w, grid).numpy(), want)


def test_codes_stay_on_the_grid_and_bad_shapes_are_refused():
    w = torch.randn(8, 64)
    q, d, m = quantize_gguf(w, "q4_1")
    assert q.min() >= 0 and q.max() <= 15 and d.dtype == torch.float16 and m.shape == (8, 2)
    assert (q.reshape(8, 2, 32).amin(-1) == 0).all() and (q.reshape(8, 2, 32).amax(-1) == 15).all()
    with pytest.raises(ValueError, match="multiple of 32"):
        quantize_gguf(torch.randn(8, 40), "q4_1")
    with pytest.raises(ValueError, match="'q5_k' is not one of"):
        quantize_gguf(w, "q5_k")


def test_the_embedded_models_linears_are_exactly_q4_1(smollm):
    """Every decoder linear of the embedded SmolLM2 (the lab fuses q/k/v and gate/up: 4 a layer, the GGUF's 7 a layer
    inside them) comes back bit for bit from Q4_1, the grid it shipped on, while the lab's RTN at the same bits and
    group (integer zero point, range widened to include 0) does not."""
    model, _ = smollm
    linears = [(n, m.weight) for n, m in model.layers.named_modules() if isinstance(m, nn.Linear)]
    assert len(linears) == 4 * len(model.layers) == 120
    for name, w in linears:
        assert torch.equal(fake_quantize_gguf(w, "q4_1"), w.float()), name
    w = linears[0][1]
    rtn = fake_quantize(w, QuantSpec(4, 32))
    assert not torch.equal(rtn, w) and (rtn - w).norm() / w.norm() > 0.01  # RTN re-rounds it off its own grid


def test_an_already_quantized_model_is_detected_and_a_continuous_one_is_not(smollm):
    model, _ = smollm
    found = already_quantized(model)
    assert found.detected and found.bits == 4 and found.max_distinct <= 16 and found.linears == 120
    assert "already quantized" in str(found)

    class Tiny(nn.Module):  # random continuous weights, as a 16-bit checkpoint has
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.layers = nn.ModuleList(nn.Sequential(nn.Linear(64, 96), nn.Linear(96, 64)) for _ in range(2))

    fresh = already_quantized(Tiny())
    assert not fresh.detected and fresh.bits is None and fresh.max_distinct == 32
    assert "not detected" in str(fresh)
    assert distinct_per_block(torch.tensor([[1.0, 1.0, 2.0, 3.0]]), block=2).tolist() == [[1, 2]]
