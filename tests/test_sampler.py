"""The batched sampler (`lab.engine.sampler`): batched choosing equals choosing row by row, exactly; logit_bias
on the real model equals the reference forward plus the bias; bad biases are refused with the value named."""

import random

import pytest
import torch

from lab.engine import LLM, SamplingParams
from lab.engine.sampler import choose, probabilities, sampling_probs


def _random_params(rng: random.Random, seeded: bool) -> SamplingParams:
    return SamplingParams(temperature=rng.choice([0, 0.3, 0.7, 1.0, 1.3]), top_k=rng.choice([0, 1, 5, 50, -1, 2000]),
                          top_p=rng.choice([1.0, 0.9, 0.5]), seed=rng.randrange(10**6) if seeded else None)


def test_a_batch_of_seeded_rows_draws_exactly_what_each_row_draws_alone():
    rng = random.Random(0)
    torch.manual_seed(0)
    for _ in range(40):
        batch, vocab = rng.randint(2, 6), rng.choice([64, 1000])
        logits = torch.randn(batch, vocab) * rng.choice([1, 4])
        params = [_random_params(rng, seeded=True) for _ in range(batch)]
        together = choose(logits, params, [torch.Generator().manual_seed(p.seed) for p in params])
        alone = [choose(logits[i:i + 1], [p], [torch.Generator().manual_seed(p.seed)])[0]
                 for i, p in enumerate(params)]
        assert together == alone


def test_the_batched_filters_equal_each_rows_own_distribution():
    rng = random.Random(1)
    logits = torch.randn(6, 300) * 3
    params = [_random_params(rng, seeded=False) for _ in range(6)]
    params = [p for p in params if not p.greedy] or [SamplingParams(temperature=0.8, top_p=0.9)]
    batched = sampling_probs(logits[:len(params)], params)
    for i, p in enumerate(params):
        assert torch.equal(batched[i], probabilities(logits[i:i + 1], p)[0])


def test_top_k_and_top_p_keep_what_their_definitions_keep_ties_included():
    """Each row's kept tokens against the definitions written out one row at a time: top-k keeps every logit at or
    above the k-th largest (a tie at the k-th stays in; k <= 0 or >= the vocabulary keeps all), then top-p keeps
    the most likely tokens until the ones before reach p (the first always stays). Integer logits make ties in
    the top-k-only rows; the top-p rows have none (which of two tied tokens a sort puts first is its own)."""
    from lab.engine.sampler import _filter_top_k_top_p

    torch.manual_seed(3)
    vocab, ks = 40, [0, -1, 1, 2, 3, 7, 39, 40, 45]
    logits = torch.cat([torch.randint(-4, 5, (len(ks), vocab)).float(), 2 * torch.randn(2 * len(ks), vocab)])
    top_k = torch.tensor(ks * 3)
    top_p = torch.tensor([1.0] * len(ks) + [0.6] * len(ks) + [0.95] * len(ks))
    got = _filter_top_k_top_p(logits, top_k, top_p)
    for row, k, p, kept in zip(logits.tolist(), top_k.tolist(), top_p.tolist(), got.isfinite().tolist()):
        want = [True] * vocab if k <= 0 or k >= vocab else [x >= sorted(row, reverse=True)[k - 1] for x in row]
        if p < 1:
            alive = [(x, i) for i, x in enumerate(row) if want[i]]
            weights = torch.tensor([x for x, _ in alive]).softmax(-1).tolist()
            order = sorted(range(len(alive)), key=lambda j: -alive[j][0])
            before, want = 0.0, [False] * vocab
            for j in order:
                if before >= p:
                    break
                want[alive[j][1]], before = True, before + weights[j]
        assert kept == want, (k, p)


def test_unseeded_rows_are_drawn_from_their_own_distribution():
    """Top-k 2 at temperature 1 over two rows with different favourites: each row only ever draws its own two."""
    logits = torch.full((2, 8), -5.0)
    logits[0, [1, 2]] = 3.0
    logits[1, [5, 6]] = 3.0
    params = [SamplingParams(temperature=1.0, top_k=2)] * 2
    draws = [choose(logits, params, [None, None]) for _ in range(200)]
    assert {d[0] for d in draws} == {1, 2} and {d[1] for d in draws} == {5, 6}


def test_logit_bias_equals_the_reference_forward_plus_the_bias(smollm):
    from lab.models.reference import forward_logits

    model, tok = smollm
    llm = LLM(model, tokenizer=tok, dtype="float32", num_kv_blocks=32, max_model_len=128)
    prompt = tok.encode("The capital of France is", add_special_tokens=False)
    plain = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))[0].token_ids
    bias = {plain[0]: -100.0, plain[1]: 5.0}  # the first choice forbidden in effect, another one favoured
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, logit_bias=bias, logprobs=0)
    out = llm.generate([prompt], params)[0]
    want = []
    with torch.inference_mode():
        for _ in range(6):
            row = forward_logits(model, prompt + want)[-1].float()
            for t, b in bias.items():
                row[t] += b
            want.append(int(row.argmax()))
    assert out.token_ids == want and want != plain  # the bias changed the answer, so the test can fail
    # logprobs are the model's before the bias (vLLM's default), returned with the tokens
    assert len(out.logprobs) == 6 and all(t in e for t, e in zip(out.token_ids, out.logprobs))


@pytest.mark.parametrize("bias, named", [({5: 101.0}, r"logit_bias\[5\]"), ({-1: 1.0}, "token id"),
                                         ({5: float("nan")}, r"logit_bias\[5\]"), ([5], "dict")])
def test_bad_biases_are_named(bias, named):
    with pytest.raises(ValueError, match=named):
        SamplingParams(logit_bias=bias)


def test_a_bias_outside_the_vocabulary_is_refused_with_the_vocabulary_named(smollm):
    model, tok = smollm
    llm = LLM(model, tokenizer=tok, num_kv_blocks=16, max_model_len=64)
    with pytest.raises(ValueError, match=r"token id 49152, outside the vocabulary \[0, 49152\)"):
        llm.add_request("hi", SamplingParams(logit_bias={49152: 1.0}))
    assert not llm.has_unfinished()
