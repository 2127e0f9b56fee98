"""Engine extensions: how a feature (speculative decoding, replay, structured output, ...) plugs into the step
loop.

The engine owns a small set of hooks and calls every extension at each of them; a feature is a module that
implements them, never a branch in `LLM.step` (vLLM v1 keeps speculative decoding and structured output out
of its core loop the same way; `transformers` applies each sampling-time feature as a `LogitsProcessor`).
The engine imports no feature: an option such as `LLM(speculative=SpeculativeConfig(...))` is an
`ExtensionConfig`, whose `build(engine)` returns the extension.

Before any step, `check_request(seq)` runs as a request is validated (`LLM.make_sequence`, before it is queued;
in a server, on the event loop's thread): a ValueError refuses the request alone; an extension may attach its
per-request state to the sequence (structured output's grammar matcher).

Who hears what. The per-request hooks (`check_request`, `mask_logits`, `process_logits`, `on_token`,
`forced_token`, `on_finish`) run for the requests an extension takes: all of them, or, for an extension that
names the `SamplingParams` field a request sets to ask for it (`requested_by`: structured output's
`"structured_outputs"`), only those that set it. The sequence keeps the list (`Sequence.extensions`), so a request
that asks for nothing runs no extension's code (vLLM v1 likewise builds a grammar bitmask only for the requests
that have a grammar). The step hooks run for the extensions that implement them (`step_hooks`): the defaults
below, which do nothing, are never called.

One step, in order (`lab.engine.llm.LLM.step`):

The step hooks (`before_schedule`, `after_schedule`, `after_step`) receive a `StepView`, not the `LLM`: the
running sequences, the KV pool's free share, lookup and queueing of a request. An extension sees what a step
lets it change and nothing else (vLLM v1's schedulers and workers pass such narrow views too); `build(engine)`
alone sees the whole engine, to validate the options against it once.

1. `before_schedule(step) -> intents`: report what the extension wants of the sequences before the scheduler
   sees them, as intents the engine applies (`Rewind`: drop the KV of a window to recompute it, replay;
   `Propose`: drafts to verify, speculation). No extension changes a sequence's progress itself: one method
   does (`lab.engine.block_manager.BlockManager.update`), as vLLM v1's `update_from_output` applies every
   change, so a new feature need not know another's rewinds;
2. the scheduler's one rule picks (sequence, tokens) pairs; the engine keeps the drafts the step has room
   for (a sequence given n tokens verifies n - 1 of them) and asks the runner for one more logit row per draft;
3. `after_schedule(step, scheduled)`: bookkeeping once the step is chosen (replay's hidden-state store);
4. the model runner runs the forward and returns the logits the step needs (`ModelOutput`);
5. `mask_logits(seq, logits)`: every extension may mask, in place, the rows of a sequence whose step reached
   its end, before anything samples from them (structured output's grammar); with d drafts there are d + 1
   rows, and row j predicts the token after draft j - 1 (row 0: after the last verified token);
   `process_logits(seq, logits) -> tokens | None`: an extension may take over such a sequence
   (verification: accept a prefix of the drafts and return the tokens to emit); the engine samples the
   others. The drafts after the first rejected one hold no valid KV: the engine drops them (the tokens
   returned are the accepted drafts and one more, so d + 1 - len(tokens) were rejected, vLLM's count);
6. the engine appends the emitted tokens, calling `on_token(seq, token) -> finish reason | None` after each (an
   extension may end the request there: a grammar that is complete); after the last one, if the request goes
   on and has no `logprobs` (each entry comes from a forward's logits), `forced_token(seq) -> token | None`: a
   token the request must emit next with certainty (structured output's jump-forward, where the grammar
   allows one token only), which the engine appends without sampling it and without a forward pass for it,
   through the same loop (`on_token`, stop conditions), asking again after it; its KV is computed in the next
   step with the tokens after it, as a chunk. Then the engine hashes the full blocks and finishes what stopped;
7. `on_finish(seq)`: for every request that finished *or was aborted* (the engine calls it from the one
   place that ends requests, so no extension can miss one);
8. `after_step(step)`: bookkeeping once the step's tokens are in.

`stats()` is merged into `LLM.stats()`; `health()` answers `LLM.health()` (a server's watchdog asks it whether
the engine can still serve); `close()` runs on `LLM.close()` (hooks removed, pools released).
An extension whose intents move `num_computed_tokens` backwards sets `rewinds = True`: two of them in one
engine would each decide on positions the other drops (a replayed window's drafts), so the engine refuses the
pair by name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch

if TYPE_CHECKING:
    from .llm import LLM
    from .request import Sequence


@dataclass(frozen=True)
class Rewind:
    """The KV of `seq`'s positions from `to` on is dropped, to be recomputed from its token ids, at most
    `max_chunk` tokens a step until the sequence samples its next token (replay's window)."""

    seq: Sequence
    to: int
    max_chunk: int | None = None


@dataclass(frozen=True)
class Propose:
    """Draft tokens for `seq` to verify in its next step (speculation); the step may keep fewer."""

    seq: Sequence
    tokens: list[int]


class StepView:
    """What a step hook may read and do; built once per engine (`LLM.step_view`)."""

    def __init__(self, engine: LLM):
        self._engine = engine

    @property
    def running(self) -> list[Sequence]:
        """The scheduler's running sequences, in order: a hook may change a sequence, not the list."""
        return self._engine.scheduler.running

    def free_block_share(self) -> float:
        """Free KV blocks over all blocks."""
        bm = self._engine.block_manager
        return bm.num_free_blocks / bm.num_blocks

    def sequence(self, request_id: int) -> Sequence | None:
        """The live sequence of a request, None once it ended."""
        return self._engine.sequences.get(request_id)

    def enqueue(self, seq: Sequence) -> None:
        """Queue a validated sequence (a held sample of `n`)."""
        self._engine.enqueue(seq)


class EngineExtension:
    """Every hook is optional: the defaults do nothing."""

    name = "extension"
    rewinds = False  # moves num_computed_tokens backwards (see the module docstring)
    requested_by: str | None = None  # the SamplingParams field that asks for it; None: it takes every request

    def check_request(self, seq: Sequence) -> None:
        """Validate a new request (ValueError refuses it) and attach per-request state; nothing is queued yet."""

    def before_schedule(self, step: StepView) -> list[Rewind | Propose] | None:
        """What this extension asks of the running sequences before the step is scheduled (the engine applies
        it)."""
        return None

    def after_schedule(self, step: StepView, scheduled: list[tuple[Sequence, int]]) -> None:
        pass

    def mask_logits(self, seq: Sequence, logits: torch.Tensor) -> None:
        """Change `logits` [1 + extra rows, vocab] in place before they are sampled or verified."""

    def process_logits(self, seq: Sequence, logits: torch.Tensor) -> list[int] | None:
        """`logits` [1 + extra rows, vocab] of the sequence's last positions this step."""
        return None

    def on_token(self, seq: Sequence, token: int) -> str | None:
        """`token` was just appended to `seq`; a finish reason ends the request there."""
        return None

    def forced_token(self, seq: Sequence) -> int | None:
        """A token `seq` must emit next with certainty; the engine appends it without a forward pass for it."""
        return None

    def on_finish(self, seq: Sequence) -> None:
        pass

    def after_step(self, step: StepView) -> None:
        pass

    def stats(self) -> dict:
        return {}

    def health(self) -> str | None:
        """Why the engine cannot serve any longer (a parallel rank died or is stopped), or None. Called from a
        server's watchdog thread, between steps and during one: it must only read (`LLM.health`)."""
        return None

    def close(self) -> None:
        pass


STEP_HOOKS = ("before_schedule", "after_schedule", "after_step")


def step_hooks(extensions) -> dict[str, list]:
    """Each step hook's bound methods, in the extensions' order, for the extensions that override the default."""
    return {hook: [getattr(ext, hook) for ext in extensions
                   if getattr(type(ext), hook) is not getattr(EngineExtension, hook)] for hook in STEP_HOOKS}


class ExtensionConfig(Protocol):
    """What `LLM(...)` takes for a feature. Optionally `across_processes: bool` (True if absent): whether the
    feature runs under tensor or pipeline parallelism; the engine's options refuse it by name where not."""

    def build(self, engine: LLM) -> EngineExtension:
        """Validate against the engine (its model, KV format, options) and return the extension."""
