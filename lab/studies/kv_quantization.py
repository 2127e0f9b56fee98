"""KV-cache quantization: formats, calibration, and error growth with context (notebook 03).

The deployment article (seeds/003, section 2.3) claims: FP8 KV is usually safe, INT8 needs care, INT4 should
stay out of online serving; keys are more sensitive than values, so keys want per-channel scales and values
per-token ones (KIVI, arXiv:2402.02750); per-token dynamic scales beat a per-tensor static scale on long
context; and the error accumulates with context, so short prompts hide it. This module measures each claim on
SmolLM2 with the formats of `lab.quant.kv`:

- the cache's own error and its end-to-end effect, per position (`lab.eval.kv_error`: the attention output
  against exact K/V on the exact model's own queries, keys and values; next-token KL with every layer's
  K/V stored through the format), on a long held-out text (`lab.eval.harness.long_text`);
- both bucketed by position (256, 512, ... up to the text's length), for any list of formats, including
  K-only and V-only variants (`error_growth`, `growth_slope`, `role_table`);
- perplexity, KL and the sensitive set through the engine's quantized cache (`end_to_end`), and how many
  sequences one KV pool holds in each format (`max_concurrency`), beside `lab.memory`'s account.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import pandas as pd
import torch
from tqdm.auto import tqdm

from lab.engine import EngineConfig
from lab.eval.harness import long_text  # noqa: F401  (notebook 03 calls study.long_text)
from lab.eval.kv_error import attention_error_by_position, kl_by_position, record
from lab.quant.kv import KVCacheFormat, parse_format
from lab.quant.kv_calibration import KVScales
from lab.runs import as_tuple, check_choice, check_range


def position_buckets(n: int, first: int = 256) -> list[tuple[int, int]]:
    """[0, first), [first, 2 first), [2 first, 4 first) ... up to n."""
    edges = [0, first]
    while edges[-1] < n:
        edges.append(edges[-1] * 2)
    edges[-1] = n
    return [(a, b) for a, b in zip(edges, edges[1:]) if a < n]


def _bucketed(values: torch.Tensor, buckets, **labels) -> list[dict]:
    return [{**labels, "positions": f"{a}-{b}", "position_end": b, "value": float(values[a:b].nanmean())}
            for a, b in buckets]


def growth_slope(df: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Per format: the metric in the first and last position bucket, their ratio, and the least-squares slope
    of log(metric) against log2(bucket end), i.e. how many times larger the error gets per doubling."""
    rows = []
    for name, g in df[df["metric"] == metric].groupby("format", sort=False):
        g = g.sort_values("position_end")
        x = [math.log2(v) for v in g["position_end"]]
        y = [math.log(max(v, 1e-30)) for v in g["value"]]
        n = len(x)
        mx, my = sum(x) / n, sum(y) / n
        den = sum((a - mx) ** 2 for a in x)
        slope = sum((a - mx) * (b - my) for a, b in zip(x, y)) / den if den else float("nan")
        rows.append({"format": name, "first_bucket": g["value"].iloc[0], "last_bucket": g["value"].iloc[-1],
                     "last_over_first": g["value"].iloc[-1] / g["value"].iloc[0], "x_per_doubling": math.exp(slope)})
    return pd.DataFrame(rows)


# ---- the notebook's parameters, formats and experiments ---------------------------------------------------

UNIT_SCALE = "unit-scale"  # a format-name suffix of this study: static scales of 1.0 (vLLM's default)
ENGINE_BLOCK_SIZE = EngineConfig.block_size  # the engine's default block size, which the study's engines use


@dataclass
class KVStudyParams:
    PRESET: str = "quick"
    INTERACTIVE: bool = False
    MODEL: str = "smollm2-135m"
    CONTEXT: int = 8192  # tokens of held-out text for the position study (SmolLM2's context limit)
    FIRST_BUCKET: int = 256
    ATTENTION_STRIDE: int = 8  # attention error measured at every 8th query position
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
    # quick: 2K tokens of context, one format per family and the claims' pairs, fewer evaluation tokens, no
    # long context (minutes instead of 56); smoke: the tests' seconds.
    PRESETS: ClassVar[dict] = {
        "quick": {"CONTEXT": 2048, "GROWTH_FORMATS": ("fp8_e4m3/per-tensor", f"fp8_e4m3/per-tensor/{UNIT_SCALE}",
                                                      "int8/per-tensor", "int8/per-token", "int4/per-token",
                                                      "int4/per-channel/group16", "int2/per-token"),
                  "ROLE_FORMATS": ("int4/per-token/k-only", "int4/per-token/v-only"),
                  "E2E_FORMATS": ("fp8_e4m3/per-tensor", "int8/per-token", "int4/per-token"),
                  "CALIB_SAMPLES": 8, "CALIB_TOKENS": 256, "HELDOUT_SEQUENCES": 8, "HELDOUT_TOKENS": 256,
                  "MAX_TOKENS": 32, "ITEMS_PER_CATEGORY": 4, "LONG_CONTEXT_ITEMS": 0},
        "smoke": {"CONTEXT": 192, "FIRST_BUCKET": 32, "CALIB_SAMPLES": 2, "CALIB_TOKENS": 64,
                  "GROWTH_FORMATS": ("fp8_e4m3/per-tensor", f"fp8_e4m3/per-tensor/{UNIT_SCALE}",
                                     "int2/per-channel/group16/window32"),
                  "ROLE_FORMATS": ("int4/per-token/k-only", "int4/per-token/v-only"),
                  "E2E_FORMATS": ("fp8_e4m3/per-tensor", "int4/per-token"), "HELDOUT_SEQUENCES": 2, "HELDOUT_TOKENS": 64,
                  "MAX_TOKENS": 8, "ITEMS_PER_CATEGORY": 1, "LONG_CONTEXT_ITEMS": 0, "POOL_MIB": 2.0,
                  "CONCURRENCY_LEN": 64},
    }

    def __post_init__(self):
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
                 stride: int = 1, log=print) -> pd.DataFrame:
    """Attention-output relative error and next-token KL by position bucket for every format name (which may
    end in "/unit-scale"), on one recording of the text; static formats use `calibrated` scales."""
    rec = record(model, ids)
    exact = rec.hidden
    buckets = position_buckets(len(ids), first_bucket)
    rows = []
    for name in tqdm(names, desc="KV formats, by position"):
        fmt, roles, _ = study_format(name)
        scales = scales_for(name, model, calibrated)
        att = attention_error_by_position(model, rec, fmt, roles, scales, stride)
        kl = kl_by_position(model, ids, exact, fmt, roles, scales)
        rows += _bucketed(att, buckets, format=name, metric="attention_rel_error")
        rows += _bucketed(kl, buckets, format=name, metric="next_token_kl")
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
            llm.add_request(torch.randint(0, vocab, (seq_len - 1,), generator=gen).tolist(),
                            SamplingParams(temperature=0, max_tokens=1, ignore_eos=True))
        peak = 0
        while llm.scheduler.has_unfinished():
            llm.step()
            peak = max(peak, len(llm.last_schedule.scheduled))
        rows.append({**row, "measured_sequences": peak, "staging_MiB": llm.stats()["kv_staging_bytes"] / 2 ** 20})
    return pd.DataFrame(rows)


def end_to_end(p: KVStudyParams, model, tokenizer, calibrated: KVScales, log=print) -> tuple[pd.DataFrame, dict]:
    """Perplexity, KL and top-1 against the exact cache, and the sensitive set (long context included) with
    flips against the exact cache's outputs, for every E2E format; the exact cache's row first."""
    from lab.eval.harness import evaluate_model, heldout_texts, run_sensitive
    from lab.eval.sensitive import CATEGORIES, load_items

    heldout = heldout_texts(tokenizer, p.HELDOUT_SEQUENCES, p.HELDOUT_TOKENS, p.SEED)
    items = [it for c in CATEGORIES for it in load_items((c,))[
        :p.LONG_CONTEXT_ITEMS if c == "long_context" else (p.ITEMS_PER_CATEGORY or None)]]
    ref_df = run_sensitive(model, tokenizer, items, p.MAX_TOKENS)
    rows, outputs = [], {"exact": ref_df}
    metrics, _ = evaluate_model(model, tokenizer, model, heldout, items, ref_df, p.MAX_TOKENS, df=ref_df)
    rows.append({"format": "exact", **metrics})
    for name in tqdm(p.E2E_FORMATS, desc="KV formats, end to end"):
        fmt, _, _ = study_format(name)
        metrics, df = evaluate_model(model, tokenizer, model, heldout, items, ref_df, p.MAX_TOKENS,
                                     kv=(fmt, scales_for(name, model, calibrated)))
        rows.append({"format": name, **metrics})
        outputs[name] = df
        log(f"{name:40s} perplexity {metrics['perplexity']:.3f}, KL {metrics['kl_mean']:.5f}, "
            f"same outputs {metrics['same_output_all']:.2f}")
    return pd.DataFrame(rows), outputs


def role_table(df: pd.DataFrame) -> pd.DataFrame:
    """K-only beside V-only at the same format: mean attention error and KL over all positions, and K / V."""
    rows = []
    means = df.groupby(["format", "metric"])["value"].mean()
    for name in sorted({f.rsplit("/", 1)[0] for f in df["format"] if f.endswith(("/k-only", "/v-only"))}):
        row = {"format": name}
        for metric in ("attention_rel_error", "next_token_kl"):
            k, v = (means.get((f"{name}/{r}-only", metric), float("nan")) for r in "kv")
            row.update({f"{metric}_k_only": k, f"{metric}_v_only": v, f"{metric}_k_over_v": k / v})
        rows.append(row)
    return pd.DataFrame(rows)


# ---- figures and verdicts ------------------------------------------------------------------------------------


def plot_growth(df: pd.DataFrame, title: str):
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(14, 4.5))
    for ax, metric, label in ((axes[0], "attention_rel_error", "attention output relative error"),
                              (axes[1], "next_token_kl", "next-token KL(exact || quantized), nats")):
        for name, g in df[df["metric"] == metric].groupby("format", sort=False):
            ax.plot(g["position_end"], g["value"], "o-", label=name, lw=1.2, ms=3)
        ax.set(xscale="log", yscale="log", xlabel="position (bucket end, tokens)", ylabel=label, title=title)
        ax.legend(fontsize=6)
    fig.tight_layout()
    return fig


def plot_roles(roles: pd.DataFrame):
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.5))
    x = range(len(roles))
    for ax, metric in zip(axes, ("attention_rel_error", "next_token_kl")):
        ax.bar([i - 0.2 for i in x], roles[f"{metric}_k_only"], 0.4, label="keys only quantized")
        ax.bar([i + 0.2 for i in x], roles[f"{metric}_v_only"], 0.4, label="values only quantized")
        ax.set_xticks(list(x), roles["format"], fontsize=8)
        ax.set(yscale="log", title=metric.replace("_", " "))
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def plot_end_to_end(e2e: pd.DataFrame, concurrency: pd.DataFrame):
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 4))
    names = list(e2e["format"])
    axes[0].bar(names, 100 * (e2e["perplexity"] / e2e["perplexity"].iloc[0] - 1))
    axes[0].set(ylabel="perplexity change vs exact cache, %", title="held-out perplexity")
    axes[1].bar(names, 100 * (1 - e2e["same_output_all"]), label="all but long context")
    if "same_output_long_context" in e2e and e2e["same_output_long_context"].notna().any():
        axes[1].plot(names, 100 * (1 - e2e["same_output_long_context"]), "ko", label="long context")
    axes[1].set(ylabel="% of greedy outputs changed", title="sensitive set vs exact cache")
    axes[1].legend(fontsize=7)
    axes[2].bar(concurrency["format"], concurrency["measured_sequences"], label="engine (measured)")
    axes[2].plot(concurrency["format"], concurrency["predicted_sequences"], "kx", label="lab.memory (predicted)")
    axes[2].set(ylabel="sequences resident at once", title="concurrency in one KV pool")
    axes[2].legend(fontsize=7)
    for ax in axes:
        ax.tick_params(axis="x", labelrotation=60, labelsize=7)
    fig.tight_layout()
    return fig


def verdicts(p: KVStudyParams, growth: pd.DataFrame, roles: pd.DataFrame, e2e: pd.DataFrame) -> list[dict]:
    """Each claim of the article, a measured yes or no, and the numbers behind it (only claims whose formats
    were run)."""
    out = []
    mean = growth.groupby(["format", "metric"])["value"].mean()
    last = growth[growth["position_end"] == growth["position_end"].max()].set_index(["format", "metric"])["value"]
    base = e2e.set_index("format")
    exact_ppl = base.loc["exact", "perplexity"]

    def claim(text, holds, evidence):
        out.append({"claim": text, "holds": "yes" if holds else "no", "evidence": evidence})

    def safe(name):
        r = base.loc[name]
        d = 100 * (r["perplexity"] / exact_ppl - 1)
        lost = r["lost_all"] + (0 if math.isnan(r.get("lost_long_context", math.nan)) else r["lost_long_context"])
        return d <= p.SAFE_PPL_PCT and lost == 0, (f"{name}: perplexity {d:+.2f}%, {int(lost)} sensitive items lost, "
                                                    f"{100 * (1 - r['same_output_all']):.0f}% of outputs changed")

    for name, text, want in (("fp8_e4m3/per-tensor", "FP8 (e4m3, calibrated per-tensor scale) is safe", True),
                             ("int8/per-token", "INT8 needs care (is not safe as is)", False),
                             ("int4/per-token", "INT4 is not safe for online serving", False)):
        if name in base.index:
            ok, ev = safe(name)
            claim(text, ok == want, ev + f" (safe = within {p.SAFE_PPL_PCT}% perplexity and no item lost)")
    unit = f"fp8_e4m3/per-tensor/{UNIT_SCALE}"
    if ("fp8_e4m3/per-tensor", "next_token_kl") in mean and (unit, "next_token_kl") in mean:
        a, b = mean[(unit, "next_token_kl")], mean[("fp8_e4m3/per-tensor", "next_token_kl")]
        claim("vLLM's default scale of 1.0 hurts FP8 quality", a > 1.5 * b,
              f"mean KL {a:.2e} with scale 1.0 vs {b:.2e} calibrated ({a / b:.2f}x; 'hurts' = over 1.5x)")
    for _, r in roles.iterrows():
        k, v = r["next_token_kl_k_only"], r["next_token_kl_v_only"]
        if not math.isnan(k / v):
            claim(f"keys are more sensitive than values ({r['format']})", k > v,
                  f"KL keys-only {k:.2e} vs values-only {v:.2e} ({k / v:.2f}x); attention error "
                  f"{r['attention_rel_error_k_only']:.3f} vs {r['attention_rel_error_v_only']:.3f}")
    if ("int4/per-channel/group16/k-only", "next_token_kl") in mean and ("int4/per-token/k-only", "next_token_kl") in mean:
        a, b = mean[("int4/per-channel/group16/k-only", "next_token_kl")], mean[("int4/per-token/k-only", "next_token_kl")]
        claim("keys want per-channel scales (KIVI): int4 keys per-channel beat per-token", a < b,
              f"KL keys-only per-channel {a:.2e} vs per-token {b:.2e}")
    for dyn, static in (("int8/per-token", "int8/per-tensor"), ("int4/per-token", "int4/per-tensor"),
                        ("fp8_e4m3/per-token", "fp8_e4m3/per-tensor")):
        if (dyn, "next_token_kl") in last and (static, "next_token_kl") in last:
            a, b = last[(dyn, "next_token_kl")], last[(static, "next_token_kl")]
            claim(f"per-token dynamic beats per-tensor static on long context ({dyn.split('/')[0]})", a < b,
                  f"KL in the last position bucket: per-token {a:.2e} vs per-tensor {b:.2e} ({b / a:.2f}x)")
    slopes = growth_slope(growth, "next_token_kl")
    grows = slopes[slopes["last_over_first"] > 1]
    claim("the error grows with context, so short prompts hide it", len(grows) > len(slopes) / 2,
          f"KL last/first bucket > 1 for {len(grows)} of {len(slopes)} formats; median x per doubling "
          f"{slopes['x_per_doubling'].median():.2f}")
    return out
