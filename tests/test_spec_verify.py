"""Speculative sampling (lab.speculative.verify) is lossless: greedy drafts give plain greedy tokens, and sampled
outputs are distributed as the target's (chi-square, with a broken rule shown to fail the same test); the
speedup model (lab.speculative.theory) against a simulation of rounds."""

import pytest
import torch

from lab.speculative import best_k, conditional_acceptance, expected_tokens_per_round, predicted_speedup, verify


def _one_hot(ids, vocab=8):
    return torch.nn.functional.one_hot(torch.tensor(ids), vocab).double()


def test_greedy_target_accepts_exactly_its_argmax():
    target = _one_hot([3, 5, 1, 7])  # the target's greedy tokens at 4 positions
    v = verify([3, 5, 2], target)
    assert (v.tokens, v.num_accepted) == ([3, 5, 1], 2)  # stops at the first mismatch, with the target's token
    v = verify([3, 5, 1], target)
    assert (v.tokens, v.num_accepted) == ([3, 5, 1, 7], 3)  # all accepted: the bonus token
    v = verify([0, 5, 1], target)
    assert (v.tokens, v.num_accepted) == ([3], 0)


def _generate(p, q, k, length, generator, rule=verify):
    """Tokens 0 .. length - 1 from a toy target whose distribution at position i is p[i] whatever the context,
    speculated by a drafter sampling q[i] (or, q None, drafting the argmax of its own q deterministically)."""
    out = []
    while len(out) < length:
        pos = len(out)
        n = min(k, length - pos)
        rows = range(pos, pos + n)
        draft = [int(torch.multinomial(q[i], 1, generator=generator)) for i in rows]
        v = rule(draft, p[pos:pos + n + 1], q[pos:pos + n], generator)
        out += v.tokens
    return out[:length]


def _chi_square_p(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs * counts.sum()
    stat = ((counts - expected) ** 2 / expected).sum()
    return float(torch.special.gammaincc(torch.tensor((len(probs) - 1) / 2.0), stat / 2))


def test_sampled_tokens_are_distributed_as_the_target():
    g = torch.Generator().manual_seed(0)
    vocab, length = 6, 4
    p = torch.softmax(torch.randn(length + 1, vocab, generator=g) * 1.5, -1).double()
    q = torch.softmax(torch.randn(length + 1, vocab, generator=g) * 1.5, -1).double()  # a poor drafter
    samples = torch.tensor([_generate(p, q, 3, length, g) for _ in range(4000)])
    for pos in range(length):
        counts = torch.bincount(samples[:, pos], minlength=vocab).double()
        assert _chi_square_p(counts, p[pos]) > 1e-3, pos

    # The same test catches a rule that is not lossless: accepting every draft gives q's distribution.
    def accept_all(draft, target, q_rows, generator):
        from lab.speculative.verify import Verification
        return Verification(draft, len(draft), len(draft))

    wrong = torch.tensor([_generate(p, q, 3, length, g, accept_all) for _ in range(4000)])
    assert _chi_square_p(torch.bincount(wrong[:, 0], minlength=vocab).double(), p[0]) < 1e-6


def test_deterministic_drafts_are_lossless_too():
    """An n-gram drafter proposes tokens without probabilities: q is one-hot at the draft."""
    g = torch.Generator().manual_seed(1)
    p = torch.softmax(torch.randn(3, 5, generator=g), -1).double()
    firsts = torch.tensor([verify([2, 2], p, None, g).tokens[0] for _ in range(6000)])
    assert _chi_square_p(torch.bincount(firsts, minlength=5).double(), p[0]) > 1e-3


def test_bad_shapes_are_refused():
    with pytest.raises(ValueError, match=r"target_probs must be \[k \+ 1 = 3, vocab\]"):
        verify([1, 2], torch.ones(2, 4) / 4)


@pytest.mark.parametrize("a,k", [(0.0, 3), (0.55, 4), (0.8, 4), (0.95, 8)])
def test_expected_tokens_formula_against_simulated_rounds(a, k):
    g = torch.Generator().manual_seed(2)
    accepted = []
    for _ in range(20000):
        n = 0
        while n < k and float(torch.rand((), generator=g)) < a:
            n += 1
        accepted.append(n)
    mean_tokens = sum(accepted) / len(accepted) + 1  # Spec-Bench's mean accepted tokens per step
    assert mean_tokens == pytest.approx(expected_tokens_per_round(a, k), rel=0.02)
    if a > 0:
        assert conditional_acceptance(accepted, k) == pytest.approx(a, abs=0.01)
        # vLLM's accepted / drafted is not a: it is lower whenever a round stops early
        assert sum(accepted) / (k * len(accepted)) < a


def test_speedup_model():
    assert expected_tokens_per_round(0.8, 4) == pytest.approx((1 - 0.8 ** 5) / 0.2)
    assert predicted_speedup(0.8, 4, 0.05) == pytest.approx(3.3616 / 1.2)
    assert best_k(0.0, 0.1) == 0  # nothing is accepted: do not speculate
    assert best_k(0.9, 0.02) > best_k(0.6, 0.02)
