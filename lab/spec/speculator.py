"""Speculative decoding in the engine: draft, let the scheduler's one rule verify, accept, roll back.

Before a step, each running sequence about to decode (and whose request speculates) gets up to k drafted
tokens appended to its token ids; the scheduler then gives it drafts + 1 tokens, so the target scores them all
in one forward, a short prefill over the cached prefix (the extend attention of either backend). After the
forward, `lab.spec.verify` accepts a prefix of the drafts and adds a replacement or bonus token; the rejected
drafts are removed from the token ids and `num_computed_tokens` goes back to the last accepted one, so their KV
slots are rewritten by later tokens and no block holding them is ever hashed into the prefix cache. A draft
the scheduler did not schedule (budget, preemption) is withdrawn before the forward.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from lab.engine.sampling import probabilities
from lab.engine.sequence import Sequence, Status

from .drafters import NgramDrafter
from .verify import verify


@dataclass
class SpeculativeConfig:
    k: int = 4  # drafts per round
    min_n: int = 1  # n-gram lookup: shortest and longest trailing n-gram matched
    max_n: int = 3

    def __post_init__(self):
        if not isinstance(self.k, int) or self.k < 1:
            raise ValueError(f"k (drafts per round) must be a positive int, got {self.k!r}")


@dataclass
class SpecStats:
    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    accepted_per_round: list[int] = field(default_factory=list)
    reached: list[int] = field(default_factory=list)  # per draft position: rounds that verified it
    accepted_at: list[int] = field(default_factory=list)  # per draft position: rounds that accepted it

    def record(self, drafted: int, accepted: int) -> None:
        self.rounds, self.drafted, self.accepted = self.rounds + 1, self.drafted + drafted, self.accepted + accepted
        self.accepted_per_round.append(accepted)
        for i in range(min(accepted + 1, drafted)):  # positions up to the first rejection were verified
            if i == len(self.reached):
                self.reached.append(0)
                self.accepted_at.append(0)
            self.reached[i] += 1
            self.accepted_at[i] += i < accepted

    @property
    def acceptance_by_position(self) -> list[float]:
        return [a / r for a, r in zip(self.accepted_at, self.reached)]

    @property
    def conditional_acceptance(self) -> float:
        """a: accepted positions over verified positions (not vLLM's accepted / drafted)."""
        return sum(self.accepted_at) / sum(self.reached) if self.reached else float("nan")

    @property
    def mean_accepted_tokens_per_step(self) -> float:
        """Spec-Bench's metric: emitted tokens per verification round, the bonus or replacement included."""
        return self.accepted / self.rounds + 1 if self.rounds else float("nan")


class Speculator:
    def __init__(self, config: SpeculativeConfig, max_model_len: int):
        self.config, self.max_model_len = config, max_model_len
        self.drafter = NgramDrafter(config.min_n, config.max_n)
        self.drafts: dict[int, tuple[Sequence, int]] = {}  # request id -> (sequence, drafts appended)
        self.stats = SpecStats()

    def propose(self, running: list[Sequence]) -> None:
        for seq in running:
            p = seq.params
            if not p.speculate or seq.status is not Status.RUNNING or seq.num_computed_tokens != len(seq) - 1:
                continue
            # Never draft past what the request may still emit (the last emitted token is the bonus/correction).
            room = min(self.config.k, p.max_tokens - seq.num_output_tokens - 1, self.max_model_len - len(seq))
            draft = self.drafter.propose(seq.token_ids, room) if room > 0 else []
            if draft:
                seq.token_ids.extend(draft)
                self.drafts[seq.request_id] = (seq, len(draft))

    def withdraw_unscheduled(self, scheduled: list[tuple[Sequence, int]]) -> dict[int, int]:
        """Drafts beyond what the step scheduled are withdrawn; returns request id -> drafts in this step."""
        given = {seq.request_id: n for seq, n in scheduled}
        for rid, (seq, d) in list(self.drafts.items()):
            keep = min(d, max(given.get(rid, 0) - 1, 0)) if seq.status is Status.RUNNING else 0
            if keep < d:
                del seq.token_ids[len(seq) - (d - keep):]
            if keep:
                self.drafts[rid] = (seq, keep)
            else:
                del self.drafts[rid]
        return {rid: d for rid, (_, d) in self.drafts.items()}

    def accept(self, seq: Sequence, logits) -> list[int]:
        """Verify the sequence's drafts against the target's logits of its last drafts + 1 positions; roll the
        sequence back to its accepted prefix and return the tokens to emit (accepted drafts, then one more)."""
        _, d = self.drafts.pop(seq.request_id)
        base = len(seq) - d
        draft = seq.token_ids[base:]
        v = verify(draft, probabilities(logits, seq.params), None, seq.generator)
        del seq.token_ids[base:]
        seq.num_computed_tokens = base + v.num_accepted  # the KV of rejected drafts is dropped
        self.stats.record(d, v.num_accepted)
        return v.tokens
