"""Parallel sampling, vLLM's `SamplingParams.n`: n samples of one prompt that share the prompt's KV blocks.

`LLM.generate` queues the first sample at once and hands the other n - 1 to this extension, which holds them
until the first has computed its prompt (its full blocks are then hashed into the prefix cache, `_append`),
and queues them after that step: they find the prompt's full blocks in the cache (shared, reference-counted
by the block manager), compute only what is past the last full block, and sample on their own. Sample i uses
seed + i when the request has a seed, so the n samples equal n single requests seeded so. Without prefix
caching the samples compute the prompt again (still correct, nothing shared). vLLM v1 fans a request out into
child requests the same way and relies on its prefix cache for the sharing.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from .extension import EngineExtension
from .request import SamplingParams

if TYPE_CHECKING:
    from .llm import LLM
    from .request import Sequence


def sibling_params(params: SamplingParams) -> list[SamplingParams]:
    """The parameters of samples 1 .. n - 1 (sample 0 keeps `params`): one sample each, seed + i."""
    return [dataclasses.replace(params, n=1, seed=None if params.seed is None else params.seed + i)
            for i in range(1, params.n)]


class FanOut(EngineExtension):
    name = "fanout"

    def __init__(self):
        self.held: dict[int, list[Sequence]] = {}  # first sample's request id -> the samples waiting for it

    def hold(self, first: Sequence, siblings: list[Sequence]) -> None:
        self.held[first.request_id] = siblings

    def after_step(self, engine: LLM) -> None:
        for rid, siblings in list(self.held.items()):
            first = engine.sequences.get(rid)
            if first is None or first.num_computed_tokens >= first.num_prompt_tokens:  # prompt done, or it ended
                for seq in siblings:
                    engine.enqueue(seq)
                del self.held[rid]

    def stats(self) -> dict:
        return {"fanout_held": sum(map(len, self.held.values()))}
