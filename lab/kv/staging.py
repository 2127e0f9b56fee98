"""Staging lanes: the exact K/V a quantized store keeps outside its pool, one lane per running sequence.

Per-channel keys (KIVI) keep one scale (and zero) per channel for each group of `token_group` tokens of a block; a
group is quantized when its last token is written, so until then its keys are read exactly. Those, and a
full-precision window, come from the staging area: per running sequence (a lane), its last
`staging_length(fmt)` tokens' exact K/V in the model's dtype, a ring indexed by position. The staging area is
outside the pool and sized by `max_num_seqs`, not by tokens. Exact copies live only in the lane of the sequence
that computed them: a sequence that starts from cached prefix blocks (a prefix hit, or a recompute after
preemption) reads the cached tokens inside its window quantized, since their exact copies are gone.

The lanes know sequences only through `StagedSequence`; whether one still runs (so its lane can be reused) the
engine says, with the `running` predicate it passes in (lab.kv does not import the engine).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch


class StagedSequence(Protocol):
    """What the lanes read of an engine sequence (`lab.engine.request.Sequence`)."""

    request_id: int
    num_computed_tokens: int
    block_table: list[int]


@dataclass
class StagingMetadata:
    """Where this step's exact K/V come from and go to. Rows index the step's exact source: its own tokens
    (rows 0 .. T-1), then the staged tokens it reads (`read_slots`, rows T ...)."""

    read_slots: torch.Tensor  # [R] staging slots of each sequence's exact tokens before this step
    write_slots: torch.Tensor  # [W] staging slots this step's tokens go to (each sequence's last ones)
    write_rows: torch.Tensor  # [W] their rows among the step's tokens
    decode_rows: torch.Tensor  # [Bd, S] source rows of each decode's exact span (0 where unused)
    decode_positions: torch.Tensor  # [Bd, S] their positions (-1 where unused)
    prefill_spans: list[tuple[torch.Tensor, int]]  # per prefill: source rows of its exact span, first position
    group_rows: torch.Tensor  # [G * groups] per-channel key groups completed this step: their tokens' rows,
    group_slots: torch.Tensor  # pool slots,
    group_positions: torch.Tensor  # positions,
    group_meta: torch.Tensor  # [groups] and the slot of each group's scales


class StagingLanes:
    """One lane per running sequence: a ring of its last `ring` positions' exact K/V. A sequence that restarts
    (preempted then recomputed, or rewound) holds nothing exact before where it restarts."""

    def __init__(self, num_lanes: int, block_size: int, ring: int, key_group: int, device: torch.device,
                 running: Callable[[StagedSequence], bool] | None = None):
        self.block_size, self.ring, self.group, self.device = block_size, ring, key_group, device
        self.running = running
        self.free = list(range(num_lanes))
        self.lanes: dict[int, tuple[StagedSequence, int]] = {}  # request id -> (sequence, lane)
        self.staged_from: dict[int, int] = {}  # request id -> first position its lane holds exactly
        self.next_position: dict[int, int] = {}

    def _lane(self, seq: StagedSequence, start: int, end: int) -> int:
        rid = seq.request_id
        if rid not in self.lanes:
            if not self.free and self.running is not None:  # lanes of sequences no longer running
                for other, (owner, lane) in list(self.lanes.items()):
                    if not self.running(owner):
                        self.free.append(lane)
                        del self.lanes[other], self.staged_from[other], self.next_position[other]
            if not self.free:
                raise RuntimeError(f"no free staging lane: all {len(self.lanes)} are held by running sequences "
                                   f"(the store has one lane per max_num_seqs)")
            self.lanes[rid] = (seq, self.free.pop())
        if self.next_position.get(rid) != start:
            self.staged_from[rid] = start
        self.next_position[rid] = end
        return self.lanes[rid][1]

    def metadata(self, scheduled: list[tuple[StagedSequence, int]], num_tokens: int) -> StagingMetadata:
        ring, dev = self.ring, self.device
        read_slots, write_slots, write_rows, decode_spans, prefill_spans = [], [], [], [], []
        groups = ([], [], [], [])  # rows, slots, positions, scale slot of each completed key group
        row = 0
        for seq, n in scheduled:
            start, end = seq.num_computed_tokens, seq.num_computed_tokens + n
            lane = self._lane(seq, start, end)
            first = max(self.staged_from[seq.request_id], start - ring)
            slot = [lane * ring + p % ring for p in range(first, end)] if ring else []
            # Source rows of positions first .. end - 1: the staged ones (after the step's tokens), then its own.
            span = list(range(num_tokens + len(read_slots), num_tokens + len(read_slots) + start - first))
            span += list(range(row, row + n))
            read_slots += slot[:start - first]
            keep = min(n, ring)
            write_slots += slot[len(slot) - keep:]
            write_rows += range(row + n - keep, row + n)
            if n == 1:
                decode_spans.append((span, first))
            else:
                prefill_spans.append((torch.tensor(span, dtype=torch.long, device=dev), first))
            self._completed_key_groups(seq, start, end, first, span, groups)
            row += n
        width = max((len(r) for r, _ in decode_spans), default=0)
        decode_rows = [r + [0] * (width - len(r)) for r, _ in decode_spans]
        decode_positions = [list(range(f, f + len(r))) + [-1] * (width - len(r)) for r, f in decode_spans]

        def t(x):
            return torch.tensor(x, dtype=torch.long, device=dev)

        return StagingMetadata(t(read_slots), t(write_slots), t(write_rows),
                               t(decode_rows).view(len(decode_spans), width),
                               t(decode_positions).view(len(decode_spans), width), prefill_spans, *map(t, groups))

    def _completed_key_groups(self, seq: StagedSequence, start: int, end: int, first: int, span: list[int],
                              groups: tuple[list, list, list, list]) -> None:
        """Per-channel keys: each group of `group` keys that completes in this step is quantized from its exact
        copies (its rows in the step's exact source)."""
        bs, group = self.block_size, self.group
        for last in range(start, end) if group else ():
            if (last + 1) % group:
                continue
            g = last + 1 - group
            if g < first:
                raise RuntimeError(f"per-channel key group at {g} began before the exact copies ({first})")
            groups[0].extend(span[g - first:g - first + group])
            groups[1].extend(seq.block_table[p // bs] * bs + p % bs for p in range(g, g + group))
            groups[2].extend(range(g, g + group))
            groups[3].append(seq.block_table[g // bs] * (bs // group) + g % bs // group)
