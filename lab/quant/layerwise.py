"""True-sequential calibration: the decoder layers are visited in order, and each layer sees the
hidden states produced by the layers before it *as already quantized*, so later layers are
calibrated on the errors they will really receive (GPTQ's and AWQ's reference implementations
both work this way). Each calibration sequence is run on its own, with a fresh contiguous cache.
"""

from __future__ import annotations

import torch
from torch import nn

from lab.models.reference import ContiguousKVCache


class CalibrationPass:
    """Hidden states entering the current layer, one [T, hidden] tensor per calibration sequence."""

    def __init__(self, model: nn.Module, calib_token_ids: list[list[int]], layers: list[int] | None = None):
        if not calib_token_ids or any(len(ids) == 0 for ids in calib_token_ids):
            raise ValueError("calib_token_ids must hold at least one non-empty sequence")
        self.n_layers = len(model.layers)
        self.chosen = sorted(set(range(self.n_layers) if layers is None else layers))
        if not self.chosen or self.chosen[0] < 0 or self.chosen[-1] >= self.n_layers:
            raise ValueError(f"layers={layers!r} must be indices in [0, {self.n_layers})")
        device = model.embed_tokens.weight.device
        self.hidden, self.ropes = [], []
        for ids in calib_token_ids:
            self.hidden.append(model.embed_tokens(torch.tensor(ids, device=device)))
            self.ropes.append(model.rope(torch.arange(len(ids), device=device)))

    def run(self, layer: nn.Module) -> list[torch.Tensor]:
        """The layer's outputs for every sequence (the state is left unchanged)."""
        return [layer(x, rope, ContiguousKVCache(self.n_layers)) for x, rope in zip(self.hidden, self.ropes)]

    def advance(self, layer: nn.Module) -> None:
        """Move to the next layer: its inputs are this layer's outputs, with this layer as it now is."""
        self.hidden = self.run(layer)

    def capture(self, layer: nn.Module, names: list[str]) -> dict[str, list[torch.Tensor]]:
        """Per-sequence inputs of the named linears of `layer`, from one pass over the calibration set."""
        seen = {name: [] for name in names}
        hooks = [layer.get_submodule(name).register_forward_hook(
            lambda _m, args, _out, acc=seen[name]: acc.append(args[0].detach())) for name in names]
        try:
            self.run(layer)
        finally:
            for h in hooks:
                h.remove()
        return seen

    def attention(self, layer: nn.Module, inputs: list[torch.Tensor]) -> torch.Tensor:
        """The attention block's output for per-sequence (normed) inputs, concatenated over sequences."""
        return torch.cat([layer.self_attn(x, rope, ContiguousKVCache(self.n_layers))
                          for x, rope in zip(inputs, self.ropes)])
