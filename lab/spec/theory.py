"""The expected-speedup model of speculative decoding (Leviathan et al., 2023, section 3; the deployment article,
seeds/003, section 5).

If each drafted token is accepted with probability a given that the ones before it were (a is this conditional
acceptance, not vLLM's accepted / drafted ratio), a round of k drafts emits

    E[tokens] = (1 - a^(k+1)) / (1 - a)          (accepted drafts plus the replacement or bonus token)

and costs k draft steps of relative cost c (draft step time / target step time) plus one target forward, so

    speedup = E[tokens] / (k c + 1).
"""

from __future__ import annotations


def expected_tokens_per_round(a: float, k: int) -> float:
    if not 0.0 <= a <= 1.0 or k < 0:
        raise ValueError(f"need 0 <= a <= 1 and k >= 0, got a={a}, k={k}")
    return float(k + 1) if a == 1.0 else (1 - a ** (k + 1)) / (1 - a)


def predicted_speedup(a: float, k: int, c: float) -> float:
    if c < 0:
        raise ValueError(f"draft cost ratio c must be >= 0, got {c}")
    return expected_tokens_per_round(a, k) / (k * c + 1)


def best_k(a: float, c: float, max_k: int = 16) -> int:
    """The number of drafts that maximises the predicted speedup (0: do not speculate)."""
    return max(range(max_k + 1), key=lambda k: predicted_speedup(a, k, c))


def conditional_acceptance(accepted_per_round: list[int], k: int) -> float:
    """a from rounds of k drafts: accepted positions / positions reached (position i is reached when the i - 1
    before it were accepted). Spec-Bench's mean accepted tokens per step is mean(accepted) + 1."""
    reached = sum(min(n + 1, k) for n in accepted_per_round)
    return sum(accepted_per_round) / reached if reached else float("nan")
