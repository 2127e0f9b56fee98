"""The expected-speedup model of speculative decoding (Leviathan et al., 2023, section 3; the deployment article,
seeds/003, section 5).

If each drafted token is accepted with probability a given that the ones before it were (a is this conditional
acceptance, not vLLM's accepted / drafted ratio), a round of k drafts emits

    E[tokens] = (1 - a^(k+1)) / (1 - a)          (accepted drafts plus the replacement or bonus token)

and costs k draft steps of relative cost c (draft step time / target step time) plus one target forward, so

    speedup = E[tokens] / (k c + 1).

The "1" is the article's assumption that verifying k + 1 tokens costs one target step. On a CPU (and at
large batch on a GPU) a (k+1)-token forward costs more; `verify_cost` v(k), measured in target steps by
`lab.speculative.measure`, replaces it: speedup = E / (k c + v(k)).
"""

from __future__ import annotations

from collections.abc import Callable


def expected_tokens_per_round(a: float, k: int) -> float:
    if not 0.0 <= a <= 1.0 or k < 0:
        raise ValueError(f"need 0 <= a <= 1 and k >= 0, got a={a}, k={k}")
    return float(k + 1) if a == 1.0 else (1 - a ** (k + 1)) / (1 - a)


def predicted_speedup(a: float, k: int, c: float, verify_cost: float = 1.0) -> float:
    if c < 0 or verify_cost <= 0:
        raise ValueError(f"need draft cost ratio c >= 0 and verify_cost > 0, got c={c}, verify_cost={verify_cost}")
    return expected_tokens_per_round(a, k) / (k * c + (verify_cost if k else 1.0))


def best_k(a: float, c: float, max_k: int = 16, verify_cost: Callable[[int], float] = lambda k: 1.0) -> int:
    """The number of drafts that maximises the predicted speedup (0: do not speculate)."""
    return max(range(max_k + 1), key=lambda k: predicted_speedup(a, k, c, verify_cost(k)))


def expected_tokens_by_position(rates: list[float], k: int) -> float:
    """E[tokens] of a round of k drafts when position i is accepted with its own conditional rate rates[i]
    (positions never measured count as rejected): 1 + sum_i prod_{j <= i} rates[j]. With equal rates a this is
    the formula above; with the rates of a run it is that run's mean tokens per round of k drafts."""
    total, reach = 1.0, 1.0
    for i in range(k):
        reach *= rates[i] if i < len(rates) else 0.0
        total += reach
    return total


def predicted_run_speedup(drafted_per_round: list[int], plain_steps: int, c: float,
                          expected_tokens: Callable[[int], float],
                          verify_cost: Callable[[int], float] = lambda k: 1.0) -> float:
    """The model applied to a run whose rounds drafted different numbers of tokens (an n-gram drafter proposes
    fewer than k, or none: those steps are plain): expected tokens over cost, both in target steps."""
    tokens = sum(expected_tokens(d) for d in drafted_per_round) + plain_steps
    cost = sum(d * c + verify_cost(d) for d in drafted_per_round) + plain_steps
    return tokens / cost


def conditional_acceptance(accepted_per_round: list[int], k: int) -> float:
    """a from rounds of k drafts: accepted positions / positions reached (position i is reached when the i - 1
    before it were accepted). Spec-Bench's mean accepted tokens per step is mean(accepted) + 1."""
    reached = sum(min(n + 1, k) for n in accepted_per_round)
    return sum(accepted_per_round) / reached if reached else float("nan")


def break_even(c: float, k: int | None = None, verify_cost: float = 1.0, floor: float = 1.1) -> float:
    """The acceptance rate a at which the predicted speedup (k drafts, or the best k when None) reaches `floor`, by
    bisection (the speedup grows with a); NaN when even a = 1 does not reach it."""
    def speedup(a: float) -> float:
        ks = [k] if k is not None else range(1, 17)
        return max(predicted_speedup(a, n, c, verify_cost) for n in ks)

    if speedup(1.0) < floor:
        return float("nan")
    lo, hi = 0.0, 1.0
    for _ in range(40):
        lo, hi = ((lo + hi) / 2, hi) if speedup((lo + hi) / 2) < floor else (lo, (lo + hi) / 2)
    return hi
