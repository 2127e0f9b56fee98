"""Each study's answer in a sentence or two, read from a run's own files: the one source of the numbers the README's
studies table, each study doc's opening and the HTML report (`lab report`) quote.

A `Headline` holds the study's question, its answer (the key claims' measured figures, intervals and verdicts as
the run's claims table prints them, or the run's metrics where the study has no claim to quote), the count of its
verdicts, its key plot and the run's provenance (id, commit, clean or dirty). Nothing here is typed from a run by
hand: `headline(notebook, run_dir)` reads it, so a README or doc row that quotes a stale run fails the test that
regenerates it (`lab docs --check`).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pandas as pd


@dataclass(frozen=True)
class Study:
    """What the headline of one notebook quotes: `claims`, (substring of a claim cell, label) pairs; `plot`, the
    key figure's file stem; `metrics`, a function of the run's metrics.json giving sentences of its own."""
    question: str
    plot: str | tuple[str, ...]  # the key figure's file stem, or stems in order of preference (older runs lack some)
    claims: tuple[tuple[str, str], ...] = ()
    metrics: object = None
    title: str = ""


@dataclass
class Headline:
    notebook: str
    question: str
    answer: list[str]
    verdicts: dict[str, int]
    plot: str
    run_id: str
    commit: str
    dirty: bool
    preset: str
    created: str
    stale: bool = False  # the notebook or a study module it imports changed since the run's commit

    @property
    def provenance(self) -> str:
        state = "; dirty tree" if self.dirty else ""
        state += "; stale: the code changed since (`lab runs --stale`)" if self.stale else ""
        return f"{self.preset} run {self.run_id}, commit {self.commit[:7]}, {self.created[:10]}{state}"


def _tour(m: dict) -> list[str]:
    same = {True: "identical", False: "not identical"}
    return [f"A prefix hit cuts a lone request's TTFT from {m['ttft_ms_alone_miss']:.0f} ms to "
            f"{m['ttft_ms_alone_hit']:.0f} ms; {m['prefix_cache_hit_rate']:.0%} of the batch's prompt tokens come from "
            f"the prefix cache",
            f"a cached rerun's greedy outputs are {same[bool(m['outputs_identical_hit_vs_miss_float32'])]} to the "
            f"uncached ones in float32 and {same[bool(m['outputs_identical_hit_vs_miss'])]} in bfloat16 "
            f"(batch shapes round differently)"]


def _quant(m: dict) -> list[str]:
    if "weights16" not in m:
        return ["This run predates the check for an already-quantized baseline: its verdicts treat the embedded "
                "model, whose decoder linears are already Q4_1, as 16-bit, and the claims ledger marks them not "
                "checkable here; a rerun shows the GGUF control and the quantizer ladder"]
    if m["weights16"]:
        return []
    return [f"Not checkable on this model: its decoder linears are already {m['baseline_bits']}-bit (at most "
            f"{m['baseline_max_distinct_per_block']} distinct values in every block of 32); the GGUF Q4_1 grid "
            f"reproduces them exactly (perplexity change {m['gguf-q4_1_w4g32_code_ppl_change_%']:+.1f}%), so "
            f"re-quantizing measures a grid mismatch, not the cost of 4 bits",
            f"the quantizer ladder's weight error: integer zero point {m['ladder_int-zero_w4g32_weight_error_%']:.1f}%"
            f", group 128 {m['ladder_rtn_w4g128_weight_error_%']:.1f}%, 3 bits {m['ladder_rtn_w3g128_weight_error_%']:.1f}%"
            f", 2 bits {m['ladder_rtn_w2g128_weight_error_%']:.1f}% of the weight norm"]


def _replay(m: dict) -> list[str]:
    n = m["measured_points"]
    return [f"Recomputing the KV beat reading it from host memory at {m['recompute_beats_host_memory']} of {n} measured "
            f"points and from disk at {m['recompute_beats_disk']}",
            f"the cost model (fixed step cost, forward, paged gather, attention over the prefix, each ceiling measured "
            f"in the run) predicts {m['model_points_within_20pct']} of {n} points within 20%, the roofline "
            f"{m['roofline_points_within_20pct']}"]


def _spec(m: dict) -> list[str]:
    parts = [f"{name} {m[f'speedup_{key}']:.2f}x [{m[f'speedup_{key}_low']:.2f}, {m[f'speedup_{key}_high']:.2f}]"
             for key, name in (("ngram", "n-gram"), ("quantized", "a 4-bit copy"), ("layerskip", "layer-skip"))]
    return ["Speculative decoding's speedup at batch 1 on this CPU, 95% intervals over prompts: " + ", ".join(parts)]


STUDIES = {
    "00_engine_tour": Study("What happens to one request, from LLM.generate to the attention?", "kv_blocks_over_time",
                            metrics=_tour, title="Engine tour"),
    "01_memory_accounting": Study(
        "Does it fit, and what bounds a decode step?", "int4_decode",
        (("INT4 decode is 2-2.5x faster than FP16 (batch 1)", "INT4 over bf16 decode, batch 1"),
         ("INT4 decode is 2-2.5x faster than FP16 (batch 32)", "batch 32"),
         ("batching amortizes the weight read over tens of requests (bfloat16", "batching's throughput gain")),
        title="Memory accounting and the roofline"),
    "02_quantization_accuracy": Study("Is INT4 weight quantization free?", ("ladder", "grid"), metrics=_quant,
                                      title="Weight quantization accuracy"),
    "03_kv_quantization": Study(
        "Is an FP8 KV cache safe, and which KV formats hold up?", "end_to_end",
        (("FP8 (e4m3, calibrated per-tensor scale) is safe", "FP8 KV"), ("INT8 needs care", "INT8 per-token KV"),
         ("keys are more sensitive than values (int4/per-token)", "keys against values"),
         ("the error grows with context", "error growth with context")), title="KV cache quantization"),
    "04_replay_break_even": Study("Can recomputing the KV cache beat reading it?", "predicted_vs_measured",
                                  metrics=_replay, title="Replay break-even"),
    "05_speculative_acceptance": Study(
        "Does speculative decoding give 2-3x?", "predicted_vs_measured",
        (("draft cost ratio c is typically 0.03-0.1 (ngram)", "the n-gram drafter's cost ratio"),),
        metrics=_spec, title="Speculative decoding"),
    "06_serving_ttft": Study(
        "What do TTFT, TPOT and goodput do under load?", "ramp",
        (("KV reuse with a fixed system prompt lowers TTFT", "a shared system prompt's TTFT cut"),
         ("with random inputs, enabling KV reuse", "random prompts"),
         ("fixed-length load tests seriously overestimate", "fixed-length load tests"),
         ("let one long prefill stall the running decodes", "chunked prefill"),
         ("raising concurrency, throughput flattens at a knee", "the knee"),
         ("a timestamp inserted into the prompt", "a timestamp in the system prompt")),
        title="Serving under load"),
    "07_structured_output": Study(
        "What does a grammar mask cost, and what does it buy?", "mask_cost",
        (("constrained decoding makes the format absolutely correct", "schema validity"),
         ("computing the full mask every step takes 20-30% of a step at small batch (每步都全量算一遍掩码, 在小 batch "
          "下…两三成): this machine", "the naive full mask at batch 1")), title="Structured output"),
    "08_parallelism": Study(
        "What do tensor and pipeline parallelism's communication cost?", "comm_sweep",
        (("all-reduce takes up to 40% of a decode step", "all-reduce share with Replay on"),
         ("TP without fast links", "TP=8 without NVLink")), title="Parallelism"),
    "09_ttft_claims": Study(
        "Do the TTFT article's first-token claims hold?", "ttft_claims",
        (("KV cache reuse lowers TTFT by 30-50%", "KV reuse's TTFT cut"),
         ("the first token takes about 2.5x longer without the cache", "a 70B's first token with and without the "
                                                                         "cache")), title="First-token claims"),
}


ARTICLE_NAMES = {"000": "the replay article", "002": "the TTFT article", "003": "the deployment article"}
_SEED = re.compile(r"seeds/(00[023])")


def _named(text: str) -> str:
    """`text` with the source articles named as the docs name them, not by their folder ("seeds/000 §2.2")."""
    return _SEED.sub(lambda m: ARTICLE_NAMES[m.group(1)], text)


def _lead(measured: str) -> str:
    """The measured cell's first clause: its figure, interval and what it is, before the details (the setting
    after a ": " that follows an interval is left to the claims table)."""
    first = str(measured).split("; ")[0]
    head, sep, _ = first.partition(": ")
    return head if sep and "[" in head else first


def _ledger_verdicts(results: Path, run_dir: Path) -> dict[int, str]:
    """The claims ledger's verdict on each row of this run's claims table that it links to (by row number), where
    the ledger's scope rules make it differ from the notebook's (a GPU claim measured on a CPU)."""
    path = results / "CLAIMS.csv"
    if not path.exists():
        return {}
    ledger = pd.read_csv(path, dtype=str).fillna("")
    run = f"{run_dir.parent.name}/{run_dir.name}"
    mine = ledger[(ledger["run"] == run) & (ledger["table"] == "claims.csv")]
    # the ledger numbers rows from 1, as a reader counts them
    return {int(r["row"]) - 1: r["verdict"] for _, r in mine.iterrows() if r["verdict"] != r["notebook verdict"]}


def headline(notebook: str, run_dir: Path) -> Headline:
    """`notebook`'s headline from the run in `run_dir`: a key claim missing from its claims table raises, naming it."""
    study = STUDIES[notebook]
    params = json.loads((run_dir / "params.json").read_text())
    metrics = json.loads((run_dir / "metrics.json").read_text()) if (run_dir / "metrics.json").exists() else {}
    claims = pd.read_csv(run_dir / "claims.csv") if (run_dir / "claims.csv").exists() else None
    answer = list(study.metrics(metrics)) if study.metrics else []
    ledger = _ledger_verdicts(run_dir.parents[1], run_dir)
    for match, label in study.claims:
        rows = claims[claims["claim"].str.contains(match, regex=False)] if claims is not None else []
        if len(rows) != 1:
            raise ValueError(f"{notebook} run {run_dir.name}: {len(rows)} claims rows match {match!r} (want 1)")
        index, row = rows.index[0], rows.iloc[0]
        said = row["verdict"] if index not in ledger else \
            f"{row['verdict']} in this setting; the ledger: {ledger[index]} for the article's setting"
        answer.append(_named(f"{label}: {_lead(row['measured here'])} ({said})"))
    verdicts = dict(Counter(claims["verdict"])) if claims is not None else {}
    plots = (study.plot,) if isinstance(study.plot, str) else study.plot
    plot = next((p for p in plots if (run_dir / f"{p}.png").exists()), plots[0])
    preset = params.get("parameters", {}).get("PRESET", "reference")
    return Headline(notebook, study.question, answer, verdicts, plot, run_dir.name, params.get("git_commit", ""),
                    bool(params.get("git_dirty")), preset, params.get("created", ""))


def verdict_counts(h: Headline) -> str:
    order = ("holds", "wrong", "wrong by rounding", "wrong by argument", "not distinguishable", "not checkable here")
    return ", ".join(f"{h.verdicts[v]} {v}" for v in order if h.verdicts.get(v)) or "no claims table"
