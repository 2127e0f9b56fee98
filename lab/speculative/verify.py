"""Lossless verification of drafted tokens: speculative sampling (Leviathan, Kalman and Matias, 2023, "Fast
Inference from Transformers via Speculative Decoding", arXiv:2211.17192; Chen et al., 2023, arXiv:2302.01318).

A drafter proposes x_1 .. x_k with probabilities q_i(x_i); the target scores the prefix and the k drafts in one
forward, giving p_1 .. p_{k+1}. For i = 1 .. k: accept x_i with probability min(1, p_i(x_i) / q_i(x_i)); at the
first rejection, sample a replacement from norm(max(0, p_i - q_i)) and stop; if all k are accepted, sample a
bonus token from p_{k+1}. Every emitted token is then distributed exactly as sampling from the target alone
(tested with a chi-square test). A deterministic drafter (n-gram lookup, greedy drafts) has q_i = one-hot(x_i):
x_i is accepted with probability p_i(x_i) and a rejection samples from p_i without x_i, renormalized. With a
greedy target (temperature 0) p_i is one-hot at its argmax, so a draft is accepted iff it is the argmax and the
output equals plain greedy decoding token for token.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Verification:
    tokens: list[int]  # emitted this round: the accepted drafts, then one replacement or bonus token
    num_accepted: int  # drafts accepted (0 .. k)
    num_drafted: int


def verify(draft: list[int], target_probs: torch.Tensor, draft_probs: torch.Tensor | None = None,
           generator: torch.Generator | None = None) -> Verification:
    """draft: k tokens; target_probs [k + 1, V] (one-hot rows for a greedy target); draft_probs [k, V] or None
    for a deterministic drafter."""
    k = len(draft)
    if target_probs.dim() != 2 or target_probs.shape[0] != k + 1:
        raise ValueError(f"target_probs must be [k + 1 = {k + 1}, vocab], got {tuple(target_probs.shape)}")
    if draft_probs is not None and draft_probs.shape != (k, target_probs.shape[1]):
        raise ValueError(f"draft_probs must be [k = {k}, {target_probs.shape[1]}], got {tuple(draft_probs.shape)}")
    p = target_probs.double()
    if draft_probs is not None:
        draft_probs = draft_probs.to(p.device)  # a drafter may run on another device than the target
    out = []
    for i, x in enumerate(draft):
        q_x = 1.0 if draft_probs is None else float(draft_probs[i, x])
        ratio = float(p[i, x]) / q_x if q_x > 0 else float("inf")
        if ratio >= 1 or float(torch.rand((), dtype=torch.float64, device=p.device, generator=generator)) < ratio:
            out.append(x)
            continue
        q = torch.zeros_like(p[i])
        if draft_probs is None:
            q[x] = 1.0
        else:
            q = draft_probs[i].double()
        residual = (p[i] - q).clamp_min(0)
        out.append(int(torch.multinomial(residual / residual.sum(), 1, generator=generator)))
        return Verification(out, i, k)
    out.append(int(torch.multinomial(p[k], 1, generator=generator)))
    return Verification(out, k, k)
