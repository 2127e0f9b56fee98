"""The costs in the speedup model, timed on the engine: the target's one-token decode step, its verification
forward of k + 1 tokens over the same cached context (v(k) target steps; the article's model says 1), and a
draft model's one-token step (c = draft step / target step). Each is the median of `repeats` forwards of the
engine's own `ModelRunner` over a prefix whose KV is in its paged pool, after one warm-up
(`lab.timing.median_seconds`, which times the replay study's recompute the same way)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lab.engine.model_runner import ModelRunner
from lab.engine.request import SamplingParams, Sequence
from lab.engine.scheduler import BlockManager
from lab.timing import median_seconds

from .drafters import ModelDrafter


def forward_seconds(runner: ModelRunner, block_manager: BlockManager, context: int, n: int, repeats: int = 5,
                    draft: bool = False) -> float:
    """Median seconds of one step of n new tokens after `context` cached ones (batch 1), as the engine runs it:
    a target step returns the logits of its last row (n = 1) or of all n rows for verification (n - 1 drafts: the
    LM head runs on n rows); a draft step (`draft`) returns its last row's logits. The engine's sampling or
    verification of those logits is not timed (an argmax, or a few rows of softmax: microseconds)."""
    if context < 0 or n < 1 or repeats < 1:
        raise ValueError(f"need context >= 0, n >= 1, repeats >= 1; got {context}, {n}, {repeats}")
    vocab = runner.model.config.vocab_size
    ids = torch.randint(0, vocab, (context + n,), generator=torch.Generator().manual_seed(context + n)).tolist()
    seq = Sequence(ids, SamplingParams(max_tokens=1))
    if not block_manager.allocate(seq, context + n):
        raise ValueError(f"{context + n} tokens need {block_manager.blocks_for(context + n)} blocks; "
                         f"{block_manager.num_free_blocks} are free")
    try:
        if context:
            runner.execute([(seq, context)])  # the prefix's KV, which the timed forwards read
        seq.num_computed_tokens = context

        def step():
            if draft:
                runner.execute([(seq, n)])
            else:
                runner.execute([(seq, n)], {seq.request_id: n - 1})

        return median_seconds(step, repeats)
    finally:
        block_manager.free_sequence(seq)


@dataclass
class StepCosts:
    context: int
    target_step_s: float
    verify_s: dict[int, float]  # k -> seconds of the (k + 1)-token verification forward
    draft_step_s: float | None  # a draft model's one-token step; None for a drafter without a model

    @property
    def c(self) -> float | None:
        return None if self.draft_step_s is None else self.draft_step_s / self.target_step_s

    def v(self, k: int) -> float:
        """Verification of k drafts in target steps (v(0) = 1: a plain step)."""
        return 1.0 if k == 0 else self.verify_s[k] / self.target_step_s


def step_costs(llm, context: int, ks, repeats: int = 5) -> StepCosts:
    """Time the target (and the engine's draft model, if it has one) at `context` cached tokens."""
    target = forward_seconds(llm.runner, llm.block_manager, context, 1, repeats)
    verify = {k: forward_seconds(llm.runner, llm.block_manager, context, k + 1, repeats) for k in sorted(set(ks))}
    spec = llm.extensions.get("speculative")
    drafter = spec.drafter if spec is not None else None
    draft = (forward_seconds(drafter.runner, drafter.block_manager, context, 1, repeats, draft=True)
             if isinstance(drafter, ModelDrafter) else None)
    return StepCosts(context, target, verify, draft)
