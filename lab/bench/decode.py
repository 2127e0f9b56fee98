"""The engine's decode step, timed: a batch of greedy requests of a given context, prefilled untimed, then each
decode step's wall time as the context grows by one a step. Studies 01 (INT4 decode) and 08 (a step beside its
collectives) and the tests compare step times this way, through the engine's public surface only.
"""

from __future__ import annotations

import time

from lab.machine.timing import sync


def decode_engine(model, tokenizer, batch: int, context: int, steps: int):
    """An engine on `model` sized for `decode_step_seconds(engine, batch, context, steps)`: `batch` sequences,
    a pool that holds them all (nothing preempted), every prompt prefilled in one step."""
    from lab.engine import LLM

    max_len = context + steps + 8
    return LLM(model, tokenizer=tokenizer, max_num_seqs=batch, max_model_len=max_len,
               num_kv_blocks=batch * -(-max_len // 16), max_num_batched_tokens=max(4096, batch * context))


def start_decode_batch(llm, batch: int, context: int, steps: int) -> None:
    """`batch` greedy requests of `context` prompt tokens (the same synthetic ids for every study, so their step
    times compare) with room for `steps` timed decode steps, prefilled, then one warm decode step: untimed."""
    from lab.engine import SamplingParams

    for i in range(batch):
        llm.add_request([(7 * i + j) % 1000 + 10 for j in range(context)],
                        SamplingParams(temperature=0, max_tokens=steps + 2, ignore_eos=True))
    while any(s.num_computed_tokens < context for s in llm.view().requests):
        llm.step()  # prefill (chunked if the budget asks)
    llm.step()  # one warm decode step


def decode_step_seconds(llm, batch: int, context: int, steps: int) -> list[float]:
    """The wall time of each of `steps` decode steps of `llm` (a `lab.engine.LLM` with room for `batch`
    sequences of `context + steps + 2` tokens) running `batch` greedy requests of `context` prompt tokens:
    prefill and one warm decode step first, untimed; every sequence's context grows by one a step."""
    start_decode_batch(llm, batch, context, steps)
    times = []
    for _ in range(steps):
        sync()
        start = time.perf_counter()
        llm.step()
        sync()
        times.append(time.perf_counter() - start)
    while llm.has_unfinished():
        llm.step()
    return times
