"""How much error a quantized KV-cache format adds, position by position, on a real model.

Two measures for any format of `lab.kv` (K and V together, or keys only, or values only):

- `attention_error_by_position`: every layer's attention output with quantized K/V against exact K/V, on the
  exact model's own queries, keys and values (so the error is the cache's alone, not compounded through
  layers), as a relative error per query position;
- `kl_by_position`: the end-to-end effect, next-token KL(exact || quantized cache) per position, the model
  run once over the whole text with every layer's K/V stored through the format (errors compound through
  the layers here; `kl_by_position_of` measures several formats on one pass of the exact logits);
- in both, a full-precision window and a per-channel key group still filling are read exactly per query,
  as when that token is decoded (`lab.kv.format.exact_mask`), the same rule as the paged engine's.

`record` runs the exact model once and keeps what both measures compare against.
"""

from __future__ import annotations

import torch

from lab.models.attention import AttentionLayout, causal_attention, check_plain, partly_exact_attention
from lab.kv.format import KVCacheFormat, exact_mask, fake_quantize
from lab.kv.calibration import KVScales, QuantizedContiguousKVCache, quantize_keys


class _Recorder:
    """An `AttentionContext` (one sequence, one forward) that keeps every layer's q, k, v and output; the
    forward's result is the exact model's hidden states (`hidden`, set by `record`). Attention is SDPA's, as in
    the engine and in a quantized cache that reads nothing exactly (`partly_exact_attention`). It used to run blocked,
    said to be ~3x faster than SDPA on a CPU; on the EPYC of 7 December an 8K-token forward through an int8 cache
    took 28 s through SDPA against 42 s blocked."""

    def __init__(self, n_layers: int, layout: AttentionLayout | None = None):
        self.q, self.k, self.v, self.out = ([None] * n_layers for _ in range(4))
        self.layout = layout or AttentionLayout()
        self.hidden: torch.Tensor | None = None

    def attend(self, layer, q, k, v):
        check_plain(self.layout, layer, k.shape[0], "the KV-error recorder (lab.eval.kv_error)")
        out = causal_attention(q, k, v)
        self.q[layer], self.k[layer], self.v[layer], self.out[layer] = q, k, v, out
        return out


def _inputs(model, ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids and positions on the model's device."""
    device = model.embed_tokens.weight.device
    return torch.tensor(ids, device=device), torch.arange(len(ids), device=device)


@torch.inference_mode()
def record(model, ids: list[int]) -> _Recorder:
    rec = _Recorder(len(model.layers), model.attention_layout)
    rec.hidden = model(*_inputs(model, ids), rec)
    return rec


def _layer_scale(scales: KVScales | None, fmt: KVCacheFormat, layer: int, role: str):
    return scales.scale(fmt, layer, role) if fmt.static else None


@torch.inference_mode()
def attention_error_by_position(model, rec: _Recorder, fmt: KVCacheFormat, roles: str = "kv",
                                scales: KVScales | None = None, stride: int = 1) -> torch.Tensor:
    """Relative error ||o_q - o|| / ||o|| of the attention output per query position, averaged over layers,
    with each layer's exact q, k, v from `rec` and its K/V (or only K, or only V) read through `fmt`. A window
    and a per-channel key group still filling are read exactly per query, as at decode time (`exact_mask`).
    With `stride` > 1 only every stride-th query is measured (NaN elsewhere): the error of a position does
    not depend on the others', and 8K x 8K attention for every format and layer is the study's cost."""
    T = rec.k[0].shape[0]
    device = rec.k[0].device
    rows = torch.arange(0, T, stride, device=device)
    pos = torch.arange(T, device=device)
    errors = []
    for layer in range(len(model.layers)):
        q, k, v, out = rec.q[layer][rows], rec.k[layer], rec.v[layer], rec.out[layer][rows]
        read, masks = {"k": k, "v": v}, {"k": None, "v": None}
        for role in roles:
            scale = _layer_scale(scales, fmt, layer, role)
            read[role] = quantize_keys(model, k, fmt, scale) if role == "k" else fake_quantize(v, fmt, "v", scale)
            masks[role] = exact_mask(fmt, role, rows[:, None], pos[None, :])
        got = partly_exact_attention(q, read["k"], read["v"], k, v, masks["k"], masks["v"], q_positions=rows)
        errors.append((got - out).flatten(1).norm(dim=1) / out.flatten(1).norm(dim=1).clamp_min(1e-12))
    full = torch.full((T,), float("nan"), device=device)
    full[rows] = torch.stack(errors).mean(0)
    return full


@torch.inference_mode()
def kl_by_position(model, ids: list[int], exact_hidden: torch.Tensor, fmt: KVCacheFormat, roles: str = "kv",
                   scales: KVScales | None = None, chunk: int = 512) -> torch.Tensor:
    """Next-token KL(exact || quantized cache) per position; the LM head runs `chunk` rows at a time."""
    return kl_by_position_of(model, ids, exact_hidden, {None: (fmt, roles, scales)}, chunk)[None]


@torch.inference_mode()
def kl_by_position_of(model, ids: list[int], exact_hidden: torch.Tensor, formats: dict, chunk: int = 512,
                      progress=iter) -> dict:
    """`kl_by_position` for each of `formats` (a key -> (format, roles, scales)): one forward per format, and the
    exact model's log-probabilities computed once per chunk for all of them (they were recomputed per format, as
    costly as the quantized side's: the LM head over every position). Every format's final hidden states are held
    at once (positions x hidden size each). `progress` wraps the forwards' (key, format) pairs, e.g. a tqdm."""
    hidden = {key: model(*_inputs(model, ids), QuantizedContiguousKVCache(model, fmt, scales, roles))
              for key, (fmt, roles, scales) in progress(formats.items())}
    kls = {key: [] for key in formats}
    for a in range(0, len(ids), chunk):
        p = model.compute_logits(exact_hidden[a:a + chunk]).double().log_softmax(-1)
        weights = p.exp()
        for key, h in hidden.items():
            q = model.compute_logits(h[a:a + chunk]).double().log_softmax(-1)
            kls[key].append((weights * (p - q)).sum(-1).clamp_min(0))
    return {key: torch.cat(parts).float() for key, parts in kls.items()}
