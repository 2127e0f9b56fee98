"""Timing on the host: the median of repeated calls after a warm-up, the one way the lab times a function
(replay's recompute and loads, speculative decoding's step costs, the engine benchmark's peers).

The median, not the mean: on a shared 2-core machine a few calls are delayed by other work, and the median
ignores them. A warm-up call first, so allocation and first-touch costs are not timed. Where CUDA is in use,
each call is followed by a synchronize, so the time is the device's, not the launch's.
"""

from __future__ import annotations

import statistics
import time

import torch


def sync() -> None:
    """Wait for the GPUs where CUDA is in use: a clock read after launches alone times the launches. Every
    device holding memory, not only the current one (`torch.cuda.synchronize()` alone waits for the current
    device, cuda:0 unless set: work a study put on DEVICE=cuda:1 would be timed at its launch)."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        current = torch.cuda.current_device()
        for i in range(torch.cuda.device_count()):
            if i == current or torch.cuda.memory_allocated(i):  # reading the allocator creates no context
                torch.cuda.synchronize(i)


def median_seconds(fn, repeats: int, before=None) -> float:
    """Median wall time of `repeats` calls of fn after one warm-up call (`before` runs, untimed, before each)."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    times = []
    fn()  # warm-up: allocation, first touch
    for _ in range(repeats):
        if before is not None:
            before()
        sync()
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def probe_seconds(probe, repeats: int) -> float:
    """Median seconds of the step a probe (`LLM.forward_probe`: a context manager yielding it) holds."""
    if repeats < 1:
        raise ValueError(f"need repeats >= 1, got {repeats}")
    with probe as step:
        return median_seconds(step, repeats)


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


def ratio_interval(num: list[float], den: list[float], confidence: float = 0.95, resamples: int = 2000,
                   seed: int = 0) -> tuple[float, float, float]:
    """median(num) / median(den) and its percentile-bootstrap interval (both samples resampled, each on its
    own: the two timings are not paired step by step): how far the ratio of two timed quantities moves with the
    step-to-step spread of the timings. The interval contains the ratio (`lab.intervals.percentile_interval`)."""
    import numpy as np

    from lab.intervals import percentile_interval

    rng = np.random.default_rng(seed)
    a, b = np.asarray(num, dtype=float), np.asarray(den, dtype=float)
    ratios = (np.median(rng.choice(a, (resamples, a.size)), axis=1)
              / np.median(rng.choice(b, (resamples, b.size)), axis=1))
    iv = percentile_interval(np.median(a) / np.median(b), ratios, confidence, skip_nan=False)
    return iv.value, iv.low, iv.high
