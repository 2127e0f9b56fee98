"""`lab bench engine --profile DIR`: where an engine workload's time goes, operator by operator.

After a workload is timed, it runs once more under `torch.profiler` (CPU activity, record shapes off, so the
profile costs little beside the ops it records); the timed figures never include the profiler. Per operator: its
calls, its self CPU time (time in the operator itself, not in the ops it calls) and that time's share of the
profiled run's wall time, the largest first. Written per variant and workload as `<variant>__<workload>.csv` and
a readable `.txt` (torch's own table), so every statement about the engine's overhead in docs/benchmarks.md can
be rerun on another machine. Each workload also runs once under `cProfile` (`<variant>__<workload>__python.csv`):
the self time of the Python that runs, by file and by kind (the engine's step, the model's forward, torch's module
machinery, C functions: the operators among them), which says whose host time a dispatch-bound step spends.
The verification of 4 drafts is profiled beside the one-row step it is measured
against (`<variant>__verify__1row`, `__5rows`), and a compiled variant's compile time by phase
(`<variant>__compile.csv`).
"""

from __future__ import annotations

import cProfile
import os
import pstats
import time
from pathlib import Path

import pandas as pd


def operator_table(prof, wall_s: float) -> pd.DataFrame:
    """One row per operator of a finished `torch.profiler.profile`: calls, self CPU ms, CPU total ms, the self
    time's share of `wall_s`, largest self time first."""
    rows = [{"operator": e.key, "calls": e.count, "self_cpu_ms": e.self_cpu_time_total / 1e3,
             "cpu_total_ms": e.cpu_time_total / 1e3} for e in prof.key_averages()]
    table = pd.DataFrame(rows).sort_values("self_cpu_ms", ascending=False, ignore_index=True)
    table["self_share_of_wall"] = table["self_cpu_ms"] / (1e3 * wall_s)
    return table


def profile_call(fn, out: Path, name: str) -> dict:
    """Run `fn()` once under the profiler and write `name`.csv and `name`.txt under `out`; returns the profiled
    wall time, the operators' summed self time and the top operator."""
    from torch.profiler import ProfilerActivity, profile

    out.mkdir(parents=True, exist_ok=True)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        fn()
        wall = time.perf_counter() - start
    table = operator_table(prof, wall)
    table.to_csv(out / f"{name}.csv", index=False)
    (out / f"{name}.txt").write_text(
        f"{name}: {wall:.3f} s wall under the profiler\n\n"
        + prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=40) + "\n")
    return {"profiled_wall_s": wall, "operators_self_s": float(table["self_cpu_ms"].sum() / 1e3),
            "top_operator": table["operator"].iloc[0] if len(table) else None, "csv": str(out / f"{name}.csv")}


def profile_workload(llm, prompts: list[list[int]], params, out: Path, name: str) -> dict:
    """`prompts` generated once under the profiler (`profile_call`), then once under cProfile (`profile_python`)."""
    result = profile_call(lambda: llm.generate(prompts, params), out, name)
    result["python"] = profile_python(lambda: llm.generate(prompts, params), out, f"{name}__python")
    return result


_LAB_DIR = os.path.realpath(Path(__file__).resolve().parents[1]) + os.sep


def _kind(path: str, function: str) -> tuple[str, str]:
    """(kind, source) of a cProfile entry: a lab file, a torch Python file, a C function, or other Python."""
    if path == "~":
        return "C functions (torch operators among them)", function
    real = os.path.realpath(path)
    if real.startswith(_LAB_DIR):  # the package's own folder: a checkout may itself sit under a folder named lab
        source = "lab/" + real[len(_LAB_DIR):]
        kind = {"engine": "the engine's step", "models": "the model's forward"}.get(source.split("/")[1], "lab, other")
        return kind, source
    site = path.rsplit("site-packages/", 1)[-1]
    return ("torch's Python" if site.startswith("torch/") else "other Python"), site


def profile_python(fn, out: Path, name: str) -> dict:
    """Run `fn()` once under cProfile and write `name`.csv: self time (time in the function itself) per source
    file or C function, with its kind, its calls and its share of the wall time, largest first. cProfile adds a
    fixed cost to every Python call, so the shares between Python kinds are the figure to read, not the seconds."""
    prof = cProfile.Profile()
    start = time.perf_counter()
    prof.enable()
    fn()
    prof.disable()
    wall = time.perf_counter() - start
    rows = {}
    for (path, _, function), (_, calls, self_s, _, _) in pstats.Stats(prof).stats.items():
        key = _kind(path, function)
        row = rows.setdefault(key, {"kind": key[0], "source": key[1], "calls": 0, "self_ms": 0.0})
        row["calls"] += calls
        row["self_ms"] += 1e3 * self_s
    table = pd.DataFrame(list(rows.values())).sort_values("self_ms", ascending=False, ignore_index=True)
    table["self_share_of_wall"] = table["self_ms"] / (1e3 * wall)
    out.mkdir(parents=True, exist_ok=True)
    table.to_csv(out / f"{name}.csv", index=False)
    by_kind = table.groupby("kind")["self_share_of_wall"].sum().sort_values(ascending=False)
    return {"profiled_wall_s": wall, "share_by_kind": {k: float(v) for k, v in by_kind.items()},
            "csv": str(out / f"{name}.csv")}


def profile_verification(llm, out: Path, name: str, context: int, k: int = 4, repeats: int = 5) -> dict:
    """The one-row step and the (k + 1)-row verification forward over the same `context` cached tokens
    (`LLM.forward_probe`, timed by `lab.machine.timing.probe_seconds`) under the profiler, as `name`__1row and
    `name`__<k + 1>rows. Each profile holds the same prefill of the cached prefix and a warm-up besides its
    `repeats` timed forwards, so the difference between the two tables is what the verification adds, operator by
    operator."""
    from lab.machine.timing import probe_seconds

    labels = {1: "1row", k + 1: f"{k + 1}rows"}
    return {label: profile_call(lambda n=n: probe_seconds(llm.forward_probe(context, n), repeats),
                                out, f"{name}__{label}") for n, label in labels.items()}


def write_compile_times(out: Path, name: str) -> dict | None:
    """Where this process's `torch.compile` time went, per phase (dynamo's `compile_times`: tracing, inductor's
    lowering and code generation, the C++ compiler's `compile_file`, building guards), summed over every graph, as
    `name`.csv, largest first; None when nothing was compiled. The phases nest: a phase's seconds include those
    of the phases it calls. Each phase is summed over the threads that ran it, so one that runs on several at once
    can exceed the whole (`_compile.compile_inner`): inductor compiles its C++ kernels on a pool of compile
    threads, and their `compile_file` summed to 36.6 s inside a 28.8-s compile in CI at 5c3ec30."""
    from torch._dynamo.utils import compile_times

    headers, values = compile_times(repr="csv", aggregate=True)
    if not headers:
        return None
    table = pd.DataFrame({"phase": headers, "seconds": [float(v) for v in values]})
    table = table.sort_values("seconds", ascending=False, ignore_index=True)
    out.mkdir(parents=True, exist_ok=True)
    table.to_csv(out / f"{name}.csv", index=False)
    return {"csv": str(out / f"{name}.csv"), "top_phase": table["phase"].iloc[0],
            "top_phase_s": float(table["seconds"].iloc[0])}
