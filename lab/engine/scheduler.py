"""Who runs each step and with how many tokens (`Scheduler`): the rule decides by what the KV block pool
(`lab.engine.block_manager.BlockManager`) can allocate, as vLLM v1's scheduler asks its KV cache manager.

**Continuous batching** with chunked prefill and preemption by recompute, as one rule.
Each step has a token budget (`max_num_batched_tokens`) and a cap on running sequences
(`max_num_seqs`). Running sequences come first, in arrival order, each given
min(tokens it wants, budget left): one for a decode, a chunk for a prompt being prefilled. Then
waiting sequences are admitted while budget and seats last, after a prefix-cache lookup. This is
vLLM v1's scheduler rule; it makes prefill chunks and decodes share a step (Agrawal et al.,
"Sarathi-Serve", OSDI 2024) without a separate prefill phase (Yu et al., "Orca", OSDI 2022, for
iteration-level scheduling).

When a running sequence needs a block and none is free, the most recently admitted running
sequence is preempted: its blocks are freed and it goes back to the front of the queue with
`num_computed_tokens = 0`, to be recomputed later (vLLM's default; cheaper than swapping to host).
Its full blocks stay in the prefix cache, so the recompute is often mostly hits.

With a sliding window on every layer (`BlockManager.sliding_window`), a running sequence's blocks wholly outside
the window of its next query are freed before it allocates for the step.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from .block_manager import BlockManager
from .request import Sequence, Status


@dataclass
class SchedulerOutput:
    scheduled: list[tuple[Sequence, int]] = field(default_factory=list)  # (sequence, tokens this step)
    preempted: list[Sequence] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(n for _, n in self.scheduled)


class Scheduler:
    def __init__(self, block_manager: BlockManager, max_num_seqs: int, max_num_batched_tokens: int,
                 enable_chunked_prefill: bool):
        self.bm = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.enable_chunked_prefill = enable_chunked_prefill
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0
        self.prefix_query_tokens = 0
        self.prefix_hit_tokens = 0

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.max_num_batched_tokens
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            self.bm.free_outside_window(seq)  # before allocating: what no later query reads goes back first
            n = min(seq.num_wanted_tokens, budget, seq.max_chunk or budget)
            if n < seq.num_wanted_tokens and not self.enable_chunked_prefill:
                break
            while not self.bm.allocate(seq, seq.num_computed_tokens + n):
                victim = self.running.pop()
                self._preempt(victim)
                out.preempted.append(victim)
                if victim is seq:
                    break
            else:
                out.scheduled.append((seq, n))
                budget -= n
                i += 1
        # Admit new work only when nothing had to be preempted: otherwise we would take back
        # the blocks we just freed for a sequence that was already running.
        while not out.preempted and self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            # A request that wants prompt logprobs computes its whole prompt: cached tokens have no logits (vLLM's rule).
            cached_blocks, cached_hashes = (self.bm.find_cached_prefix(seq) if seq.params.prompt_logprobs is None
                                            else ([], []))
            num_cached = len(cached_blocks) * self.bm.block_size
            n = min(len(seq) - num_cached, budget)
            if n < len(seq) - num_cached and not self.enable_chunked_prefill:
                break
            if not self.bm.allocate(seq, num_cached + n, cached_blocks, cached_hashes):
                break
            self.waiting.popleft()
            self.prefix_query_tokens += len(seq)
            self.prefix_hit_tokens += num_cached
            if seq.metrics.first_scheduled_time is None:
                seq.metrics.first_scheduled_time = time.perf_counter()
                seq.metrics.num_cached_tokens = num_cached
            self.bm.update(seq, num_cached)
            seq.status = Status.RUNNING
            self.running.append(seq)
            out.scheduled.append((seq, n))
            budget -= n
        return out

    def _preempt(self, seq: Sequence) -> None:
        self.bm.free_sequence(seq)
        self.bm.update(seq, 0)
        seq.status = Status.WAITING
        seq.metrics.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)

    def finish(self, seq: Sequence, reason: str) -> None:
        seq.status = Status.FINISHED
        seq.finish_reason = reason
        self.bm.free_sequence(seq)
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
