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
- `forced_token`, with `StructuredOutputsConfig(jump_forward=True)`, after the last token the engine appended in
  a step: where the grammar's next state allows exactly one token (and has not terminated), that token is
  returned and the engine appends it without sampling it and without a forward pass for it (its KV is
  computed in the next step, in a chunk with the tokens after it). Lossless: that token has probability 1
  under any sampling setting, so greedy output is unchanged; a seeded sampled output may differ, since the
  forced step draws no random number. The mask filled to find it is reused by the next `mask_logits`;
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

import numpy as np
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
    any whitespace and one sample lost in newlines to max_tokens; docs/structured_output.md). `jump_forward`:
    where the grammar allows exactly one next token, the engine appends it without a forward pass or a draw
    (`StructuredOutputs.forced_token`); requests with `logprobs` are never jumped forward."""

    disable_any_whitespace: bool = True
    jump_forward: bool = False

    def __post_init__(self):
        for name in ("disable_any_whitespace", "jump_forward"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")

    def build(self, engine: LLM) -> StructuredOutputs:
        return StructuredOutputs(self, engine.tokenizer, engine.model.config.vocab_size, engine.eos_token_ids)


class GrammarState:
    """One request's matcher, and the bitmask rows it fills (one per verified row). Row 0 is kept while it holds
    the current state's mask (`filled`), so advance the matcher with `accept`, not `matcher.accept_token`, before
    calling `mask`, `allowed` or `forced`."""

    def __init__(self, compiled, vocab_size: int):
        import xgrammar as xgr

        self.matcher = xgr.GrammarMatcher(compiled)
        self.vocab_size = vocab_size
        self.bitmask = xgr.allocate_token_bitmask(1, vocab_size)
        self.num_tokens = 0  # tokens the matcher has accepted: the sequence's output tokens
        self.filled = False  # bitmask row 0 holds the mask of the matcher's current state

    def accept(self, token: int) -> bool:
        """The matcher accepts `token` for good (False: the grammar refuses it)."""
        self.filled = False
        if not self.matcher.accept_token(token):
            return False
        self.num_tokens += 1
        return True

    def words(self) -> np.ndarray:
        """Row 0 as int32 words, holding the current state's mask (filled unless it already holds it): token t
        is allowed where bit t % 32 of word t // 32 is set."""
        if not self.filled:
            self.matcher.fill_next_token_bitmask(self.bitmask, 0)
            self.filled = True
        return self.bitmask[0].numpy()

    def allowed(self) -> np.ndarray:
        """The current state's mask, one 0/1 per token."""
        return np.unpackbits(self.words().view(np.uint8), bitorder="little")[:self.vocab_size]  # little-endian

    def forced(self) -> int | None:
        """The one token the current state allows, or None (several, or the grammar has terminated)."""
        if self.matcher.is_terminated():
            return None
        words = self.words()
        if np.count_nonzero(words) != 1:  # under a microsecond, where counting every bit takes ~15
            return None
        i = int(np.flatnonzero(words)[0])
        word = int(words[i]) & 0xFFFFFFFF
        token = i * 32 + word.bit_length() - 1
        return token if word & (word - 1) == 0 and token < self.vocab_size else None

    def mask(self, logits: torch.Tensor, drafts: list[int]) -> bool:
        """Mask logits [1 + len(drafts), V] in place: row j with the state after drafts[:j]. Returns whether the
        grammar forbids one of the drafts."""
        import xgrammar as xgr

        if self.bitmask.shape[0] < logits.shape[0]:
            self.bitmask = xgr.allocate_token_bitmask(logits.shape[0], self.vocab_size)
            self.filled = False
        rows = advanced = 0
        forbidden = False
        try:
            while rows < logits.shape[0] and not self.matcher.is_terminated():
                if rows or not self.filled:  # row 0 may hold the current state's mask already (`forced`)
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
        self.filled = rows > 0  # the rollback restored the state whose mask is row 0
        apply_bitmask(logits[:rows], self.bitmask[:rows])
        return forbidden

    def num_allowed(self) -> int:
        """How many tokens the current state allows (0: the grammar's language is empty)."""
        return int(self.allowed().sum())


class StructuredOutputs(EngineExtension):
    name = "structured_outputs"
    requested_by = "structured_outputs"  # a request without a grammar runs none of this (lab.engine.extension)

    def __init__(self, config: StructuredOutputsConfig, tokenizer, vocab_size: int, eos_token_ids: set[int]):
        self.config, self.tokenizer = config, tokenizer
        self.vocab_size, self.eos_token_ids = vocab_size, eos_token_ids
        self.requests = 0  # constrained requests admitted
        self.mask_seconds = 0.0  # filling and applying masks (the cost per step the feature adds)
        self.masked_rows = 0
        self.forbidden_drafts = 0  # speculative drafts the grammar ruled out (each ends its round's acceptance)
        self.jump_forward_tokens = 0  # tokens appended without a forward pass (config.jump_forward)

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
        # The rows after the first verify the sequence's drafts, which the matcher has not accepted.
        drafts = seq.draft_token_ids[:logits.shape[0] - 1]
        if seq.num_output_tokens != state.num_tokens:
            raise RuntimeError(f"request {seq.request_id}: the grammar matcher has accepted {state.num_tokens} "
                               f"tokens but the sequence holds {seq.num_output_tokens}")
        self.forbidden_drafts += state.mask(logits, drafts)
        self.masked_rows += logits.shape[0]
        self.mask_seconds += time.perf_counter() - start

    def on_token(self, seq: Sequence, token: int) -> str | None:
        state = seq.grammar
        if state is None:
            return None
        if not state.accept(token):  # every row was masked, so this is a bug, not the model's
            log.error("request %d: the grammar refused token %d after %d tokens", seq.request_id, token,
                      state.num_tokens)
            return "error"
        return "stop" if state.matcher.is_terminated() else None

    def forced_token(self, seq: Sequence) -> int | None:
        state = seq.grammar
        if state is None or not self.config.jump_forward:  # the engine does not ask for requests with logprobs
            return None
        start = time.perf_counter()
        token = state.forced()  # fills row 0, which the next mask_logits reuses
        self.mask_seconds += time.perf_counter() - start
        self.jump_forward_tokens += token is not None
        return token

    def on_finish(self, seq: Sequence) -> None:
        seq.grammar = None

    def stats(self) -> dict:
        cache = self.grammars.cache if self.requests else {}
        return {"structured_requests": self.requests, "structured_mask_seconds": self.mask_seconds,
                "structured_masked_rows": self.masked_rows, "structured_forbidden_drafts": self.forbidden_drafts,
                "structured_jump_forward_tokens": self.jump_forward_tokens, "structured_cached_grammars": len(cache)}
