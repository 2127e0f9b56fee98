"""Read-only views of the engine for the code outside it: a tour, a trace, a study that watches requests
progress. They are snapshots (frozen copies), so nothing outside `lab.engine` can move a sequence or a block;
the engine's own state has one home each (`lab.engine.llm.LLM`, its scheduler and block pool)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SequenceView:
    request_id: int
    num_prompt_tokens: int
    num_tokens: int  # prompt and output so far
    num_computed_tokens: int  # leading positions whose KV is in the pool
    block_table: tuple[int, ...]

    @classmethod
    def of(cls, seq) -> SequenceView:
        return cls(seq.request_id, seq.num_prompt_tokens, len(seq), seq.num_computed_tokens, tuple(seq.block_table))

    @property
    def prefilling(self) -> bool:
        return self.num_computed_tokens < self.num_prompt_tokens


@dataclass(frozen=True)
class ScheduleView:
    scheduled: tuple[tuple[int, int], ...] = ()  # (request id, tokens) the step ran, in order
    preempted: tuple[int, ...] = ()  # request ids it sent back to the queue


@dataclass(frozen=True)
class EngineView:
    running: tuple[SequenceView, ...]
    waiting: tuple[SequenceView, ...]
    last_step: ScheduleView  # what the last step scheduled

    @classmethod
    def of(cls, scheduler, last_schedule) -> EngineView:
        schedule = ScheduleView() if last_schedule is None else ScheduleView(
            tuple((seq.request_id, n) for seq, n in last_schedule.scheduled),
            tuple(seq.request_id for seq in last_schedule.preempted))
        return cls(tuple(map(SequenceView.of, scheduler.running)), tuple(map(SequenceView.of, scheduler.waiting)),
                   schedule)

    @property
    def requests(self) -> tuple[SequenceView, ...]:
        return self.running + self.waiting
