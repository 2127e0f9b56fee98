"""Step-by-step traces of the engine: what each step scheduled and what the KV pool held after it.

`traced_generate` is `LLM.generate` with a record per step, for the engine tour and the serving
study: which requests ran and with how many tokens (prefill chunk or decode), KV blocks in use,
running and waiting counts, and cumulative prefix-cache hits.
"""

from __future__ import annotations

import time

from .llm import LLM
from .request import SamplingParams


def traced_generate(llm: LLM, prompts, params: SamplingParams | list[SamplingParams]):
    """Run `prompts` to completion; returns (outputs in prompt order, list of per-step dicts)."""
    params = params if isinstance(params, list) else [params] * len(prompts)
    ids = [llm.add_request(p, sp) for p, sp in zip(prompts, params)]
    done, steps = {}, []
    t0 = time.perf_counter()
    while llm.has_unfinished():
        finished = [d.output for d in llm.step() if d.finished]
        done.update({o.request_id: o for o in finished})
        sched = llm.last_schedule.scheduled
        stats = llm.stats()
        prefill = sum(n for seq, n in sched if seq.num_computed_tokens - n < seq.num_prompt_tokens)
        steps.append({
            "step": len(steps),
            "time_s": time.perf_counter() - t0,
            "num_seqs": len(sched),
            "prefill_tokens": prefill,
            "decode_tokens": sum(n for _, n in sched) - prefill,
            "kv_blocks_used": stats["kv_blocks_used"],
            "running": stats["running"],
            "waiting": stats["waiting"],
            "preempted": len(llm.last_schedule.preempted),
            "finished": len(finished),
            "scheduled": [(seq.request_id, n) for seq, n in sched],
        })
    return [done[i] for i in ids], steps


def request_path_files(llm: LLM, prompt, params: SamplingParams) -> list[str]:
    """The `lab` source files whose Python code runs while `llm` generates `prompt` to completion, as repository
    paths in first-run order (`sys.setprofile` sees every Python call; torch's C++ and Triton's compiled code are
    not files of the lab). What a newcomer has to read to follow one request, measured rather than listed by hand."""
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    seen: dict[str, None] = {}

    def profile(frame, event, arg):
        if event == "call":
            name = frame.f_code.co_filename
            if name.startswith(str(root)) and name != __file__:
                seen.setdefault(Path(name).relative_to(root.parent).as_posix(), None)

    sys.setprofile(profile)
    try:
        llm.generate(prompt, params)
    finally:
        sys.setprofile(None)
    return list(seen)
