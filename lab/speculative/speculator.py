"""Speculative decoding in the engine: draft, let the scheduler's one rule verify, accept, roll back.

Before a step, each running sequence about to decode (and whose request speculates) gets up to k drafted
tokens appended to its token ids, from the drafter (`lab.speculative.drafters`: n-gram lookup, the target's first
layers, a quantized copy, or a separate model); the scheduler then gives it drafts + 1 tokens, so the target
scores them all in one forward, a short prefill over the cached prefix (the extend attention of either
backend). After the forward, `lab.speculative.verify` accepts a prefix of the drafts and adds a replacement or bonus
token; the rejected drafts are removed from the token ids and `num_computed_tokens` goes back to the last
accepted one, so their KV slots are rewritten by later tokens and no block holding them is ever hashed into
the prefix cache. A draft the scheduler did not schedule (budget, preemption) is withdrawn before the forward.

The acceptance-threshold policy (the deployment article, seeds/003 section 5, switches speculation off below
a = 0.55) is per request and adaptive: a request whose a over its last rounds falls below `min_acceptance`
decodes plainly for a while, then probes again, pausing twice as long after each failed probe. Per category,
`lab.studies.spec_acceptance` decides it from measured a.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from lab.engine.extension import EngineExtension
from lab.engine.request import Sequence, Status
from lab.engine.sampler import probabilities
from lab.models.llama import LlamaModel

from .drafters import Draft, Drafter, ModelDrafter, NgramDrafter, layer_skip_model, quantized_copy
from .verify import verify

DRAFTERS = ("ngram", "layerskip", "quantized", "model")


@dataclass
class SpeculativeConfig:
    k: int = 4  # drafts per round
    method: str = "ngram"  # one of DRAFTERS
    min_n: int = 1  # ngram: shortest and longest trailing n-gram matched
    max_n: int = 3
    draft_layers: int = 8  # layerskip: the target's first N layers draft
    draft_quant: str = "rtn"  # quantized: lab.quant method (rtn, gptq, awq), bits and group size
    draft_bits: int = 4
    draft_group_size: int | None = 64
    # "model": the draft model (sharing the target's vocabulary); "layerskip" / "quantized": one already built
    # by layer_skip_model / quantized_copy, to share between engines (else it is built from the target).
    draft_model: LlamaModel | None = None
    # Adaptive policy: a request whose conditional acceptance over its last `probe_rounds` rounds is below
    # `min_acceptance` decodes plainly for `backoff_tokens` tokens, then probes again; each probe that fails
    # again doubles the pause, up to `max_backoff_tokens` (None: always draft).
    min_acceptance: float | None = None
    probe_rounds: int = 8
    backoff_tokens: int = 32
    max_backoff_tokens: int = 1024

    def __post_init__(self):
        if not isinstance(self.k, int) or self.k < 1:
            raise ValueError(f"k (drafts per round) must be a positive int, got {self.k!r}")
        if self.method not in DRAFTERS:
            raise ValueError(f"method {self.method!r} is not one of {DRAFTERS}")
        if self.method == "model" and self.draft_model is None:
            raise ValueError('method "model" needs draft_model (a LlamaModel sharing the target\'s vocabulary)')
        if self.min_acceptance is not None and not 0 <= self.min_acceptance <= 1:
            raise ValueError(f"min_acceptance must be in [0, 1] or None, got {self.min_acceptance}")
        for name in ("probe_rounds", "backoff_tokens", "max_backoff_tokens"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"{name} must be a positive int, got {getattr(self, name)!r}")

    def build(self, engine) -> Speculator:
        """The engine extension (`lab.engine.extension`) for `engine`."""
        if engine.runner.kv.stages:  # a rollback would leave the exact copies behind the rewound position
            raise ValueError(f"speculative decoding needs a KV format without staged exact copies; kv_cache_dtype "
                             f"{engine.config.kv_cache_dtype!r} keeps a full-precision window or per-channel keys")
        c = engine.config
        return Speculator(self, engine.model, engine.block_manager.num_blocks, c.block_size, c.max_model_len,
                          engine.tokenizer)


def build_drafter(config: SpeculativeConfig, target: LlamaModel, num_blocks: int, block_size: int,
                  tokenizer=None) -> Drafter:
    if config.method == "ngram":
        return NgramDrafter(config.min_n, config.max_n)
    draft = config.draft_model
    if draft is None and config.method == "layerskip":
        draft = layer_skip_model(target, config.draft_layers)
    elif draft is None:
        draft = quantized_copy(target, tokenizer, config.draft_quant, config.draft_bits, config.draft_group_size)
    if draft.config.vocab_size != target.config.vocab_size:
        raise ValueError(f"the draft model's vocabulary ({draft.config.vocab_size}) is not the target's "
                         f"({target.config.vocab_size}): drafts must be the target's token ids")
    return ModelDrafter(draft, num_blocks, block_size, config.method)


@dataclass
class SpecStats:
    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    accepted_per_round: list[int] = field(default_factory=list)
    drafted_per_round: list[int] = field(default_factory=list)
    reached: list[int] = field(default_factory=list)  # per draft position: rounds that verified it
    accepted_at: list[int] = field(default_factory=list)  # per draft position: rounds that accepted it

    def record(self, drafted: int, accepted: int) -> None:
        self.rounds, self.drafted, self.accepted = self.rounds + 1, self.drafted + drafted, self.accepted + accepted
        self.accepted_per_round.append(accepted)
        self.drafted_per_round.append(drafted)
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

    def as_dict(self) -> dict:
        return {"rounds": self.rounds, "drafted": self.drafted, "accepted": self.accepted,
                "conditional_acceptance": self.conditional_acceptance,
                "accepted_over_drafted (vLLM)": self.accepted / self.drafted if self.drafted else float("nan"),
                "mean_accepted_tokens_per_step": self.mean_accepted_tokens_per_step,
                "acceptance_by_position": self.acceptance_by_position}


class Speculator(EngineExtension):
    """Drafts before scheduling, trims what was not scheduled, verifies after the forward (engine hooks)."""

    name = "speculative"
    rewinds = True  # rejected drafts roll num_computed_tokens back

    def __init__(self, config: SpeculativeConfig, target: LlamaModel, num_blocks: int, block_size: int,
                 max_model_len: int, tokenizer=None):
        self.config, self.max_model_len = config, max_model_len
        self.drafter = build_drafter(config, target, num_blocks, block_size, tokenizer)
        self.drafts: dict[int, tuple[Sequence, Draft]] = {}  # request id -> (sequence, drafts appended)
        self.totals = SpecStats()  # every round of every request
        self.draft_seconds = 0.0  # wall time in the drafter (c is this per draft forward over a target step)
        self.pauses = 0  # times the adaptive policy turned a request's speculation off
        self.probes: dict[int, SpecStats] = {}  # request id -> rounds since its policy window began
        self.paused_until: dict[int, int] = {}  # request id -> output length at which it drafts again
        self.failed_probes: dict[int, int] = {}  # request id -> probes failed in a row

    # ---- engine hooks ----------------------------------------------------------------------------
    def before_schedule(self, step) -> None:
        self.propose(step.running)

    def after_schedule(self, step, scheduled: list[tuple[Sequence, int]]) -> dict[int, int]:
        return self.withdraw_unscheduled(scheduled)

    def process_logits(self, seq: Sequence, logits) -> list[int] | None:
        return self.accept(seq, logits) if seq.request_id in self.drafts else None

    def on_finish(self, seq: Sequence) -> None:
        self.finish(seq)

    def stats(self) -> dict:
        s = self.totals
        return {"spec_rounds": s.rounds, "spec_drafted": s.drafted, "spec_accepted": s.accepted,
                "spec_conditional_acceptance": s.conditional_acceptance,
                "spec_acceptance_by_position": s.acceptance_by_position,
                "spec_mean_accepted_tokens_per_step": s.mean_accepted_tokens_per_step,
                "spec_draft_seconds": self.draft_seconds, "spec_policy_pauses": self.pauses,
                **{f"spec_draft_{k}": v for k, v in self.drafter.stats().items()}}

    # ---- drafting and verification ----------------------------------------------------------------
    def propose(self, running: list[Sequence]) -> None:
        requests = []
        for seq in running:
            p = seq.params
            if not p.speculate or seq.status is not Status.RUNNING or seq.num_computed_tokens != len(seq) - 1:
                continue
            if self.paused_until.get(seq.request_id, 0) > seq.num_output_tokens:
                continue
            # Never draft past what the request may still emit (the last emitted token is the bonus/correction).
            room = min(self.config.k, p.max_tokens - seq.num_output_tokens - 1, self.max_model_len - len(seq))
            if room > 0:
                requests.append((seq, room))
        if not requests:
            return
        t = time.perf_counter()
        drafts = self.drafter.propose(requests)
        self.draft_seconds += time.perf_counter() - t
        for seq, _ in requests:
            if (draft := drafts.get(seq.request_id)) is not None:
                seq.draft_token_ids = list(draft.tokens)
                self.drafts[seq.request_id] = (seq, draft)

    def withdraw_unscheduled(self, scheduled: list[tuple[Sequence, int]]) -> dict[int, int]:
        """Drafts beyond what the step scheduled are withdrawn; returns request id -> drafts in this step."""
        given = {seq.request_id: n for seq, n in scheduled}
        for rid, (seq, draft) in list(self.drafts.items()):
            d = len(draft.tokens)
            keep = min(d, max(given.get(rid, 0) - 1, 0)) if seq.status is Status.RUNNING else 0
            del seq.draft_token_ids[keep:]
            if keep:
                self.drafts[rid] = (seq, Draft(draft.tokens[:keep], None if draft.probs is None else
                                               draft.probs[:keep]))
            else:
                del self.drafts[rid]
        return {rid: len(draft.tokens) for rid, (_, draft) in self.drafts.items()}

    def accept(self, seq: Sequence, logits) -> list[int]:
        """Verify the sequence's drafts against the target's logits of its last drafts + 1 positions; roll the
        sequence back to its accepted prefix and return the tokens to emit (accepted drafts, then one more)."""
        _, draft = self.drafts.pop(seq.request_id)
        d = len(draft.tokens)
        base = len(seq)
        v = verify(draft.tokens, probabilities(logits, seq.params), draft.probs, seq.generator(logits.device))
        seq.draft_token_ids = []
        seq.num_computed_tokens = base + v.num_accepted  # the KV of rejected drafts is dropped
        self.totals.record(d, v.num_accepted)
        if seq.metrics.speculation is None:
            seq.metrics.speculation = SpecStats()
        seq.metrics.speculation.record(d, v.num_accepted)
        self._apply_policy(seq, d, v.num_accepted, base - seq.num_prompt_tokens + len(v.tokens))
        return v.tokens

    def _apply_policy(self, seq: Sequence, drafted: int, accepted: int, num_output_tokens: int) -> None:
        c = self.config
        if c.min_acceptance is None:
            return
        probe = self.probes.setdefault(seq.request_id, SpecStats())
        probe.record(drafted, accepted)
        if probe.rounds < c.probe_rounds:
            return
        rid = seq.request_id
        if probe.conditional_acceptance < c.min_acceptance:
            failed = self.failed_probes.get(rid, 0)
            self.paused_until[rid] = num_output_tokens + min(c.backoff_tokens << failed, c.max_backoff_tokens)
            self.failed_probes[rid] = failed + 1
            self.pauses += 1
        else:
            self.failed_probes.pop(rid, None)
        del self.probes[rid]

    def finish(self, seq: Sequence) -> None:
        """The request finished or was aborted: forget its drafts and policy state."""
        self.drafts.pop(seq.request_id, None)
        seq.draft_token_ids = []
        self.probes.pop(seq.request_id, None)
        self.paused_until.pop(seq.request_id, None)
        self.failed_probes.pop(seq.request_id, None)
        self.drafter.forget(seq.request_id)
