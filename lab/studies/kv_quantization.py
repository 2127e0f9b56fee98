"""KV-cache quantization: formats, calibration, and error growth with context (notebook 03).

The deployment article (seeds/003, section 2.3) claims: FP8 KV is usually safe, INT8 needs care, INT4 should
stay out of online serving; keys are more sensitive than values, so keys want per-channel scales and values
per-token ones (KIVI, arXiv:2402.02750); per-token dynamic scales beat a per-tensor static scale on long
context; and the error accumulates with context, so short prompts hide it. This module measures each claim on
SmolLM2 with the formats of `lab.quant.kv`:

- the cache's own error and its end-to-end effect, per position (`lab.eval.kv_error`: the attention output
  against exact K/V on the exact model's own queries, keys and values; next-token KL with every layer's
  K/V stored through the format), on a long held-out text (`lab.eval.harness.long_text`);
- both kept per block of positions within position buckets (256, 512, ... up to the text's length), for
  any list of formats, including K-only and V-only variants (`error_growth`);
- perplexity, KL and the sensitive set through the engine's quantized cache (`end_to_end`), and how many
  sequences one KV pool holds in each format (`max_concurrency`), beside `lab.memory`'s account.

Intervals (a block bootstrap over the long text, a bootstrap over held-out sequences, Wilson intervals for
pass rates) and the claims table live in `lab.studies.kv_quantization_claims`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import pandas as pd
import torch
from tqdm.auto import tqdm

from lab.engine import EngineConfig
from lab.eval.harness import long_text  # noqa: F401  (notebook 03 calls study.long_text)
from lab.eval.kv_error import attention_error_by_position, kl_by_position, record
from lab.plots import PALETTE, error_extents, frame_extents, legend_outside
from lab.quant.kv import KVCacheFormat, parse_format
from lab.quant.kv_calibration import KVScales
from lab.runs import as_tuple, check_choice, check_device, check_range


def position_buckets(n: int, first: int = 256) -> list[tuple[int, int]]:
    """[0, first), [first, 2 first), [2 first, 4 first) ... up to n."""
    edges = [0, first]
    while edges[-1] < n:
        edges.append(edges[-1] * 2)
    edges[-1] = n
    return [(a, b) for a, b in zip(edges, edges[1:]) if a < n]


def _blocked(values: torch.Tensor, buckets, block: int, **labels) -> list[dict]:
    """Each bucket cut into blocks of `block` positions: the block's mean over measured (non-NaN) positions and
    how many there were, the units the intervals resample (`kv_quantization_claims`)."""
    rows = []
    for a, b in buckets:
        for s in range(a, b, block):
            part = values[s:min(s + block, b)]
            n = int((~part.isnan()).sum())
            rows.append({**labels, "positions": f"{a}-{b}", "position_end": b, "block_start": s, "measured": n,
                         "value": float(part.nanmean()) if n else float("nan")})
    return rows


# ---- the notebook's parameters, formats and experiments ---------------------------------------------------

UNIT_SCALE = "unit-scale"  # a format-name suffix of this study: static scales of 1.0 (vLLM's default)
ENGINE_BLOCK_SIZE = EngineConfig.block_size  # the engine's default block size, which the study's engines use


@dataclass
class KVStudyParams:
    PRESET: str = "quick"
    INTERACTIVE: bool = False
    DEVICE: str = "auto"  # auto: CUDA when present, else the CPU; the model stays float32 on either
    MODEL: str = "smollm2-135m"
    CONTEXT: int = 8192  # tokens of held-out text for the position study (SmolLM2's context limit)
    FIRST_BUCKET: int = 256
    ATTENTION_STRIDE: int = 8  # attention error measured at every 8th query position
    BLOCK_TOKENS: int = 32  # positions per block the intervals resample on the one long text
    GROWTH_FORMATS: tuple = ("fp8_e4m3/per-tensor", f"fp8_e4m3/per-tensor/{UNIT_SCALE}", "fp8_e5m2/per-tensor",
                             "fp8_e4m3/per-token", "int8/per-tensor", "int8/per-token", "int4/per-tensor",
                             "int4/per-token", "int4/per-channel/group16", "int2/per-token",
                             "int2/per-channel/group16/window128")
    ROLE_FORMATS: tuple = ("int4/per-token/k-only", "int4/per-token/v-only", "int2/per-token/k-only",
                           "int2/per-token/v-only", "int4/per-channel/group16/k-only")
    E2E_FORMATS: tuple = ("fp8_e4m3/per-tensor", f"fp8_e4m3/per-tensor/{UNIT_SCALE}", "int8/per-token",
                          "int4/per-token", "int4/per-channel/group16", "int2/per-channel/group16/window128")
    CALIB_SAMPLES: int = 32  # calibration sequences for static scales (stratified mix)
    CALIB_TOKENS: int = 512
    CALIB_METHOD: str = "max"
    HELDOUT_SEQUENCES: int = 16
    HELDOUT_TOKENS: int = 512
    MAX_TOKENS: int = 64
    ITEMS_PER_CATEGORY: int = 0  # sensitive items per category (long context aside); 0: all of them
    LONG_CONTEXT_ITEMS: int = 4  # ~28 s each per format on 2 cores
    POOL_MIB: float = 16.0  # KV pool for the concurrency measurement
    CONCURRENCY_LEN: int = 256  # tokens per sequence there
    SAFE_PPL_PCT: float = 1.0  # "safe": perplexity within this many percent and no sensitive item lost
    SEED: int = 0
    # quick: 1K tokens of context, one format per family and the claims' pairs, fewer evaluation tokens, no
    # long context (minutes instead of 56); smoke: the tests' seconds.
    PRESETS: ClassVar[dict] = {
        "quick": {"CONTEXT": 1024, "GROWTH_FORMATS": ("fp8_e4m3/per-tensor", f"fp8_e4m3/per-tensor/{UNIT_SCALE}",
                                                      "int8/per-tensor", "int8/per-token", "int4/per-token",
                                                      "int4/per-channel/group16", "int2/per-token"),
                  "ROLE_FORMATS": ("int4/per-token/k-only", "int4/per-token/v-only"),
                  "E2E_FORMATS": ("fp8_e4m3/per-tensor", "int8/per-token", "int4/per-token"),
                  "CALIB_SAMPLES": 4, "CALIB_TOKENS": 256, "HELDOUT_SEQUENCES": 6, "HELDOUT_TOKENS": 256,
                  "MAX_TOKENS": 24, "ITEMS_PER_CATEGORY": 2, "LONG_CONTEXT_ITEMS": 0, "POOL_MIB": 4.0},
        "smoke": {"CONTEXT": 192, "FIRST_BUCKET": 32, "BLOCK_TOKENS": 8, "CALIB_SAMPLES": 2, "CALIB_TOKENS": 64,
                  "GROWTH_FORMATS": ("fp8_e4m3/per-tensor", f"fp8_e4m3/per-tensor/{UNIT_SCALE}",
                                     "int2/per-channel/group16/window32"),
                  "ROLE_FORMATS": ("int4/per-token/k-only", "int4/per-token/v-only"),
                  "E2E_FORMATS": ("fp8_e4m3/per-tensor", "int4/per-token"), "HELDOUT_SEQUENCES": 2, "HELDOUT_TOKENS": 64,
                  "MAX_TOKENS": 8, "ITEMS_PER_CATEGORY": 1, "LONG_CONTEXT_ITEMS": 0, "POOL_MIB": 2.0,
                  "CONCURRENCY_LEN": 64},
        # gpu: the long-context questions a CPU can only sample. Every reference format on SmolLM2's whole
        # 8K context with the attention error at every query position (stride 1, not every 8th); end to end, the
        # three formats of the safety claims on held-out sequences of 2K tokens instead of 512 (the error
        # accumulates with context) and every one of the 30 long-context items; static scales on twice the
        # sequences. ~34 s on one H200: 16 formats x 8K attention ~8 s, 4 sensitive runs of ~330 steps ~13 s,
        # scoring ~2 s, calibration and concurrency ~2.5 s, 8 s start.
        "gpu": {"ATTENTION_STRIDE": 1, "CALIB_SAMPLES": 64, "HELDOUT_SEQUENCES": 16, "HELDOUT_TOKENS": 2048,
                "LONG_CONTEXT_ITEMS": 30, "E2E_FORMATS": ("fp8_e4m3/per-tensor", "int8/per-token", "int4/per-token")},
    }

    def __post_init__(self):
        check_device("DEVICE", self.DEVICE)
        for name in ("GROWTH_FORMATS", "ROLE_FORMATS", "E2E_FORMATS"):
            setattr(self, name, as_tuple(name, getattr(self, name)))
            for f in getattr(self, name):
                study_format(f)
        for f in self.E2E_FORMATS:
            if study_format(f)[1] != "kv":
                raise ValueError(f"E2E_FORMATS entry {f!r}: the engine quantizes keys and values together")
        for f in self.E2E_FORMATS + self.GROWTH_FORMATS:  # the engine serves these (concurrency, end to end)
            fmt = study_format(f)[0]
            if fmt.granularity == "per-channel" and ENGINE_BLOCK_SIZE % fmt.token_group:
                raise ValueError(f"{f!r}: per-channel key groups must divide the engine's block size "
                                 f"{ENGINE_BLOCK_SIZE} (use e.g. group16)")
        check_choice("CALIB_METHOD", self.CALIB_METHOD, ("max", "percentile"))
        for name, lo, hi in (("CONTEXT", 64, 8192), ("FIRST_BUCKET", 16, 8192), ("ATTENTION_STRIDE", 1, 1024),
                             ("CALIB_SAMPLES", 1, 512), ("CALIB_TOKENS", 16, 2048), ("HELDOUT_SEQUENCES", 1, 256), ("HELDOUT_TOKENS", 16, 2048),
                             ("MAX_TOKENS", 1, 512), ("LONG_CONTEXT_ITEMS", 0, 30), ("ITEMS_PER_CATEGORY", 0, 1000), ("CONCURRENCY_LEN", 16, 8192),
                             ("SEED", 0, None)):
            check_range(name, getattr(self, name), lo, hi, int)
        check_range("POOL_MIB", self.POOL_MIB, 0.5, 4096)
        check_range("SAFE_PPL_PCT", self.SAFE_PPL_PCT, 0, 100)
        if self.FIRST_BUCKET >= self.CONTEXT:
            raise ValueError(f"FIRST_BUCKET={self.FIRST_BUCKET} must be below CONTEXT={self.CONTEXT}")
        check_range("BLOCK_TOKENS", self.BLOCK_TOKENS, 1, 1024, int)
        if self.BLOCK_TOKENS % self.ATTENTION_STRIDE or self.FIRST_BUCKET < 4 * self.BLOCK_TOKENS:
            raise ValueError(f"BLOCK_TOKENS={self.BLOCK_TOKENS} must be a multiple of ATTENTION_STRIDE="
                             f"{self.ATTENTION_STRIDE} (every block measured alike) and at most FIRST_BUCKET / 4 "
                             f"(at least four blocks to resample in the first bucket)")


def study_format(name: str) -> tuple[KVCacheFormat, str, bool]:
    """A format name of `parse_format`, optionally ending in "/unit-scale" (static scales of 1.0 instead of
    calibrated ones) -> (format, roles, unit scale?)."""
    unit = isinstance(name, str) and name.endswith("/" + UNIT_SCALE)
    fmt, roles = parse_format(name[:-len(UNIT_SCALE) - 1] if unit else name)
    if unit and not fmt.static:
        raise ValueError(f"{name!r}: {UNIT_SCALE} applies to static granularities (per-tensor, per-head)")
    return fmt, roles, unit


def scales_for(name: str, model, calibrated: KVScales) -> KVScales | None:
    fmt, _, unit = study_format(name)
    return (KVScales.unit(model, fmt) if unit else calibrated) if fmt.static else None


def error_growth(model, ids: list[int], names: list[str], calibrated: KVScales | None, first_bucket: int = 256,
                 stride: int = 1, block: int = 32, log=print) -> pd.DataFrame:
    """Attention-output relative error and next-token KL for every format name (which may end in
    "/unit-scale"), on one recording of the text, per block of `block` positions within each position bucket
    (`kv_quantization_claims.bucket_table` pools them by bucket); static formats use `calibrated` scales."""
    rec = record(model, ids)
    exact = rec.hidden
    buckets = position_buckets(len(ids), first_bucket)
    rows = []
    for name in tqdm(names, desc="KV formats, by position"):
        fmt, roles, _ = study_format(name)
        scales = scales_for(name, model, calibrated)
        att = attention_error_by_position(model, rec, fmt, roles, scales, stride)
        kl = kl_by_position(model, ids, exact, fmt, roles, scales)
        rows += _blocked(att, buckets, block, format=name, metric="attention_rel_error")
        rows += _blocked(kl, buckets, block, format=name, metric="next_token_kl")
        log(f"{name:40s} attention error {float(att.nanmean()):.4f}, KL {float(kl.mean()):.5f}")
    return pd.DataFrame(rows)


def bytes_per_token(model, name: str, block_size: int = ENGINE_BLOCK_SIZE) -> float:
    """Pool bytes per token of a format in the engine (`lab.engine`), and of the model's dtype for "auto"."""
    from lab.engine.kv_store import kv_cache_bytes_per_block

    return kv_cache_bytes_per_block(model, block_size, None if name == "auto" else study_format(name)[0]) / block_size


def max_concurrency(model, tokenizer, names: list[str], calibrated: KVScales, pool_mib: float, seq_len: int,
                    shape_name: str, block_size: int = ENGINE_BLOCK_SIZE) -> pd.DataFrame:
    """For each format, a KV pool of `pool_mib` MiB in the engine, and two more requests of `seq_len` tokens
    (prompt seq_len - 1, one output token) than could fit: how many the engine ran in one step
    (measured), beside floor(pool / (blocks per sequence x block bytes)) from `lab.memory`'s bytes per token
    (predicted). The staging area of exact windows is reported beside: it is outside the pool."""
    from lab.engine import LLM, SamplingParams
    from lab.memory import ModelShape, dtype_name, kv_bytes_per_token

    shape = ModelShape.preset(shape_name)
    gen = torch.Generator().manual_seed(0)
    blocks_per_seq = -(-seq_len // block_size)
    rows = []
    for name in tqdm(names, desc="KV formats, concurrency"):
        fmt = None if name == "auto" else study_format(name)[0]
        per_block = bytes_per_token(model, name, block_size) * block_size
        num_blocks = int(pool_mib * 2 ** 20 // per_block)
        if fmt is None:
            account = kv_bytes_per_token(shape, dtype_name(model.embed_tokens.weight.dtype))
        else:
            account = kv_bytes_per_token(shape, "fp8" if fmt.is_fp8 else fmt.dtype, fmt.granularity,
                                         token_group=fmt.token_group, asymmetric=fmt.asymmetric)
        predicted = int(pool_mib * 2 ** 20 // (blocks_per_seq * block_size * account))
        row = {"format": name, "bytes_per_token": per_block / block_size, "bytes_per_token_account": account,
               "pool_blocks": num_blocks, "predicted_sequences": predicted}
        if num_blocks < blocks_per_seq:
            rows.append({**row, "measured_sequences": 0, "staging_MiB": 0.0})
            continue
        n = num_blocks // blocks_per_seq + 2  # more than fit: the pool, not the offer, is the limit
        llm = LLM(model, tokenizer=tokenizer, num_kv_blocks=num_blocks, block_size=block_size, max_model_len=seq_len,
                  max_num_seqs=n, max_num_batched_tokens=n * seq_len, enable_prefix_caching=False,
                  kv_cache_dtype="auto" if fmt is None else fmt, kv_scales=scales_for(name, model, calibrated)
                  if fmt is not None else None)
        vocab = model.config.vocab_size
        for _ in range(n):
            llm.add_request(torch.randint(0, vocab, (seq_len - 1,), generator=gen, device="cpu").tolist(),
                            SamplingParams(temperature=0, max_tokens=1, ignore_eos=True))
        peak = 0
        while llm.scheduler.has_unfinished():
            llm.step()
            peak = max(peak, len(llm.last_schedule.scheduled))
        rows.append({**row, "measured_sequences": peak, "staging_MiB": llm.stats()["kv_staging_bytes"] / 2 ** 20})
    return pd.DataFrame(rows)


def end_to_end(p: KVStudyParams, model, tokenizer, calibrated: KVScales, log=print) -> tuple[pd.DataFrame, dict]:
    """Perplexity, KL and top-1 against the exact cache, and the sensitive set (long context included) with
    flips against the exact cache's outputs, for every E2E format; the exact cache's row first. Each figure
    carries its interval (over held-out sequences, or Wilson over items), and the changes against the exact
    cache are paired over the same sequences and items (`kv_quantization_claims`)."""
    from lab.eval.harness import evaluate_model, heldout_texts, run_sensitive
    from lab.eval.sensitive import CATEGORIES, load_items
    from lab.studies.kv_quantization_claims import item_intervals, perplexity_change

    heldout = heldout_texts(tokenizer, p.HELDOUT_SEQUENCES, p.HELDOUT_TOKENS, p.SEED)
    items = [it for c in CATEGORIES for it in load_items((c,))[
        :p.LONG_CONTEXT_ITEMS if c == "long_context" else (p.ITEMS_PER_CATEGORY or None)]]
    ref_df = run_sensitive(model, tokenizer, items, p.MAX_TOKENS)
    rows, outputs = [], {"exact": ref_df}
    metrics, _, exact = evaluate_model(model, tokenizer, model, heldout, items, ref_df, p.MAX_TOKENS, df=ref_df)

    def changes(scores, df):
        return {**perplexity_change(scores, exact), **item_intervals(df, ref_df, CATEGORIES)}

    rows.append({"format": "exact", **metrics, **changes(exact, ref_df)})
    for name in tqdm(p.E2E_FORMATS, desc="KV formats, end to end"):
        fmt, _, _ = study_format(name)
        kv = (fmt, scales_for(name, model, calibrated))
        metrics, df, scores = evaluate_model(model, tokenizer, model, heldout, items, ref_df, p.MAX_TOKENS, kv=kv)
        rows.append({"format": name, **metrics, **changes(scores, df)})
        outputs[name] = df
        log(f"{name:40s} perplexity {metrics['perplexity']:.3f}, KL {metrics['kl_mean']:.5f}, "
            f"same outputs {metrics['same_output_all']:.2f}")
    return pd.DataFrame(rows), outputs


# ---- figures ------------------------------------------------------------------------------------------------


def _family(name: str) -> str:
    """A format's number type, the small multiple it is drawn in: fp8, int8, int4 or int2."""
    kind = name.split("/")[0]
    return "fp8" if kind.startswith("fp8") else kind


def plot_growth(df: pd.DataFrame, title: str):
    """Next-token KL against position (what the claim "the error grows with context" is judged on; the attention
    output error is in the table), one small multiple per number type in a row so no panel holds more than a
    handful of formats; each line a format with its 95% band over blocks (shaded). Positions are bucket ends on a
    log2 axis; each panel's log y axis is labelled at 1, 2 and 5 of every decade, so a reader can read a slope."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import LogFormatter, LogLocator

    families = sorted({_family(n) for n in df["format"]}, key=lambda f: ("fp8", "int8", "int4", "int2").index(f)
                      if f in ("fp8", "int8", "int4", "int2") else 9)
    fig, axes = plt.subplots(1, len(families), figsize=(3.6 * len(families), 3.9), squeeze=False)
    ends = sorted(df["position_end"].unique())
    d_all = df[df["metric"] == "next_token_kl"]
    for ax, family in zip(axes[0], families):
        d = d_all[d_all["format"].map(_family) == family]
        for i, (name, g) in enumerate(d.groupby("format", sort=False)):
            ax.plot(g["position_end"], g["value"], "o-", color=PALETTE[i], label=name.removeprefix(f"{family}_"),
                    lw=1.2, ms=3)
            ax.fill_between(g["position_end"], g["value_low"], g["value_high"], color=PALETTE[i], alpha=0.15)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(ends, [f"{e // 1024}K" if e >= 1024 else str(e) for e in ends], fontsize=7)
        ax.xaxis.set_minor_locator(plt.NullLocator())
        ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(LogFormatter(labelOnlyBase=False, minor_thresholds=(3, 1)))
        ax.yaxis.set_minor_locator(plt.NullLocator())
        ax.tick_params(axis="y", labelsize=7)
        ax.set(xlabel="position (bucket end, tokens)", title=f"{family} formats", ylabel="KL (nats, log scale)")
        ax.legend(fontsize=6, loc="upper center", bbox_to_anchor=(0.5, -0.2))
    axes[0][0].set_ylabel("next-token KL(exact || quantized) (nats, log scale)")
    fig.suptitle(f"Next-token KL by position, {title} (shaded: 95% bootstrap interval over blocks)", fontsize=10)
    fig.tight_layout()
    return fig


def plot_roles(roles: pd.DataFrame):
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 3.8))
    x = range(len(roles))
    labels = {"attention_rel_error": "attention output relative error (log scale)",
              "next_token_kl": "next-token KL, nats (log scale)"}
    for ax, metric in zip(axes, ("attention_rel_error", "next_token_kl")):
        for i, (shift, role, label) in enumerate(((-0.2, "k", "keys only quantized"),
                                                  (0.2, "v", "values only quantized"))):
            ax.bar([j + shift for j in x], roles[f"{metric}_{role}_only"], 0.4, label=label, color=PALETTE[i],
                   yerr=frame_extents(roles, f"{metric}_{role}_only", list(roles["format"])), capsize=3)
        ax.set_xticks(list(x), roles["format"], fontsize=8)
        ax.set(yscale="log", xlabel="KV format", ylabel=labels[metric],
               title=f"Keys against values quantized alone: {metric.replace('_', ' ')} (95% over blocks)")
        ax.title.set_fontsize(9)
        legend_outside(ax)
    fig.tight_layout()
    return fig


def plot_end_to_end(e2e: pd.DataFrame, concurrency: pd.DataFrame):
    """Per format (rows): the held-out perplexity change against the exact cache beside the 1% the lab reads
    "safe" as (the axis stops where that line stays readable; a format beyond it is marked at the edge with its
    value), the share of sensitive outputs changed, and how many sequences one KV pool holds, measured and
    predicted."""
    import matplotlib.pyplot as plt
    import numpy as np

    fig = plt.figure(figsize=(15, 4.6))
    grid = fig.add_gridspec(1, 4, width_ratios=(1, 1, 0.75, 1), wspace=0.15)  # a gap for the third's own labels
    first = fig.add_subplot(grid[0])
    axes = [first, fig.add_subplot(grid[1], sharey=first), fig.add_subplot(grid[3])]
    names = list(e2e["format"])
    y = np.arange(len(names))[::-1]
    limit = KVStudyParams.SAFE_PPL_PCT
    right = 4 * limit
    change = e2e["perplexity_change_pct"].to_numpy(float)
    shown = change <= right
    axes[0].axvline(limit, color="0.2", ls="--", label=f"'safe': within {limit:g}% (the lab's reading)")
    axes[0].errorbar(change[shown], y[shown], fmt="o", color=PALETTE[0], capsize=3,
                     xerr=frame_extents(e2e[shown], "perplexity_change_pct", [n for n, k in zip(names, shown) if k]),
                     label="change (95% over sequences, paired)")
    for yy, v in zip(y[~shown], change[~shown]):
        axes[0].annotate(f"{v:+.1f}% ->", (right, yy), ha="right", va="center", fontsize=8, color=PALETTE[5])
    axes[0].set_xlim(min(-0.5, float(e2e["perplexity_change_pct_low"].min()) - 0.2), right)
    axes[0].set_yticks(y, names, fontsize=8)
    axes[0].set(xlabel="perplexity change vs the exact cache (%)", ylabel="KV cache format",
                title="Held-out perplexity")
    # the share changed is 1 - the share unchanged: its interval runs from 1 - same's high to 1 - same's low
    changed = error_extents(1 - e2e["same_output_all"], 1 - e2e["same_output_all_high"],
                            1 - e2e["same_output_all_low"], names, scale=100)
    axes[1].barh(y, 100 * (1 - e2e["same_output_all"]), xerr=changed, capsize=3, color=PALETTE[1],
                 label="all but long context (Wilson 95%)")
    if "same_output_long_context" in e2e and e2e["same_output_long_context"].notna().any():
        axes[1].plot(100 * (1 - e2e["same_output_long_context"]), y, "D", color=PALETTE[3], label="long context")
    axes[1].tick_params(labelleft=False)  # the formats' names are the first panel's (a shared axis)
    axes[1].set(xlabel="greedy outputs changed (% of sensitive items)", title="Sensitive outputs changed")
    yc = np.arange(len(concurrency))[::-1]
    axes[2].barh(yc, concurrency["measured_sequences"], color=PALETTE[2], label="engine (measured)")
    axes[2].plot(concurrency["predicted_sequences"], yc, "kx", label="lab.memory (predicted)")
    axes[2].set_yticks(yc, list(concurrency["format"]), fontsize=8)
    axes[2].set(xlabel="sequences resident at once (count)", ylabel="KV cache format",
                title="Sequences one KV pool holds")
    for ax in axes:
        legend_outside(ax, loc="upper center", bbox_to_anchor=(0.5, -0.16))
    fig.suptitle("Each KV cache format against the exact cache, end to end", fontsize=10)
    return fig
