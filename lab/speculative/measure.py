"""The costs in the speedup model, timed on the engine: the target's one-token decode step, its verification
forward of k + 1 tokens over the same cached context (v(k) target steps; the article's model says 1), and a
draft model's one-token step (c = draft step / target step). Each is the median of `repeats` forwards of the
engine's own `ModelRunner` over a prefix whose KV is in its paged pool, after one warm-up
(`lab.machine.timing.median_seconds`, which times the replay study's recompute the same way)."""

from __future__ import annotations

from dataclasses import dataclass

from lab.machine.timing import probe_seconds

from .drafters import ModelDrafter


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
    target = probe_seconds(llm.forward_probe(context, 1), repeats)
    verify = {k: probe_seconds(llm.forward_probe(context, k + 1), repeats) for k in sorted(set(ks))}
    spec = llm.extensions.get("speculative")
    drafter = spec.drafter if spec is not None else None
    draft = probe_seconds(drafter.forward_probe(context), repeats) if isinstance(drafter, ModelDrafter) else None
    return StepCosts(context, target, verify, draft)
