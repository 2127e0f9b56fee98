"""Static KV scales from calibration data, and a contiguous cache that stores K/V through a format.

Static granularities (`per-tensor`, `per-head` in `lab.kv.format`) need one scale per layer (and head) fixed
before serving. vLLM computes its FP8 `k_scale`/`v_scale` from calibration data (llm-compressor) or falls back
to 1.0, which its documentation warns may degrade accuracy. `calibrate_kv_absmax` runs the model over
calibration sequences and records, per layer, K and V head by head: the maximum |x| or a percentile of |x|
(a percentile ignores the rarest outliers at the price of saturating them). `KVScales` turns those into the
scales of a format and saves them beside a model as safetensors.

`QuantizedContiguousKVCache` is `ContiguousKVCache` with every key and value read back through a format (round
trip via `lab.kv.format.fake_quantize`), optionally before RoPE, a window and filling key groups read exactly:
the reference the paged quantized cache is checked against, and the tool of the position-error study.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from lab.models.attention import AttentionLayout, causal_attention, check_plain, partly_exact_attention
from lab.models.llama import apply_rope

from .format import KVCacheFormat, exact_mask, fake_quantize, fp8_max, static_scale

METHODS = ("max", "percentile")


class _Recorder:
    """An `AttentionContext` that attends like `ContiguousKVCache` (one sequence, one forward) and keeps
    |K| and |V| statistics per layer and head; keys also before RoPE when asked."""

    def __init__(self, n_layers: int, rope: tuple[torch.Tensor, torch.Tensor] | None, method: str, percentile: float,
                 layout: AttentionLayout | None = None):
        self.rope, self.method, self.q, self.layout = rope, method, percentile / 100, layout or AttentionLayout()
        self.stats: dict[str, list[list[torch.Tensor]]] = {k: [[] for _ in range(n_layers)] for k in ("k", "v", "k_pre")}

    def _stat(self, x: torch.Tensor) -> torch.Tensor:  # [T, H, D] -> [H]
        a = x.float().abs().transpose(0, 1).reshape(x.shape[1], -1)
        return a.amax(1) if self.method == "max" else torch.quantile(a, self.q, dim=1)

    def attend(self, layer, q, k, v):
        self.stats["k"][layer].append(self._stat(k))
        self.stats["v"][layer].append(self._stat(v))
        if self.rope is not None:
            cos, signed_sin = self.rope
            self.stats["k_pre"][layer].append(self._stat(apply_rope(k, cos, -signed_sin)))
        return causal_attention(q, k, v, self.layout.window(layer), self.layout.softcap)


@dataclass
class KVScales:
    """Per-layer, per-KV-head |x| statistics of keys (post- and pre-RoPE) and values: [layers, heads]."""

    k: torch.Tensor
    v: torch.Tensor
    k_pre_rope: torch.Tensor
    method: str
    percentile: float | None

    @classmethod
    def unit(cls, model, fmt: KVCacheFormat) -> KVScales:
        """Statistics that give `fmt` a static scale of exactly 1.0, vLLM's default when no k_scale/v_scale
        is given (for fp8 e4m3, an |x| of 448 maps to the top): the uncalibrated baseline."""
        device = model.embed_tokens.weight.device
        top = (static_scale(torch.ones(1, device=device), fmt).reciprocal() if not fmt.is_fp8
               else fp8_max(fmt.dtype))
        shape = (len(model.layers), model.config.num_key_value_heads)
        full = torch.full(shape, float(top), device=device)
        return cls(full, full.clone(), full.clone(), "unit", None)

    def scale(self, fmt: KVCacheFormat, layer: int, role: str) -> torch.Tensor:
        """The static scale of `fmt` for `layer` and role "k" or "v": per-tensor the max over heads."""
        if not fmt.static:
            raise ValueError(f"{fmt.granularity} scales are dynamic; static scales are for per-tensor/per-head")
        stat = {"k": self.k_pre_rope if fmt.pre_rope else self.k, "v": self.v}[role][layer]
        return static_scale(stat.amax().reshape(1) if fmt.granularity == "per-tensor" else stat, fmt)

    def save(self, path: str | Path) -> Path:
        from safetensors.torch import save_file

        path = Path(path)
        meta = {"method": self.method, "percentile": str(self.percentile)}
        save_file({"k": self.k.contiguous(), "v": self.v.contiguous(), "k_pre_rope": self.k_pre_rope.contiguous()},
                  path, metadata=meta)
        return path

    @classmethod
    def load(cls, path: str | Path) -> KVScales:
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata()
            t = {k: f.get_tensor(k) for k in ("k", "v", "k_pre_rope")}
        pct = None if meta["percentile"] == "None" else float(meta["percentile"])
        return cls(t["k"], t["v"], t["k_pre_rope"], meta["method"], pct)


@torch.inference_mode()
def calibrate_kv_absmax(model, calib_token_ids: list[list[int]], method: str = "max",
                        percentile: float = 99.9) -> KVScales:
    """|K| and |V| statistics per layer and head over the calibration sequences (max over sequences of
    each sequence's max or percentile)."""
    if method not in METHODS:
        raise ValueError(f"method {method!r} is not one of {METHODS}")
    if not 0 < percentile <= 100:
        raise ValueError(f"percentile={percentile} must be in (0, 100]")
    if not calib_token_ids or any(len(ids) == 0 for ids in calib_token_ids):
        raise ValueError("calib_token_ids must hold at least one non-empty sequence")
    n = len(model.layers)
    device = model.embed_tokens.weight.device
    stats = {"k": [], "v": [], "k_pre": []}
    for ids in tqdm(calib_token_ids, desc="KV calibration", disable=len(calib_token_ids) < 4):
        pos = torch.arange(len(ids), device=device)
        rec = _Recorder(n, model.rope(pos), method, percentile, model.attention_layout)
        model(torch.tensor(ids, device=device), pos, rec)
        for key in stats:
            stats[key].append(torch.stack([torch.stack(layer).amax(0) for layer in rec.stats[key]]))
    k, v, k_pre = (torch.stack(stats[key]).amax(0) for key in ("k", "v", "k_pre"))
    return KVScales(k, v, k_pre, method, percentile if method == "percentile" else None)


def quantize_keys(model, k: torch.Tensor, fmt: KVCacheFormat, scale=None, start: int = 0) -> torch.Tensor:
    """Keys [T, heads, d] (after RoPE, at positions start ...) read back through `fmt`; with `fmt.pre_rope`
    un-rotated, quantized and rotated back (the same as quantizing before RoPE and rotating on read)."""
    if not fmt.pre_rope:
        return fake_quantize(k, fmt, "k", scale)
    cos, signed_sin = model.rope(torch.arange(start, start + k.shape[0], device=k.device))
    return apply_rope(fake_quantize(apply_rope(k, cos, -signed_sin), fmt, "k", scale), cos, signed_sin)


class QuantizedContiguousKVCache:
    """`ContiguousKVCache` whose keys and values are read back through `fmt`: the reference for the paged
    quantized cache, and the tool of the KV study and of `lab eval --kv-cache-dtype`.

    It keeps the exact K/V and their read-back; per-token and static formats quantize each token once, and
    per-channel key groups (multiples of `fmt.token_group` from position 0) are quantized again as they fill,
    so writing chunk by chunk equals writing all at once. A window and a group still filling are read exactly,
    per query (`lab.kv.format.exact_mask`). `roles` "k" or "v" quantizes only keys or only values (which of the
    two is sensitive). Attention is `partly_exact_attention`, which is SDPA's where nothing is read exactly, as the
    engine computes it (so its rounding, and where a quantization boundary falls, match the engine's)."""

    def __init__(self, model, fmt: KVCacheFormat, scales: KVScales | None = None, roles: str = "kv"):
        if fmt.static and scales is None:
            raise ValueError(f"{fmt.granularity} needs calibrated KVScales (or KVScales.unit for vLLM's 1.0)")
        if roles not in ("kv", "k", "v"):
            raise ValueError(f"roles={roles!r}: quantize 'kv' (both), 'k' (keys only) or 'v' (values only)")
        self.model, self.fmt, self.scales, self.roles = model, fmt, scales, roles
        n = len(model.layers)
        self.exact = {r: [None] * n for r in "kv"}
        self.read = {r: [None] * n for r in "kv"}

    def __len__(self) -> int:
        return 0 if self.exact["k"][0] is None else self.exact["k"][0].shape[0]

    def _read_back(self, layer: int, role: str, x: torch.Tensor, start: int) -> torch.Tensor:
        """The read-back of all tokens so far: the previous ones kept, from `start` on (re)quantized."""
        scale = self.scales.scale(self.fmt, layer, role) if self.fmt.static else None
        new = quantize_keys(self.model, x[start:], self.fmt, scale, start) if role == "k" else \
            fake_quantize(x[start:], self.fmt, "v", scale)
        old = self.read[role][layer]
        return new if start == 0 else torch.cat([old[:start], new])

    def attend(self, layer, q, k, v):
        start = 0 if self.exact["k"][layer] is None else self.exact["k"][layer].shape[0]
        end = start + k.shape[0]
        check_plain(self.model.attention_layout, layer, end, "the quantized contiguous KV cache")
        exact, read, masks = {}, {}, {}
        q_pos, k_pos = torch.arange(start, end, device=q.device), torch.arange(end, device=q.device)
        for role, x in (("k", k), ("v", v)):
            old = self.exact[role][layer]
            exact[role] = x if old is None else torch.cat([old, x])
            if role in self.roles:
                regroup = role == "k" and self.fmt.granularity_of("k") == "per-channel"
                first = start // self.fmt.token_group * self.fmt.token_group if regroup else start
                read[role] = self._read_back(layer, role, exact[role], first)
                masks[role] = exact_mask(self.fmt, role, q_pos[:, None], k_pos[None, :])
            else:
                read[role], masks[role] = exact[role], None
            self.exact[role][layer], self.read[role][layer] = exact[role], read[role]
        return partly_exact_attention(q, read["k"], read["v"], exact["k"], exact["v"], masks["k"], masks["v"])
