"""Timing probes: one forward of the engine's own model runner, placed where a study needs it, outside the step
loop. The speculative study times a target step, a verification forward and a draft step this way; the replay
study times recomputing a window of a request the engine holds. Each leaves the pool and the request as it
found them, so the engine goes on serving after it.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch

from .block_manager import BlockManager
from .request import SamplingParams, Sequence


@contextmanager
def forward_probe(runner, block_manager: BlockManager, context: int, n: int, draft: bool = False):
    """A step of n new tokens after `context` cached ones (batch 1), as the engine runs it, to call and time
    (`lab.machine.timing.probe_seconds`): a target step returns the logits of its last row (n = 1) or of all n rows for
    verification (n - 1 drafts: the LM head runs on n rows); a draft step (`draft`) its last row's logits. The
    prefix's KV is computed on entry and its blocks go back on exit. The engine's sampling or verification of
    those logits is not in it (an argmax, or a few rows of softmax: microseconds)."""
    if context < 0 or n < 1:
        raise ValueError(f"need context >= 0 and n >= 1; got {context}, {n}")
    vocab = runner.model.config.vocab_size
    ids = torch.randint(0, vocab, (context + n,), generator=torch.Generator().manual_seed(context + n)).tolist()
    seq = Sequence(ids, SamplingParams(max_tokens=1))
    if not block_manager.allocate(seq, context + n):
        raise ValueError(f"{context + n} tokens need {block_manager.blocks_for(context + n)} blocks; "
                         f"{block_manager.num_free_blocks} are free")
    try:
        if context:
            runner.execute([(seq, context)])  # the prefix's KV, which the timed forwards read
        block_manager.update(seq, context)
        rows = {} if draft else {seq.request_id: n - 1}
        yield lambda: runner.execute([(seq, n)], rows)
    finally:
        block_manager.free_sequence(seq)


def recompute(runner, block_manager: BlockManager, seq: Sequence, start: int, n: int) -> None:
    """Run the forward over positions [start, start + n) of `seq`, whose KV is computed past them, again: their
    KV is rewritten with the same values (a replay's recompute), and its progress is as before."""
    done = seq.num_computed_tokens
    if not (0 <= start and start + n <= done):
        raise ValueError(f"positions {start} .. {start + n} are not all computed: request {seq.request_id} has "
                         f"{done}")
    block_manager.update(seq, start)
    try:
        runner.execute([(seq, n)])
    finally:
        block_manager.update(seq, done)
