"""A sparse mixture of experts: each token runs through k of E feed-forward experts that a learned router picks.

Shazeer et al., "Outrageously Large Neural Networks: The Sparsely-Gated Mixture-of-Experts Layer" (2017,
arXiv:1701.06538), in the form Mixtral (Jiang et al., "Mixtral of Experts", 2024, arXiv:2401.04088) and Qwen3-MoE
(Qwen Team, "Qwen3 Technical Report", 2025, arXiv:2505.09388) use, with facts checked against transformers'
modeling_mixtral and modeling_qwen3_moe:

    logits = x W_gate^T                    one score per expert, [tokens, E]
    p      = softmax(logits) in float32    over all E experts
    w, e   = top-k of p                    the k experts a token uses and their probabilities
    w      = w / sum(w)                    only where the family renormalises (Mixtral always; Qwen3-MoE when the
                                           config's norm_topk_prob says so, otherwise the weights sum to < 1)
    y      = sum_j w_j * expert_{e_j}(x)   each expert a SwiGLU MLP

(Mixtral's paper writes softmax over the top-k logits; that equals the renormalised top-k of the full softmax.)

The experts run as a plain loop: for each expert some token chose, gather those tokens, run the expert on them,
scale by their routing weights and add the result into their rows. Inference routes every token to its k experts:
no capacity limit and no dropped tokens (capacity factors belong to training's load balancing). Each expert is its
own `nn.Linear`s, so what walks a model's linears (prepacking, `store_weights_transposed`) reaches them.
"""

from __future__ import annotations

import torch
from torch import nn


def route(logits: torch.Tensor, top_k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights [T, k] float32, experts [T, k]) for router `logits` [T, E]: the k most probable experts of each
    token under a float32 softmax, their probabilities renormalised to sum to 1 if `renormalize`."""
    probs = logits.float().softmax(dim=-1)  # float32 whatever the activations: small weights must not round to 0
    weights, experts = probs.topk(top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, experts


class SparseMoE(nn.Module):
    """A router (`gate`, no bias) over `experts` (modules mapping [n, hidden] -> [n, hidden]); each token's output
    is the routing-weighted sum of its `top_k` experts' outputs."""

    def __init__(self, hidden_size: int, experts: list[nn.Module], top_k: int, renormalize: bool):
        super().__init__()
        if not 1 <= top_k <= len(experts):
            raise ValueError(f"top_k {top_k} must be in [1, {len(experts)} experts]")
        self.top_k, self.renormalize = top_k, renormalize
        self.gate = nn.Linear(hidden_size, len(experts), bias=False)
        self.experts = nn.ModuleList(experts)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, chosen = route(self.gate(x), self.top_k, self.renormalize)
        out = torch.zeros_like(x)
        for e in chosen.unique().tolist():  # only experts that some token chose
            rows, slot = (chosen == e).nonzero(as_tuple=True)  # token rows, and which of their k choices it was
            y = self.experts[e](x[rows])
            # The product in float32, then the activation dtype (Mixtral's order in transformers; Qwen3-MoE's
            # casts the weights first: the two differ by one 16-bit rounding, nothing in float32).
            out.index_add_(0, rows, (y.float() * weights[rows, slot, None]).to(out.dtype))
        return out
