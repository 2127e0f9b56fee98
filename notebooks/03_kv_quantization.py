# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.7
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 03 · KV-cache quantization: formats, calibration, and error growth with context
#
# The deployment article (seeds/003, section 2.3) says: FP8 KV is usually safe, INT8 needs care, INT4 should
# stay out of online serving; keys are more sensitive than values, so keys want per-channel scales and values
# per-token ones; per-token dynamic scales beat a per-tensor static scale on long context; and the error
# accumulates with context, so short prompts hide it. The research anchors are KIVI (Liu et al., 2024,
# arXiv:2402.02750: per-channel keys, per-token values, a full-precision window of recent tokens) and KVQuant
# (Hooper et al., 2024, arXiv:2401.18079: keys quantized before RoPE); the production anchor is vLLM's FP8
# KV cache with per-tensor `k_scale`/`v_scale`, whose documentation warns that the default scale of 1.0 can
# degrade quality. This notebook tests each claim on SmolLM2-135M-Instruct with the formats of
# `lab.kv.format`, served by the lab engine's paged cache. The logic lives in `lab.studies.kv_quantization`,
# the intervals and the claims table in `lab.studies.kv_quantization.claims`.
#
# Every figure carries a 95% interval (`_low`, `_high` columns): on the one long text a block bootstrap over
# contiguous blocks of `BLOCK_TOKENS` positions, end to end a bootstrap over held-out sequences, and Wilson
# intervals for pass rates. A comparison of two formats resamples the same blocks or sequences for both
# (paired) and says whether its interval excludes no difference ("distinguishable") or not.
#
# Format names: `dtype/granularity[/groupN][/windowR][/pre-rope][/k-only|/v-only][/unit-scale]`.
# Static granularities (per-tensor, per-head) use scales calibrated on the stratified calibration set,
# or 1.0 with `/unit-scale`. "Exact" below is the unquantized cache in the model's dtype (float32 here;
# the weights are the GGUF's Q4_1/Q8_0, dequantized).

# %% tags=["parameters"]
PRESET = "quick"  # quick (minutes), reference (committed runs), smoke (tests) or gpu (CUDA); values set below win
INTERACTIVE = False  # show the widget cells
DEVICE = "auto"  # auto (CUDA when present, else the CPU), cpu, cuda or cuda:N; gpu preset needs CUDA
MODEL = "smollm2-135m"
CONTEXT = 8192  # tokens of held-out text for the position study (SmolLM2's context limit)
FIRST_BUCKET = 256  # position buckets 0-256, 256-512, 512-1K, ... up to CONTEXT
ATTENTION_STRIDE = 8  # attention error at every 8th query position (KL at every position)
BLOCK_TOKENS = 32  # positions per block that the intervals resample on the long text
# Formats whose attention error and KL are measured by position; K-only / V-only variants; end-to-end formats.
GROWTH_FORMATS = ("fp8_e4m3/per-tensor", "fp8_e4m3/per-tensor/unit-scale", "fp8_e4m3/per-token", "int8/per-tensor", "int8/per-token", "int4/per-tensor", "int4/per-token", "int4/per-channel/group16")  # also fp8_e5m2/..., int2/...
ROLE_FORMATS = ("int4/per-token/k-only", "int4/per-token/v-only", "int4/per-channel/group16/k-only")
E2E_FORMATS = ("fp8_e4m3/per-tensor", "int8/per-token", "int4/per-token")  # the safety claims' formats
CALIB_SAMPLES = 32  # calibration sequences for static scales
CALIB_TOKENS = 512
CALIB_METHOD = "max"  # or "percentile"
HELDOUT_SEQUENCES = 16
HELDOUT_TOKENS = 512
MAX_TOKENS = 64  # greedy tokens per sensitive item
ITEMS_PER_CATEGORY = 0  # sensitive items per category (long context aside); 0: all
LONG_CONTEXT_ITEMS = 4  # ~28 s each per format on 2 cores
POOL_MIB = 16.0  # KV pool for the concurrency measurement
CONCURRENCY_LEN = 256  # tokens per sequence there
SAFE_PPL_PCT = 1.0  # safe: perplexity within this many percent of the exact cache, no sensitive item lost
SEED = 0

# %% [markdown]
# **On your own model.** `MODEL` takes a local Hugging Face directory (config.json, safetensors, tokenizer files) of
# a supported architecture (docs/engine.md), or a `.gguf` file: `lab run 03_kv_quantization --preset reference
# -p MODEL /path/to/checkpoint` (add `-p DEVICE cuda` on a GPU, or take `--preset gpu`). What changes: the KV
# formats, their calibration and the error-growth measurement apply to any model whose layers keep keys and values
# per head; a model with sliding windows or attention soft-capping (Gemma 2/3) is refused by the formats that keep
# exact copies of
# recent tokens or quantize keys before RoPE, by name. With trained 16-bit weights the "exact" cache is the checkpoint's own
# dtype upcast to float32 rather than a dequantized GGUF. What takes longer: the cache per token grows with layers x
# KV heads x head_dim (SmolLM2: 30 x 3 x 64), the forwards with the parameter count, so on this CPU the run time
# grows about in proportion to the parameters (a proportion, not a measurement), most of it in the long-context
# items (`LONG_CONTEXT_ITEMS`: ~28 s each per format here).

# %%
import pandas as pd
import torch

from lab.models import load_model
from lab.quant.calibration import build_calibration_set
from lab.kv.calibration import calibrate_kv_absmax
from lab.workflow.run import params_from_namespace, resolve_device, start_run
from lab.studies import kv_quantization as study
from lab.studies.kv_quantization import claims

params = params_from_namespace(study.KVStudyParams, globals())  # validates every value before heavy work
run = start_run("03_kv_quantization", params)
# float32 on a GPU too: the exact cache is the accuracy reference every format is measured against (torch
# leaves TF32 off for float32 matmuls by default, so CUDA computes them in full float32 as well).
model, tok = load_model(params.MODEL, dtype=torch.float32, device=resolve_device(params.DEVICE))
print(f"{params.MODEL} on {model.embed_tokens.weight.device}, float32")

# %% [markdown]
# ## 1. Static scales from calibration, and what vLLM's 1.0 means here
# Per layer and KV head, the largest |K| and |V| over the calibration sequences (`calibrate_kv_absmax`), saved
# with the run. FP8 e4m3 reaches 448: a scale of 1.0 stores K and V as they are, so the question for 1.0 is not
# overflow but how many of the small values fall to the coarse bottom of the fp8 range.

# %%
calib = build_calibration_set(tok, n_samples=params.CALIB_SAMPLES, max_tokens=params.CALIB_TOKENS, seed=params.SEED)
scales = calibrate_kv_absmax(model, [list(x) for x in calib["input_ids"]], params.CALIB_METHOD)
scales.save(run.dir / "kv_scales.safetensors")
absmax = pd.DataFrame({"layer": range(scales.k.shape[0]), "K_absmax": scales.k.amax(1).tolist(),
                       "V_absmax": scales.v.amax(1).tolist(), "K_pre_rope_absmax": scales.k_pre_rope.amax(1).tolist()})
run.save_table("calibrated_absmax", absmax)
absmax.describe().round(2)

# %% [markdown]
# ## 2. Bytes per token and concurrency, from the engine
# Each format's pool bytes per token in the engine (codes and scales), beside `lab.memory`'s account, and how
# many sequences of `CONCURRENCY_LEN` tokens the engine ran at once in a pool of `POOL_MIB` MiB (measured),
# beside pool / (sequence blocks x block bytes) (predicted). A window's exact copies live outside the pool,
# one lane per running sequence (`staging_MiB`).

# %%
conc_formats = ["auto"] + [f for f in dict.fromkeys(params.GROWTH_FORMATS + params.E2E_FORMATS) if "only" not in f]
concurrency = study.max_concurrency(model, tok, conc_formats, scales, params.POOL_MIB, params.CONCURRENCY_LEN,
                                    params.MODEL)
run.save_table("concurrency", concurrency)
concurrency.round(2)

# %% [markdown]
# ## 3. Does the error grow with context? (every format, 256 to CONTEXT tokens)
# On `CONTEXT` tokens of held-out standard-library code: (a) every layer's attention output with K/V read
# through the format against the exact one, on the exact model's own q, k, v (the cache's error alone);
# (b) next-token KL(exact || quantized cache) with the model run on the quantized cache (errors compound
# through layers). A window and a per-channel key group still filling are read exactly per query, as at
# decode time (the engine's rule). Kept per block of `BLOCK_TOKENS` positions, bucketed by position with
# block-bootstrap intervals (shaded); the growth per doubling of context is fitted on each resample.

# %%
text = study.long_text(tok, params.CONTEXT, params.SEED)
print(f"{len(text.ids)} tokens from {len(text.sources)} held-out files")
blocks = study.error_growth(model, text.ids, list(params.GROWTH_FORMATS + params.ROLE_FORMATS), scales,
                            params.FIRST_BUCKET, params.ATTENTION_STRIDE, params.BLOCK_TOKENS)
run.save_table("error_by_block", blocks)
growth = claims.bucket_table(blocks)
run.save_table("error_by_position", growth)
is_role = growth["format"].str.endswith(("k-only", "v-only"))
run.save_figure("error_growth", study.plot_growth(growth[~is_role], "K and V quantized"))
is_role_block = blocks["format"].str.endswith(("k-only", "v-only"))
slopes = claims.growth_slope(blocks[~is_role_block], "next_token_kl")
run.save_table("growth_slopes", slopes)
slopes.round(4)

# %% [markdown]
# ## 4. Keys or values: which is the sensitive one?
# The same bits on keys only and on values only; the mean over position buckets, and K / V paired over
# the same blocks.

# %%
roles = claims.role_table(blocks[is_role_block])
run.save_table("k_vs_v", roles)
run.save_figure("k_vs_v", study.plot_roles(roles))
run.save_figure("k_vs_v_growth", study.plot_growth(growth[is_role], "keys only or values only quantized"))
roles.round(5)

# %% [markdown]
# ## 5. End to end: perplexity, the sensitive set, greedy agreement
# Perplexity, KL and top-1 on held-out code with the quantized cache (the contiguous reference cache), and
# the sensitive set through the engine's paged quantized cache (long-context items included): pass rates,
# items lost against the exact cache, and the share of greedy outputs that changed at all. Intervals over
# held-out sequences (perplexity, KL, top-1, and the perplexity change against the exact cache, paired) and
# Wilson intervals over items; `pass_change` is the pass rate against the exact cache, paired over items.

# %%
e2e, outputs = study.end_to_end(params, model, tok, scales)
run.save_table("end_to_end", e2e)
run.save_figure("end_to_end", study.plot_end_to_end(e2e, concurrency))
shown = ["perplexity", "perplexity_change_pct", "kl_mean", "top1_agreement", "pass_all", "pass_change",
         "lost_all", "same_output_all"]
cols = ["format"] + [c + s for c in shown for s in ("", "_low", "_high")] + \
    ["perplexity_change_significance", "pass_change_significance"] + [c for c in e2e.columns if c.endswith("long_context")]
e2e[cols].round(4)

# %% [markdown]
# ## 6. Claims and verdicts, computed from the tables above
# One row per claim in the shape every notebook's claims table has (`lab.claims.table.claim_row`): the claim, the
# article's statement, what was measured (the figure as "value [low, high]" first, then the rest of the
# evidence), the verdict and a note. Each verdict rests on an interval compared with the claim's boundary:
# holds or wrong when the interval lies on one side, "not distinguishable" when it holds the boundary. The
# second table keeps each claim's interval (`value`, `value_low`, `value_high`), its boundary (`null`) and
# whether the interval excludes it.

# %%
claim_table, claim_intervals = claims.claims_table(params, blocks, roles, e2e)
run.save_table("claims", claim_table)
run.save_table("verdict_intervals", claim_intervals)
with pd.option_context("display.max_colwidth", 200):
    display(claim_table)  # noqa: F821 (IPython)
    display(claim_intervals)  # noqa: F821

# %% [markdown]
# ## 7. Explore (INTERACTIVE)
# Pick formats to compare their error by position, and a format to read its sensitive outputs beside the
# exact cache's.

# %%
if INTERACTIVE:
    import ipywidgets as widgets
    import matplotlib.pyplot as plt

    from lab.workflow.widgets import panel

    pick = widgets.SelectMultiple(options=sorted(growth["format"].unique()), description="formats")

    def show_growth(formats):
        if formats:
            study.plot_growth(growth[growth["format"].isin(formats)], "selected formats")
            plt.show()

    display(panel(show_growth, {"formats": pick}, "error by position"))  # noqa: F821

    def show_outputs(name):
        merged = outputs["exact"].merge(outputs[name], on=["id", "category"], suffixes=("_exact", "_quant"))
        changed = int((merged["output_exact"] != merged["output_quant"]).sum())
        print(f"{name}: {changed} of {len(merged)} outputs differ from the exact cache's")
        with pd.option_context("display.max_colwidth", 80):
            display(merged[merged["output_exact"] != merged["output_quant"]][  # noqa: F821
                ["category", "id", "passed_exact", "passed_quant", "output_exact", "output_quant"]])

    display(panel(show_outputs, {"name": widgets.Dropdown(options=list(outputs)[1:])}, "changed outputs"))  # noqa: F821

# %%
run.save_metrics(claims=dict(zip(claim_table["claim"], claim_table["verdict"])),
                 wrong_claims=int((claim_table["verdict"] == "wrong").sum()),
                 not_distinguishable_claims=int((claim_table["verdict"] == "not distinguishable").sum()),
                 exact_perplexity=float(e2e["perplexity"].iloc[0]))

# %% [markdown]
# ## The finding
# One sentence, filled from this run's files, and its key figure, whose title is the sentence
# (`lab.studies.findings`; the README, the study doc and `lab report` print the same sentence).

# %%
from lab.studies.findings import key_figure, sentence

print(sentence(run.notebook, run.dir))
run.save_figure("finding", key_figure(run.notebook, run.dir))
run.finish()
