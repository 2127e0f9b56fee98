"""Speculative decoding in the engine: draft, let the scheduler's one rule verify, accept, roll back.

Before a step, each running sequence about to decode (and whose request speculates) gets up to k drafted
tokens from the drafter (`lab.speculative.drafters`: n-gram lookup, the target's first layers, a quantized copy,
or a separate model), reported as `Propose` intents: the engine puts them in the sequence's `draft_token_ids`
and the scheduler gives it drafts + 1 tokens, so the target scores them all in one forward, a short prefill over
the cached prefix (the extend attention of either backend); drafts the step had no room for (budget, preemption)
are dropped by the engine before the forward. After it, `lab.speculative.verify` accepts a prefix of the drafts
and adds a replacement or bonus token; the engine then moves `num_computed_tokens` back to the last accepted
one (its one update path), so the rejected drafts' KV slots are rewritten by later tokens and no block holding
them is ever hashed into the prefix cache. This module proposes and verifies; it never moves a sequence.

The acceptance-threshold policy (the deployment article, seeds/003 section 5, switches speculation off below
a = 0.55) is per request and adaptive: a request whose a over its last rounds falls below `min_acceptance`
decodes plainly for a while, then probes again, pausing twice as long after each failed probe. Per category,
`lab.studies.spec_acceptance` decides it from measured a.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from lab.engine.extension import EngineExtension, Propose
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

    @property
    def across_processes(self) -> bool:
        """Tensor or pipeline parallelism takes n-gram drafts only: a draft model would be whole on rank 0."""
        return self.method == "ngram"

    def build(self, engine) -> Speculator:
        """The engine extension (`lab.engine.extension`) for `engine`."""
        if not engine.runner.kv.capabilities.speculation:  # e.g. staged exact copies, left behind by a rollback
            raise ValueError(f"speculative decoding needs a KV format without staged exact copies; kv_cache_dtype "
                             f"{engine.config.kv_cache_dtype!r} keeps a full-precision window or per-channel keys")
        c = engine.config
        return Speculator(self, engine.model, engine.num_kv_blocks, c.block_size, c.max_model_len,
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
    rewinds = True  # its verification rolls num_computed_tokens back past the rejected drafts

    def __init__(self, config: SpeculativeConfig, target: LlamaModel, num_blocks: int, block_size: int,
                 max_model_len: int, tokenizer=None):
        self.config, self.max_model_len = config, max_model_len
        self.drafter = build_drafter(config, target, num_blocks, block_size, tokenizer)
        self.drafts: dict[int, Draft] = {}  # request id -> its latest drafts (their probabilities, to verify)
        self.totals = SpecStats()  # every round of every request
        self.draft_seconds = 0.0  # wall time in the drafter (c is this per draft forward over a target step)
        self.pauses = 0  # times the adaptive policy turned a request's speculation off
        self.probes: dict[int, SpecStats] = {}  # request id -> rounds since its policy window began
        self.paused_until: dict[int, int] = {}  # request id -> output length at which it drafts again
        self.failed_probes: dict[int, int] = {}  # request id -> probes failed in a row

    # ---- engine hooks ----------------------------------------------------------------------------
    def before_schedule(self, step) -> list[Propose]:
        return self.propose(step.running)

    def process_logits(self, seq: Sequence, logits) -> list[int] | None:
        return self.accept(seq, logits) if seq.draft_token_ids else None

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
    def propose(self, running: list[Sequence]) -> list[Propose]:
        """Drafts for the running sequences about to decode whose requests speculate (and whose policy has not
        paused them), as intents: the engine attaches them and keeps those the step has room for."""
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
            return []
        t = time.perf_counter()
        drafts = self.drafter.propose(requests)
        self.draft_seconds += time.perf_counter() - t
        intents = []
        for seq, _ in requests:
            if (draft := drafts.get(seq.request_id)) is not None:
                self.drafts[seq.request_id] = draft
                intents.append(Propose(seq, list(draft.tokens)))
        return intents

    def accept(self, seq: Sequence, logits) -> list[int]:
        """Verify the drafts the step kept (a prefix of those proposed) against the target's logits of the
        sequence's last drafts + 1 positions; return the tokens to emit (accepted drafts, then one more). The
        engine drops the KV of the rejected ones (`LLM._execute`)."""
        proposed = self.drafts[seq.request_id]
        d = len(seq.draft_token_ids)
        probs = None if proposed.probs is None else proposed.probs[:d]
        base = len(seq)
        v = verify(list(seq.draft_token_ids), probabilities(logits, seq.params), probs, seq.generator(logits.device))
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
        self.probes.pop(seq.request_id, None)
        self.paused_until.pop(seq.request_id, None)
        self.failed_probes.pop(seq.request_id, None)
        self.drafter.forget(seq.request_id)
