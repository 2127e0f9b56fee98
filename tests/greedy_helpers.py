"""Where two greedy runs part, how near a tie the reference saw (not a test module).

Two evaluations of one model that round differently (another format for K/V, another summation order for a
bfloat16 matmul) can both be right and still pick different tokens at a near tie; after that the runs see
different prefixes and cannot be compared further. What a test can check is the step where they first part:
the reference must rank the two tokens within a small gap, where a broken path gives gaps of whole nats."""

import torch

# Two bfloat16 evaluations of SmolLM2 that round differently (oneDNN's kernels for a blocked and for a plain weight
# on a CPU with AMX) moved the float32 model's top-2 margin by up to 0.33 nats over 96 greedy steps (4 prompts x 24
# tokens, each run teacher-forced on the float32 model's sequences); where such runs part, the float32 model must
# rank the two tokens closer than this.
BF16_NEAR_TIE_NATS = 0.5


def divergence_gap(model, ids, want, got, cache) -> tuple[int, float]:
    """Where `got` first leaves `want`: (index i, log p(want[i]) - log p(got[i])) with `cache` (an empty
    one-sequence context) run over ids + want[:i]."""
    i = next(j for j, (a, b) in enumerate(zip(want, got)) if a != b)
    seq = ids + want[:i]
    with torch.inference_mode():
        logp = model.compute_logits(model(torch.tensor(seq), torch.arange(len(seq)), cache))[-1].log_softmax(-1)
    return i, float(logp[want[i]] - logp[got[i]])


def parted_only_at_near_ties(reference, prompts, want_runs, got_runs, nats: float) -> list[tuple[int, int, float]]:
    """(prompt index, step, gap) for every pair of runs that part at a step where `reference` (a float32 model)
    ranks the two tokens more than `nats` apart: empty when every parting is a near tie."""
    from lab.models.reference import ContiguousKVCache

    far = []
    for n, (ids, want, got) in enumerate(zip(prompts, want_runs, got_runs)):
        assert len(want) == len(got), (n, len(want), len(got))
        if want != got:
            i, gap = divergence_gap(reference, ids, want, got, ContiguousKVCache(len(reference.layers)))
            if abs(gap) >= nats:
                far.append((n, i, gap))
    return far
