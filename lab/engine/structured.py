"""Structured output in the engine: a request's grammar masks its logits, step by step (vLLM's
`SamplingParams(structured_outputs=StructuredOutputsParams(...))`; grammars from `lab.engine.grammar`).

A constrained request carries a `GrammarState` on its sequence (`seq.grammar`): an xgrammar matcher that has
consumed exactly the sequence's output tokens, never more. It plugs in through the engine's hooks
(`lab.engine.extension`), with no branch in the step loop:

- `check_request`, when the request is validated (before it is queued): the grammar is compiled (cached by its
  text) and the matcher created; a grammar that does not compile, or whose language is empty, is a ValueError
  naming the problem, and no other request is touched;
- `mask_logits`, on the rows of a sequence whose step reached its end, before any sampling or verification:
  row 0 gets the mask of the matcher's state, so greedy, temperature, top-k/top-p, penalties and seeds all draw
  from the constrained distribution. With speculative decoding, row j verifies draft j and gets the mask of the
  state after drafts 0 .. j-1: the matcher accepts the drafts tentatively and rolls back before returning, so
  every verification row is the target's constrained distribution; a draft the grammar forbids has probability
  zero there and is rejected, and the rows after it, which verification never reads, are left as they are;
- `on_token`, for each token the engine appends: the matcher accepts it; once it has terminated (it accepted a
  stop token where the grammar is complete) the request finishes with "stop", even under `ignore_eos`. EOS is
  masked wherever the grammar is not complete, so a request cannot stop early by EOS either;
- `on_finish`: the matcher is dropped.

Preemption by recompute keeps a sequence's tokens and so its matcher: the recomputed prompt ends at the same
state. Rejected drafts never reached the matcher for good (the rollback above), and prefix-cache hits and chunked
prefill change no token, so the matcher is never ahead of (or behind) the output.

`min_tokens` is refused with a grammar: it masks EOS, and where the grammar allows only EOS no token would be
left to sample.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from .extension import EngineExtension
from .grammar import apply_bitmask, grammars_for

if TYPE_CHECKING:
    from .llm import LLM
    from .request import Sequence

log = logging.getLogger(__name__)


@dataclass
class StructuredOutputsConfig:
    """The engine's side of structured output (vLLM's `StructuredOutputsConfig`). `disable_any_whitespace`: JSON
    comes out compact (", " and ": ", no newlines). vLLM allows any whitespace by default; the lab does not,
    since SmolLM2-135M spends tokens on it (on a nested schema, 8 seeds: 86-126 tokens compact, 119-168 with
    any whitespace and one sample lost in newlines to max_tokens; docs/structured_output.md)."""

    disable_any_whitespace: bool = True

    def __post_init__(self):
        if not isinstance(self.disable_any_whitespace, bool):
            raise ValueError(f"disable_any_whitespace must be True or False, got {self.disable_any_whitespace!r}")

    def build(self, engine: LLM) -> StructuredOutputs:
        return StructuredOutputs(self, engine.tokenizer, engine.model.config.vocab_size, engine.eos_token_ids)


class GrammarState:
    """One request's matcher, and the bitmask rows it fills (one per verified row)."""

    def __init__(self, compiled, vocab_size: int):
        import xgrammar as xgr

        self.matcher = xgr.GrammarMatcher(compiled)
        self.vocab_size = vocab_size
        self.bitmask = xgr.allocate_token_bitmask(1, vocab_size)
        self.num_tokens = 0  # tokens the matcher has accepted: the sequence's output tokens

    def mask(self, logits: torch.Tensor, drafts: list[int]) -> bool:
        """Mask logits [1 + len(drafts), V] in place: row j with the state after drafts[:j]. Returns whether the
        grammar forbids one of the drafts."""
        import xgrammar as xgr

        if self.bitmask.shape[0] < logits.shape[0]:
            self.bitmask = xgr.allocate_token_bitmask(logits.shape[0], self.vocab_size)
        rows = advanced = 0
        forbidden = False
        try:
            while rows < logits.shape[0] and not self.matcher.is_terminated():
                self.matcher.fill_next_token_bitmask(self.bitmask, rows)
                rows += 1
                if rows > len(drafts):
                    break
                if not self.matcher.accept_token(drafts[rows - 1]):
                    forbidden = True  # verification rejects it for sure: the rows after it are never read
                    break
                advanced += 1
        finally:
            if advanced:
                self.matcher.rollback(advanced)
        apply_bitmask(logits[:rows], self.bitmask[:rows])
        return forbidden

    def num_allowed(self) -> int:
        """How many tokens the current state allows (0: the grammar's language is empty)."""
        self.matcher.fill_next_token_bitmask(self.bitmask, 0)
        row = torch.zeros(1, self.vocab_size)
        apply_bitmask(row, self.bitmask[:1])
        return int(torch.isfinite(row).sum())


class StructuredOutputs(EngineExtension):
    name = "structured_outputs"

    def __init__(self, config: StructuredOutputsConfig, tokenizer, vocab_size: int, eos_token_ids: set[int]):
        self.config, self.tokenizer = config, tokenizer
        self.vocab_size, self.eos_token_ids = vocab_size, eos_token_ids
        self.requests = 0  # constrained requests admitted
        self.mask_seconds = 0.0  # filling and applying masks (the cost per step the feature adds)
        self.masked_rows = 0
        self.forbidden_drafts = 0  # speculative drafts the grammar ruled out (each ends its round's acceptance)

    @property
    def grammars(self):
        """The tokenizer's compiler and cache, built on the first constrained request (`grammar.grammars_for`)."""
        return grammars_for(self.tokenizer, self.vocab_size, self.eos_token_ids)

    def check_request(self, seq: Sequence) -> None:
        spec = seq.params.structured_outputs
        if spec is None:
            return
        if self.tokenizer is None:
            raise ValueError("structured output needs the model's tokenizer to map grammar text to tokens; "
                             "this model has none")
        if seq.params.min_tokens:
            raise ValueError("min_tokens cannot be combined with structured_outputs: the grammar decides where "
                             "the output may end")
        compiled = self.grammars.compile(spec, any_whitespace=not self.config.disable_any_whitespace)
        state = GrammarState(compiled, self.vocab_size)
        if state.num_allowed() == 0:
            raise ValueError(f"the {spec.kind} constraint accepts no output at all (its language is empty): "
                             f"{spec.text[:200]!r}")
        seq.grammar = state
        self.requests += 1

    def mask_logits(self, seq: Sequence, logits: torch.Tensor) -> None:
        state = seq.grammar
        if state is None:
            return
        start = time.perf_counter()
        # The rows after the first verify the sequence's last tokens: drafts the matcher has not accepted.
        drafts = seq.token_ids[len(seq) - logits.shape[0] + 1:]
        if seq.num_output_tokens - len(drafts) != state.num_tokens:
            raise RuntimeError(f"request {seq.request_id}: the grammar matcher has accepted {state.num_tokens} "
                               f"tokens but the sequence holds {seq.num_output_tokens - len(drafts)}")
        self.forbidden_drafts += state.mask(logits, drafts)
        self.masked_rows += logits.shape[0]
        self.mask_seconds += time.perf_counter() - start

    def on_token(self, seq: Sequence, token: int) -> str | None:
        state = seq.grammar
        if state is None:
            return None
        if not state.matcher.accept_token(token):  # every row was masked, so this is a bug, not the model's
            log.error("request %d: the grammar refused token %d after %d tokens", seq.request_id, token,
                      state.num_tokens)
            return "error"
        state.num_tokens += 1
        return "stop" if state.matcher.is_terminated() else None

    def on_finish(self, seq: Sequence) -> None:
        seq.grammar = None

    def stats(self) -> dict:
        cache = self.grammars.cache if self.requests else {}
        return {"structured_requests": self.requests, "structured_mask_seconds": self.mask_seconds,
                "structured_masked_rows": self.masked_rows, "structured_forbidden_drafts": self.forbidden_drafts,
                "structured_cached_grammars": len(cache)}
