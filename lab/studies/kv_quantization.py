"""KV-cache quantization: formats, calibration, and error growth with context (notebook 03).

The deployment article (seeds/003, section 2.3) claims: FP8 KV is usually safe, INT8 needs care, INT4 should
stay out of online serving; keys are more sensitive than values, so keys want per-channel scales and values
per-token ones (KIVI, arXiv:2402.02750); per-token dynamic scales beat a per-tensor static scale on long
context; and the error accumulates with context, so short prompts hide it. This module measures each claim on
SmolLM2 with the formats of `lab.quant.kv`:

- `attention_error_by_position`: every layer's attention output with quantized K/V against exact K/V, on the
  exact model's own queries, keys and values (so the error is the cache's alone, not compounded through
  layers), as a relative error per query position;
- `kl_by_position`: the end-to-end effect, next-token KL(exact || quantized cache) per position, the model
  run once over the whole text with every layer's K/V stored through the format (errors compound through
  the layers here);
- in both, a full-precision window and a per-channel key group still filling are read exactly per query,
  as when that token is decoded (`lab.quant.kv.exact_mask`), the same rule as the paged engine's;
- both bucketed by position (256, 512, ... up to the text's length), for any list of formats, including
  K-only and V-only variants.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd
import torch

from lab.models.attention import causal_attention, partly_exact_attention
from lab.quant.kv import KVCacheFormat, exact_mask, fake_quantize, parse_format
from lab.quant.kv_calibration import KVScales, QuantizedContiguousKVCache, quantize_keys


def position_buckets(n: int, first: int = 256) -> list[tuple[int, int]]:
    """[0, first), [first, 2 first), [2 first, 4 first) ... up to n."""
    edges = [0, first]
    while edges[-1] < n:
        edges.append(edges[-1] * 2)
    edges[-1] = n
    return [(a, b) for a, b in zip(edges, edges[1:]) if a < n]


def _bucketed(values: torch.Tensor, buckets, **labels) -> list[dict]:
    return [{**labels, "positions": f"{a}-{b}", "position_end": b, "value": float(values[a:b].mean())}
            for a, b in buckets]


class _Recorder:
    """An `AttentionContext` (one sequence, one forward) that keeps every layer's q, k, v and output."""

    def __init__(self, n_layers: int):
        self.q, self.k, self.v, self.out = ([None] * n_layers for _ in range(4))

    def attend(self, layer, q, k, v):
        out = causal_attention(q, k, v)
        self.q[layer], self.k[layer], self.v[layer], self.out[layer] = q, k, v, out
        return out


@torch.inference_mode()
def record(model, ids: list[int]) -> _Recorder:
    rec = _Recorder(len(model.layers))
    model(torch.tensor(ids), torch.arange(len(ids)), rec)
    return rec


def _layer_scale(scales: KVScales | None, fmt: KVCacheFormat, layer: int, role: str):
    return scales.scale(fmt, layer, role) if fmt.static else None


@torch.inference_mode()
def attention_error_by_position(model, rec: _Recorder, fmt: KVCacheFormat, roles: str = "kv",
                                scales: KVScales | None = None) -> torch.Tensor:
    """Relative error ||o_q - o|| / ||o|| of the attention output per query position, averaged over layers,
    with each layer's exact q, k, v from `rec` and its K/V (or only K, or only V) read through `fmt`. A window
    and a per-channel key group still filling are read exactly per query, as at decode time (`exact_mask`)."""
    errors = []
    for layer in range(len(model.layers)):
        q, k, v, out = rec.q[layer], rec.k[layer], rec.v[layer], rec.out[layer]
        pos = torch.arange(k.shape[0])
        read, masks = {"k": k, "v": v}, {"k": None, "v": None}
        for role in roles:
            scale = _layer_scale(scales, fmt, layer, role)
            read[role] = quantize_keys(model, k, fmt, scale) if role == "k" else fake_quantize(v, fmt, "v", scale)
            masks[role] = exact_mask(fmt, role, pos[:, None], pos[None, :])
        if masks["k"] is None and masks["v"] is None:
            got = causal_attention(q, read["k"], read["v"])
        else:
            got = partly_exact_attention(q, read["k"], read["v"], k, v, masks["k"], masks["v"])
        errors.append((got - out).flatten(1).norm(dim=1) / out.flatten(1).norm(dim=1).clamp_min(1e-12))
    return torch.stack(errors).mean(0)


@torch.inference_mode()
def kl_by_position(model, ids: list[int], exact_hidden: torch.Tensor, fmt: KVCacheFormat, roles: str = "kv",
                   scales: KVScales | None = None, chunk: int = 512) -> torch.Tensor:
    """Next-token KL(exact || quantized cache) per position; the LM head runs `chunk` rows at a time."""
    cache = QuantizedContiguousKVCache(model, fmt, scales, roles)
    hidden = model(torch.tensor(ids), torch.arange(len(ids)), cache)
    kls = []
    for a in range(0, len(ids), chunk):
        p = model.compute_logits(exact_hidden[a:a + chunk]).double().log_softmax(-1)
        q = model.compute_logits(hidden[a:a + chunk]).double().log_softmax(-1)
        kls.append((p.exp() * (p - q)).sum(-1).clamp_min(0))
    return torch.cat(kls).float()


@torch.inference_mode()
def exact_hidden_states(model, ids: list[int]) -> torch.Tensor:
    from lab.models.reference import ContiguousKVCache

    return model(torch.tensor(ids), torch.arange(len(ids)), ContiguousKVCache(len(model.layers)))


def error_growth(model, ids: list[int], formats: list[str], scales: KVScales | None = None,
                 first_bucket: int = 256, log=print) -> pd.DataFrame:
    """Attention-output relative error and next-token KL by position bucket, for every format name."""
    rec = record(model, ids)
    exact = exact_hidden_states(model, ids)
    buckets = position_buckets(len(ids), first_bucket)
    rows = []
    for name in formats:
        fmt, roles = parse_format(name)
        att = attention_error_by_position(model, rec, fmt, roles, scales)
        kl = kl_by_position(model, ids, exact, fmt, roles, scales)
        rows += _bucketed(att, buckets, format=name, metric="attention_rel_error")
        rows += _bucketed(kl, buckets, format=name, metric="next_token_kl")
        log(f"{name:32s} attention error {float(att.mean()):.4f}, KL {float(kl.mean()):.5f}")
    return pd.DataFrame(rows)


def growth_slope(df: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Per format: the metric in the first and last position bucket, their ratio, and the least-squares slope
    of log(metric) against log2(bucket end), i.e. how many times larger the error gets per doubling."""
    rows = []
    for name, g in df[df["metric"] == metric].groupby("format", sort=False):
        g = g.sort_values("position_end")
        x = [math.log2(v) for v in g["position_end"]]
        y = [math.log(max(v, 1e-30)) for v in g["value"]]
        n = len(x)
        mx, my = sum(x) / n, sum(y) / n
        den = sum((a - mx) ** 2 for a in x)
        slope = sum((a - mx) * (b - my) for a, b in zip(x, y)) / den if den else float("nan")
        rows.append({"format": name, "first_bucket": g["value"].iloc[0], "last_bucket": g["value"].iloc[-1],
                     "last_over_first": g["value"].iloc[-1] / g["value"].iloc[0], "x_per_doubling": math.exp(slope)})
    return pd.DataFrame(rows)


@dataclass
class LongText:
    ids: list[int]
    sources: list[str]


def long_text(tokenizer, n_tokens: int, seed: int = 0) -> LongText:
    """`n_tokens` of held-out standard-library source (files no calibration set reads), whole files joined
    in a seeded order until the length is reached; refuses if the held-out files are too few."""
    import random

    from lab.eval.harness import heldout_stdlib_files

    files = heldout_stdlib_files()
    random.Random(seed).shuffle(files)
    ids, sources = [], []
    for label, path in files:
        if len(ids) >= n_tokens:
            break
        with open(path, encoding="utf-8", errors="replace") as f:
            ids += tokenizer(f.read(), add_special_tokens=False)["input_ids"]
        sources.append(label)
    if len(ids) < n_tokens:
        raise ValueError(f"held-out text has only {len(ids)} tokens, fewer than n_tokens={n_tokens}")
    return LongText(ids[:n_tokens], sources)
