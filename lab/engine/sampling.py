"""Sampling parameters and the sampler: greedy, temperature, top-k, top-p, seeded per request.

Top-p is nucleus sampling (Holtzman et al., "The Curious Case of Neural Text Degeneration", 2020):
keep the smallest set of most likely tokens whose probability reaches p. A request with a `seed`
owns a `torch.Generator`, so its sampled tokens do not depend on what else is in the batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class SamplingParams:
    temperature: float = 1.0  # 0 means greedy
    top_k: int = 0  # 0 means no top-k cut
    top_p: float = 1.0
    max_tokens: int = 16
    seed: int | None = None
    ignore_eos: bool = False
    stop_token_ids: list[int] = field(default_factory=list)
    speculate: bool = True  # on an engine with speculative decoding: draft for this request (False: plain)

    def __post_init__(self):
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 disables it), got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be a positive integer, got {self.max_tokens!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0 or self.top_k == 1


def _filter_top_k_top_p(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    if top_k and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        cum = sorted_logits.softmax(-1).cumsum(-1)
        # Drop a token when the tokens before it already reach top_p; the first always stays.
        drop = (cum - sorted_logits.softmax(-1)) >= top_p
        logits = logits.masked_fill(torch.zeros_like(drop).scatter(0, order, drop), float("-inf"))
    return logits


def probabilities(logits: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """The distribution `sample` draws from, for each row of `logits` [n, vocab]: one-hot at the argmax for a
    greedy request (what speculative verification compares drafts against)."""
    if p.greedy:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).to(logits.dtype)
    return torch.stack([_filter_top_k_top_p(row / p.temperature, p.top_k, p.top_p).softmax(-1) for row in logits])


def sample(logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator | None]) -> list[int]:
    """One token per row of `logits` [B, vocab] (float32)."""
    tokens = logits.argmax(-1).tolist()  # greedy rows are done here, in one batched call
    for i, p in enumerate(params):
        if p.greedy:
            continue
        row = _filter_top_k_top_p(logits[i] / p.temperature, p.top_k, p.top_p)
        probs = row.softmax(-1)
        tokens[i] = int(torch.multinomial(probs, 1, generator=generators[i]))
    return tokens
