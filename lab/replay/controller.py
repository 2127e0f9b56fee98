"""The replay controller of the seed article (`000_6360c6a068e5cdc2.txt`, sections 4.1-4.2 and 5.1), in the
engine.

The article's controller keeps, per sequence, the range of positions whose KV is cached; before a decode step
it asks `should_replay` (no cached range, the position past its end, memory headroom below 20%, or bandwidth
use above 80%; and, from its troubleshooting section, only once the position is past 70% of the context) and,
if so, recomputes `replay_window` = the last W positions, in chunks, without writing the result back by
default (the cached range then slides, and the next step replays again).

In the engine, dropping a window's KV and recomputing it from token ids is a rewind, which this controller
reports (`Rewind`) and the engine applies: the sequence's `num_computed_tokens` goes back by W, and the scheduler's single rule gives it the W dropped tokens plus its
new one, as a chunk that attends over the cached prefix (chunked at `chunk` tokens). Without write-back the
window is dropped again after each step, so every decode step recomputes it; with write-back it is recomputed
once and kept until the next trigger. With source="hidden" (HCache, `lab.replay.hidden`) the window's K/V
are instead zeroed and rebuilt in place from the layer inputs kept for it, by the K/V projections alone, before
the step decodes as usual (the rebuilt K/V stay: write-back is inherent there). Greedy outputs must not change
(tested): only where the K/V come from does.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from lab.engine.extension import EngineExtension, Rewind
from lab.engine.request import Sequence, Status


@dataclass
class ReplayConfig:
    window: int = 32  # W: recent tokens whose KV is dropped and recomputed (the article: 16-64, start at 32)
    chunk: int | None = None  # tokens recomputed per step (the article: W or W/2, at most 64); None: W
    memory_headroom: float = 0.2  # replay when the free share of the KV pool falls below this
    bandwidth_utilization: float = 0.8  # ... or when the estimated bandwidth use exceeds this
    min_position: float = 0.7  # ... and only past this share of the sequence's context (prompt + max_tokens)
    write_back: bool = False  # keep the recomputed KV (the article's default: no)
    always: bool = False  # ignore the pressure triggers (a study forcing replay on every step)
    source: str = "tokens"  # recompute from token ids (every layer), or "hidden": from kept layer inputs (HCache)

    def __post_init__(self):
        if not isinstance(self.window, int) or self.window < 1:
            raise ValueError(f"replay window must be a positive int, got {self.window!r}")
        if self.chunk is not None and (not isinstance(self.chunk, int) or self.chunk < 1):
            raise ValueError(f"replay chunk must be a positive int or None, got {self.chunk!r}")
        if self.source not in ("tokens", "hidden"):
            raise ValueError(f"replay source must be 'tokens' or 'hidden', got {self.source!r}")
        for name in ("memory_headroom", "bandwidth_utilization", "min_position"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {value!r}")

    @property
    def across_processes(self) -> bool:
        """Tensor or pipeline parallelism takes token replay only: hidden-state replay rebuilds K/V outside a
        forward, on rank 0's pool alone."""
        return self.source == "tokens"

    def build(self, engine) -> ReplayController:
        """The engine extension (`lab.engine.extension`) for `engine`."""
        if self.chunk is not None and not engine.config.enable_chunked_prefill:
            raise ValueError("replay in chunks needs enable_chunked_prefill=True")
        hidden = None
        if self.source == "hidden":
            if not engine.config.enforce_eager:
                raise ValueError('replay source="hidden" observes the eager forward with hooks: it needs '
                                 'enforce_eager=True')
            from .hidden import HiddenStateStore
            hidden = HiddenStateStore(engine.runner, self.window)
        weight_bytes = sum(p.numel() * p.element_size() for p in engine.model.parameters())
        return ReplayController(self, hidden, weight_bytes, engine.kv_bytes_per_token, engine.step_view)


@dataclass
class ReplayStats:
    replays: int = 0  # windows dropped and recomputed
    recomputed_tokens: int = 0
    skipped_by_trigger: int = 0  # decode steps the triggers let pass without replay
    per_request: dict = field(default_factory=dict)  # request id -> replays


class ReplayController(EngineExtension):
    """Decides, before each engine step, which running sequences drop and recompute their last window."""

    name = "replay"
    rewinds = True  # a token replay moves num_computed_tokens back by the window

    def __init__(self, config: ReplayConfig, hidden=None, weight_bytes: int = 0, kv_bytes_per_token: float = 0.0,
                 step=None):
        self.config, self.step = config, step  # step: the engine's StepView, to find a live request
        self.hidden = hidden  # a lab.replay.hidden.HiddenStateStore when config.source == "hidden"
        self.weight_bytes, self.kv_bytes_per_token = weight_bytes, kv_bytes_per_token
        self.cached_ranges: dict[int, tuple[int, int]] = {}  # request id -> [start, end) of cached positions
        self.replayed: dict[int, tuple[int, int]] = {}  # request id -> (first dropped position, length then),
        # until the recompute has sampled the sequence's next token
        self.totals = ReplayStats()  # every replay of every request

    # ---- engine hooks ----------------------------------------------------------------------------
    def before_schedule(self, step) -> list[Rewind]:
        return self.before_step(step.running, step.free_block_share(), self.kv_read_share(step.running))

    def after_schedule(self, step, scheduled) -> None:
        self.begin_step(scheduled)

    def after_step(self, step) -> None:
        self.end_step(step.running)

    def on_finish(self, seq: Sequence) -> None:
        self.forget(seq.request_id)

    def stats(self) -> dict:
        return {"replays": self.totals.replays, "replayed_tokens": self.totals.recomputed_tokens}

    def close(self) -> None:
        if self.hidden is not None:
            self.hidden.close()

    def kv_read_share(self, running: list[Sequence]) -> float:
        """The share of a decode step's memory traffic that reads KV (the running contexts' KV against the
        weights): the lab's stand-in for the article's bandwidth-utilization counter, which a CPU has not."""
        kv = self.kv_bytes_per_token * sum(len(s) for s in running)
        return kv / (kv + self.weight_bytes) if kv + self.weight_bytes else 0.0

    # ---- the article's controller -----------------------------------------------------------------
    def should_replay(self, seq: Sequence, memory_headroom: float, bandwidth_utilization: float) -> bool:
        """The article's `should_replay` for a sequence about to decode at position `num_computed_tokens`."""
        c, pos = self.config, seq.num_computed_tokens
        if pos < c.window + 1:  # nothing to drop yet: the window would reach the first token
            return False
        context = seq.num_prompt_tokens + seq.params.max_tokens
        if pos < c.min_position * context:
            return False
        cached = self.cached_ranges.get(seq.request_id)
        if cached is None or pos > cached[1] or c.always:
            return True
        return memory_headroom < c.memory_headroom or bandwidth_utilization > c.bandwidth_utilization

    def replay_window(self, seq: Sequence) -> tuple[int, int]:
        """[start, end) of the positions to recompute: the last W before the one being decoded."""
        end = seq.num_computed_tokens
        return max(0, end - self.config.window), end

    def before_step(self, running: list[Sequence], memory_headroom: float,
                    bandwidth_utilization: float) -> list[Rewind]:
        """The sequences that replay from token ids, as `Rewind` intents the engine applies before it schedules
        the step (a hidden-state replay rebuilds the window's K/V in place and reports nothing)."""
        rewinds = []
        for seq in running:
            if (seq.status is not Status.RUNNING or seq.num_computed_tokens != len(seq) - 1
                    or seq.request_id in self.replayed):
                continue  # only sequences about to decode (not mid-prompt, not preempted, not mid-replay)
            if not self.should_replay(seq, memory_headroom, bandwidth_utilization):
                self.totals.skipped_by_trigger += 1
                continue
            start, end = self.replay_window(seq)
            if self.hidden is not None:
                # Rebuilt in place from the kept layer inputs; the step then decodes as usual.
                start = max(start, self.hidden.restorable_from(seq))
                if start < end:
                    self.hidden.restore(seq, start, end)
            else:
                rewinds.append(Rewind(seq, start, self.config.chunk))  # recomputed from its token ids
                self.replayed[seq.request_id] = (start, len(seq))
            self.totals.replays += 1
            self.totals.recomputed_tokens += end - start
            self.totals.per_request[seq.request_id] = self.totals.per_request.get(seq.request_id, 0) + 1
        return rewinds

    def end_step(self, running: list[Sequence]) -> None:
        """Update the cached ranges: a window recomputed without write-back stays dropped (so the next step
        replays it again), everything else computed this step is cached; a sequence whose recompute reached
        its end and sampled (the engine then ends its chunking) is done replaying."""
        if self.hidden is not None:
            self.hidden.end_step()
        for seq in running:
            dropped_from, length = self.replayed.get(seq.request_id, (None, 0))
            keep = dropped_from is None or self.config.write_back
            self.cached_ranges[seq.request_id] = (0, seq.num_computed_tokens if keep else dropped_from)
            if len(seq) > length:  # the recompute (in one or more chunks) reached the end and sampled a token
                self.replayed.pop(seq.request_id, None)

    def begin_step(self, scheduled) -> None:
        if self.hidden is not None:
            self.hidden.begin_step(scheduled)

    def restore(self, request_id: int, start: int, end: int) -> None:
        """Rebuild the K/V of positions start .. end - 1 of a live request from its kept layer inputs (HCache),
        outside a step: what a study times."""
        self.hidden.restore(self.step.sequence(request_id), start, end)

    def forget(self, request_id: int) -> None:
        self.cached_ranges.pop(request_id, None)
        self.replayed.pop(request_id, None)
        if self.hidden is not None:
            self.hidden.forget(request_id)
