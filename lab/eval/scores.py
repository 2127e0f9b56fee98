"""Per-sequence scores of a model against a reference, the units every accuracy interval resamples.

Perplexity, KL and top-1 agreement are pooled over tokens, but tokens of one sequence are not independent
(one hard file raises all of its tokens' loss), so their uncertainty is estimated by resampling *sequences*
(Efron & Tibshirani, 1993; the same choice as lm-evaluation-harness's bootstrap of per-document scores).
`score_sequences` runs the reference and the model once per sequence and keeps the sums per sequence:

- `nll`, `predicted`: summed next-token negative log-likelihood and the tokens it was summed over
  (perplexity = exp(sum nll / sum predicted), resampled as a ratio of sums);
- `kl`, `top1`, `positions`: summed KL(reference || model) over positions, positions whose top-1 token
  agrees, and the positions.

A comparison of two models on the same sequences (GPTQ against RTN) resamples the same sequences for
both (`paired`), which removes the sequences' own difficulty from the difference: two perplexities whose
separate intervals overlap can still differ distinguishably.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np
import torch

from lab.stats.intervals import Interval, bootstrap, ratio_interval
from lab.models.reference import forward_logits


def log_probs(model, ids: list[int], kv=None) -> torch.Tensor:
    """Log-probabilities at every position; `kv`: None, or (KVCacheFormat, KVScales or None) to run with the
    K/V cache stored through that format."""
    cache = None
    if kv is not None:
        from lab.kv.calibration import QuantizedContiguousKVCache

        cache = QuantizedContiguousKVCache(model, *kv)
    return _log_softmax(forward_logits(model, ids, cache))


def _log_softmax(logits: torch.Tensor) -> torch.Tensor:
    """Logits to the log-probabilities every score reads, in float64: one place, so kept logits score exactly as
    recomputed ones (`ReferenceLogProbs`)."""
    return logits.double().log_softmax(-1)


class ReferenceLogProbs:
    """The reference model's logits per sequence, computed once and kept while they fit in `budget_bytes`, so that
    scoring N models against one reference runs the reference once per sequence rather than N times (it was half of
    notebook 02's scoring: every quantized model, ladder rung and calibration mix recomputed it). The float32 logits
    are kept and `log_probs`'s float64 log-softmax is taken at each use, so a kept sequence scores exactly as a
    recomputed one; past the budget a sequence is recomputed. Default budget: a fifth of the memory free now on the
    model's device (the engine's measure, `lab.engine.kv_store.available_memory`), where the logits are kept.
    Keys are the token ids; the reference must not change while the cache is used."""

    def __init__(self, model, budget_bytes: int | None = None):
        from lab.engine.kv_store import available_memory

        self.model = model
        self.budget = (budget_bytes if budget_bytes is not None
                       else available_memory(model.embed_tokens.weight.device) // 5)
        self.used, self.kept, self.missed = 0, {}, 0

    @torch.inference_mode()
    def __call__(self, ids: list[int]) -> torch.Tensor:
        key = tuple(ids)
        logits = self.kept.get(key)
        if logits is None:
            self.missed += 1
            logits = forward_logits(self.model, ids)
            if self.used + logits.nbytes <= self.budget:
                self.kept[key] = logits
                self.used += logits.nbytes
        return _log_softmax(logits)


@dataclass(frozen=True)
class SequenceScores:
    """Per-sequence sums (one entry per sequence), see the module docstring."""
    nll: np.ndarray
    predicted: np.ndarray
    kl: np.ndarray
    top1: np.ndarray
    positions: np.ndarray

    def perplexity(self) -> Interval:
        return bootstrap(_perplexity, self.nll, self.predicted)

    def kl_mean(self) -> Interval:
        return ratio_interval(self.kl, self.positions)

    def top1_agreement(self) -> Interval:
        return ratio_interval(self.top1, self.positions)

    def summary(self, prefix: str = "") -> dict:
        """Table columns: perplexity, kl_mean and top1_agreement, each with _low and _high, and n_sequences."""
        out = {f"{prefix}n_sequences": len(self.nll)}
        for name in ("perplexity", "kl_mean", "top1_agreement"):
            out.update(getattr(self, name)().columns(prefix + name))
        return out

    def rows(self, **labels) -> list[dict]:
        """One dict per sequence with `labels` (model, domain), to save as a table and rebuild with `from_rows`."""
        return [{**labels, "sequence": i, **{f.name: float(getattr(self, f.name)[i]) for f in fields(self)}}
                for i in range(len(self.nll))]

    @classmethod
    def from_rows(cls, frame) -> SequenceScores:
        frame = frame.sort_values("sequence")
        return cls(**{f.name: frame[f.name].to_numpy(dtype=float) for f in fields(cls)})


def _perplexity(nll, predicted):
    return np.exp(nll.sum(-1) / predicted.sum(-1))


def _check_sequences(token_sequences: list[list[int]]) -> None:
    if not token_sequences or any(len(ids) < 2 for ids in token_sequences):
        raise ValueError(f"scoring needs sequences of two or more tokens, got lengths "
                         f"{[len(ids) for ids in token_sequences]}")


def _nll(logp: torch.Tensor, ids: list[int]) -> float:
    """Summed next-token negative log-likelihood of `ids` under log-probabilities `logp` (one row per position)."""
    target = torch.tensor(ids[1:], device=logp.device)
    return -float(logp[:-1].gather(-1, target[:, None]).sum())


@torch.inference_mode()
def perplexity(model, token_sequences: list[list[int]], kv=None) -> float:
    """exp(mean next-token NLL) pooled over the tokens of all sequences, one forward each: the point value of
    `SequenceScores.perplexity` where no reference is needed. `kv` as in `log_probs`."""
    _check_sequences(token_sequences)
    nll = [_nll(log_probs(model, ids, kv), ids) for ids in token_sequences]
    return float(_perplexity(np.asarray(nll), np.asarray([len(ids) - 1 for ids in token_sequences], dtype=float)))


@torch.inference_mode()
def score_sequences(reference, model, token_sequences: list[list[int]], kv=None,
                    cache: ReferenceLogProbs | None = None) -> SequenceScores:
    """`model` scored against `reference` on each sequence (two or more tokens each); `kv` quantizes the
    model's KV cache as in `log_probs`. `model is reference` (and no `kv`) runs one forward per sequence; `cache`
    (of `reference`'s) keeps the reference's forwards for the next model scored on the same sequences."""
    _check_sequences(token_sequences)
    if cache is not None and cache.model is not reference:
        raise ValueError("the cache holds another model's log-probabilities than the reference scored against")
    reference_of = cache or (lambda ids: log_probs(reference, ids))
    cols = {f.name: [] for f in fields(SequenceScores)}
    for ids in token_sequences:
        ref = reference_of(ids)
        out = ref if model is reference and kv is None else log_probs(model, ids, kv)
        cols["nll"].append(_nll(out, ids))
        cols["predicted"].append(len(ids) - 1)
        cols["kl"].append(float((ref.exp() * (ref - out)).sum(-1).clamp_min(0).sum()))
        cols["top1"].append(int((ref.argmax(-1) == out.argmax(-1)).sum()))
        cols["positions"].append(len(ids))
    return SequenceScores(**{k: np.asarray(v, dtype=float) for k, v in cols.items()})


def paired(a: SequenceScores, b: SequenceScores, metric: str) -> Interval:
    """a's metric over b's on the same sequences: a ratio for perplexity (null 1), a difference for kl_mean
    and top1_agreement (null 0); both sides resampled with the same sequences."""
    if len(a.nll) != len(b.nll):
        raise ValueError(f"paired scores need the same sequences, got {len(a.nll)} and {len(b.nll)}")
    if metric == "perplexity":
        return bootstrap(lambda n1, p, n2: _perplexity(n1, p) / _perplexity(n2, p), a.nll, a.predicted, b.nll)
    if metric in ("kl_mean", "top1_agreement"):
        col = "kl" if metric == "kl_mean" else "top1"
        return bootstrap(lambda x, y, n: (x.sum(-1) - y.sum(-1)) / n.sum(-1),
                         getattr(a, col), getattr(b, col), a.positions)
    raise ValueError(f"metric must be perplexity, kl_mean or top1_agreement, not {metric!r}")


def recovered(method: SequenceScores, rtn: SequenceScores, base: SequenceScores, metric: str) -> Interval:
    """The share of RTN's loss a method recovers, 1 - (method - base) / (RTN - base), for perplexity or
    kl_mean, with one resample of sequences shared by the three models. NaN draws (RTN no worse than the
    base in a resample) are left out of the interval."""
    if metric == "perplexity":
        def stat(m, r, b, p):
            u = _perplexity(b, p)
            with np.errstate(divide="ignore", invalid="ignore"):
                return 1 - (_perplexity(m, p) - u) / np.where(_perplexity(r, p) > u, _perplexity(r, p) - u, np.nan)
        return bootstrap(stat, method.nll, rtn.nll, base.nll, base.predicted)
    if metric == "kl_mean":
        def stat(m, r, n):
            with np.errstate(divide="ignore", invalid="ignore"):
                return 1 - m.sum(-1) / np.where(r.sum(-1) > 0, r.sum(-1), np.nan)
        return bootstrap(stat, method.kl, rtn.kl, method.positions)
    raise ValueError(f"metric must be perplexity or kl_mean, not {metric!r}")
