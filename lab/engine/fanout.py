"""Parallel sampling, vLLM's `SamplingParams.n`: n samples of one prompt that share the prompt's KV blocks.

`LLM.add_samples` (which `LLM.generate` and the server both use) queues the first sample at once and hands the
other n - 1 to this extension, which holds them until the first has computed its prompt (its full blocks are
then hashed into the prefix cache, `_append`), and queues them after that step: they find the prompt's full
blocks in the cache (shared, reference-counted by the block manager), compute only what is past the last full
block, and sample on their own. A held sample that is aborted is dropped (`drop`). Sample i uses seed + i
(`SamplingParams.samples`). Without prefix caching the samples compute the prompt again (still correct, nothing
shared). vLLM v1 fans a request out into child requests the same way and relies on its prefix cache for the
sharing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .extension import EngineExtension, StepView

if TYPE_CHECKING:
    from .request import Sequence


class FanOut(EngineExtension):
    name = "fanout"

    def __init__(self):
        self.held: dict[int, list[Sequence]] = {}  # first sample's request id -> the samples waiting for it

    def hold(self, first: Sequence, siblings: list[Sequence]) -> None:
        self.held[first.request_id] = siblings

    def drop(self, request_id: int) -> None:
        """A held sample was aborted: it is never queued."""
        for first, siblings in list(self.held.items()):
            self.held[first] = [s for s in siblings if s.request_id != request_id]
            if not self.held[first]:
                del self.held[first]

    def after_step(self, step: StepView) -> None:
        for rid, siblings in list(self.held.items()):
            first = step.sequence(rid)
            if first is None or first.num_computed_tokens >= first.num_prompt_tokens:  # prompt done, or it ended
                for seq in siblings:
                    step.enqueue(seq)
                del self.held[rid]

    def stats(self) -> dict:
        return {"fanout_held": sum(map(len, self.held.values()))}
