# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 02 · Weight quantization and accuracy on sensitive samples
#
# The folklore: "INT4 through GPTQ or AWQ is free". The deployment article (seeds/003, section 2) says
# more carefully that it is the highest-return optimization *and* the most common source of incidents:
# perplexity barely moves while numbers, code, rare names and long contexts break, and calibration data
# that does not match the traffic damages long summarization. This notebook measures that on
# SmolLM2-135M-Instruct with the lab's own RTN, GPTQ and AWQ (`lab.quant`) and its accuracy harness
# (`lab.eval`). The logic lives in `lab.studies.quant_accuracy`.
#
# **What "unquantized" means here.** The embedded model ships as a GGUF whose layers are 4-bit Q4_1
# (blocks of 32 with a scale and a minimum) and whose embedding is Q8_0; the lab dequantizes it to float32.
# So "unquantized" is that dequantized model, and every number below is re-quantization on top of it.

# %% tags=["parameters"]
PRESET = "quick"  # quick (minutes), reference (committed runs), smoke (tests) or gpu (CUDA); values set below win
INTERACTIVE = False  # show the widget cells
DEVICE = "auto"  # auto (CUDA when present, else the CPU), cpu, cuda or cuda:N; gpu preset needs CUDA
MODEL = "smollm2-135m"
METHODS = ("rtn", "gptq", "awq")
CONFIGS = ("w4g32", "w4g64", "w3g64", "w8")  # w<bits>g<group>, and w8 has one scale per output channel
GPTQ_CALIB = (64, 512)  # calibration (blocks, tokens per block); `lab bench quant` times 128 x 512
AWQ_CALIB = (16, 512)  # `lab bench quant` times 32 x 512
DOMAINS = ("code", "prose")  # held-out text for perplexity and KL: stdlib code and package READMEs
HELDOUT_SEQUENCES = 16  # per domain
HELDOUT_TOKENS = 512
MAX_TOKENS = 64  # greedy tokens per sensitive item
ITEMS_PER_CATEGORY = 0  # sensitive items per category (long context aside); 0: all
LONG_CONTEXT_ITEMS = 4  # each ~25 s per model on 2 cores; 0 leaves the category out
LONG_CONTEXT_CONFIGS = ("w4g64", "w3g64")
MISMATCH_METHOD = "gptq"
MISMATCH_CONFIG = "w3g64"
MISMATCH_SAMPLES = 128
SUMMARIZATION_DOCS = 8
CHECKPOINT_CONFIG = "w4g64"
N_PROMPTS = 6
QUANT_LAYERS = ()  # decoder layers to quantize, the rest left unquantized; () quantizes all of them
SEED = 0

# %%
import pandas as pd
import torch

from lab.eval.harness import bad_cases
from lab.models import load_model
from lab.models.loader import cache_dir
from lab.runs import params_from_namespace, resolve_device, start_run
from lab.studies import quant_accuracy as study
from lab.studies import quant_accuracy_plots as plots
from lab.studies import quant_accuracy_stats as stats

params = params_from_namespace(study.QuantAccuracyParams, globals())  # validates every value before heavy work
run = start_run("02_quantization_accuracy", params)
# float32 on a GPU too: accuracy is a small numerical difference, measured against a float32 reference (torch
# leaves TF32 off for float32 matmuls by default, so CUDA computes them in full float32 as well).
reference, tok = load_model(params.MODEL, dtype=torch.float32, device=resolve_device(params.DEVICE))
print(f"{params.MODEL} on {reference.embed_tokens.weight.device}: "
      f"{sum(p.numel() for p in reference.parameters()) / 1e6:.1f} M parameters, "
      f"dequantized from the GGUF's Q4_1 layers / Q8_0 embedding to float32")

# %% [markdown]
# ## 1. The grid: every method at every configuration
# Perplexity, KL(unquantized || quantized) and top-1 agreement per token on two held-out domains that no
# calibration set reads: **code** (standard-library files after the calibration cut) and **prose** (the READMEs of
# the installed Python packages), each with a 95% bootstrap interval over the `HELDOUT_SEQUENCES` sequences. The
# sensitive set (`calibration_data/sensitive/`) with greedy decoding: pass rate per category with its Wilson
# interval, items *lost* (passed unquantized, failed quantized) and the share of outputs that changed. `pass_all`
# leaves long context out (only `LONG_CONTEXT_CONFIGS` run it). Beside each GPTQ/AWQ row, what its calibration
# set is made of (`calib_<domain>_share`: code, prose = Python docs, chat = chat and Spec-Bench prompts).
# Quantization time is wall time on the device the run used (DEVICE).

# %%
res = study.run_grid(params, reference, tok)
grid = res.table
run.save_table("grid", grid)
run.save_table("sequence_scores", res.scores)
cols = ["model", "weight_MB_fp16_rest", "quant_s"] + [c for c in grid.columns if c.startswith("calib_")] + \
    [f"{d}_{m}" for d in params.DOMAINS for m in ("perplexity", "kl_mean", "top1_agreement")] + ["pass_all"]
grid[cols].round(3)

# %%
interval_cols = ["model"] + [c for c in grid.columns if c.endswith(("_low", "_high")) and not c.startswith("pass_")]
grid[interval_cols].round(3)

# %%
run.save_figure("grid", plots.plot_grid(grid, params.DOMAINS))
run.save_figure("pass_rates", plots.plot_pass_rates(grid))

# %% [markdown]
# ## 2. Does GPTQ/AWQ recover RTN's loss, per domain, and is the difference distinguishable?
# Each method against RTN at the same configuration on the same sequences: perplexity as a ratio and KL as a
# difference (paired bootstrap over sequences), the recovered share 1 - (method - unquantized) / (RTN -
# unquantized) with its interval, and the sensitive pass rate minus RTN's (paired over items). `*_vs_rtn` says
# whether the interval excludes no difference. Then each model against the unquantized one: the perplexity rise
# per domain beside the sensitive categories' pass-rate change (paired over items) and outputs changed.

# %%
recovery = stats.recovery_table(grid, res.scores, res.outputs)
run.save_table("recovery", recovery)
recovery.round(3)

# %%
sens = stats.sensitive_vs_perplexity(grid, res.scores, res.outputs)
run.save_table("sensitive_vs_perplexity", sens)
sens.round(1)

# %% [markdown]
# ## 3. Bad cases: items the unquantized model passes and a quantized one fails

# %%
outputs = res.outputs
worst = max((k for k in outputs if k != "unquantized"),
            key=lambda k: len(bad_cases(outputs["unquantized"], outputs[k], k=None)))
bad = bad_cases(outputs["unquantized"], outputs[worst], k=10)
run.save_table("bad_cases", bad.assign(model=worst))
print(f"most regressions: {worst} ({len(bad_cases(outputs['unquantized'], outputs[worst], k=None))} items)")
bad

# %% [markdown]
# ## 4. Calibration mismatch: short Q&A only versus the stratified mix
# The same method and configuration calibrated on each set at its natural lengths (each row says what its set is
# made of, by domain), evaluated on long Spec-Bench summarization prompts that neither set contains (KL and top-1
# over the prompt with intervals over prompts, and whether the greedy summary matches the unquantized model's,
# with a Wilson interval) and on the sensitive set. The two sides are compared on the same prompts.

# %%
mismatch, mismatch_scores = study.run_mismatch(params, reference, tok, outputs["unquantized"])
run.save_table("calibration_mismatch", mismatch)
run.save_table("mismatch_sequence_scores", mismatch_scores)
mismatch_ratio = stats.mismatch_comparison(mismatch, mismatch_scores) if len(mismatch) == 2 else None
print("summarization KL, short-Q&A over stratified:", mismatch_ratio)
mismatch.round(3).T

# %% [markdown]
# ## 5. A checkpoint, saved the way `lab quant` saves it, loaded back into the engine
# GPTQ format for RTN and GPTQ, AWQ GEMM format for AWQ. Greedy outputs of each loaded checkpoint beside the
# unquantized model's, and whether they equal the in-memory quantized model's (they must: loading is exact).
# The file sizes are checked against the byte account of `lab.memory` (fp32 for the unquantized parts, as
# saved here; GPTQ also stores `g_idx`, 4 bytes per input column, which the account leaves out).

# %%
prompts = study.checkpoint_prompts(tok, params.N_PROMPTS)
ckpt_out, ckpt_sizes = study.checkpoint_outputs(res.kept, reference, tok, prompts, params.MAX_TOKENS,
                                                cache_dir() / "checkpoints" / run.dir.name, params.MODEL)
run.save_table("checkpoint_outputs", ckpt_out)
run.save_table("checkpoint_sizes", ckpt_sizes)
ckpt_sizes.round(3)

# %%
with pd.option_context("display.max_colwidth", 120):
    display(ckpt_out.sort_values(["prompt", "model"]))  # noqa: F821 (IPython)

# %% [markdown]
# ## 6. Claims and verdicts, computed from the tables above
# The deployment article's quantization claims (seeds/003 section 2) judged from the paired intervals: holds when
# the whole interval agrees, wrong when none of it does, not distinguishable when it straddles. `lab claims`
# gathers this table into the ledger (`results/CLAIMS.md`).

# %%
claims = stats.claims_table(sens, recovery, grid, res.scores, outputs, params.CHECKPOINT_CONFIG, mismatch_ratio)
run.save_table("claims", claims)
verdicts = "\n".join(stats.verdict_lines(recovery, sens, mismatch_ratio))
(run.dir / "verdicts.txt").write_text(verdicts + "\n")
print(verdicts)
claims

# %% [markdown]
# ## 7. Explore (INTERACTIVE)
# Pick a model and a category to read its outputs beside the unquantized model's.

# %%
if INTERACTIVE:
    import ipywidgets as widgets

    from lab.widgets import panel

    pick_model = widgets.Dropdown(options=[k for k in outputs if k != "unquantized"], description="model")
    pick_cat = widgets.Dropdown(options=sorted(outputs["unquantized"]["category"].unique()), description="category")

    def show(model, category):
        ref = outputs["unquantized"]
        merged = ref.merge(outputs[model], on=["id", "category"], suffixes=("_ref", "_quant"))
        view = merged[merged["category"] == category][["id", "passed_ref", "passed_quant", "output_ref",
                                                        "output_quant", "reason_quant"]]
        with pd.option_context("display.max_colwidth", 80):
            display(view)  # noqa: F821

    display(panel(show, {"model": pick_model, "category": pick_cat}, "outputs beside the unquantized"))  # noqa: F821

# %%
key = params.CHECKPOINT_CONFIG
at_key = grid[grid["config"] == key].set_index("method")
run.save_metrics(**{f"reference_{d}_perplexity": float(grid.iloc[0][f"{d}_perplexity"]) for d in params.DOMAINS},
                 **{f"{m}_{key}_{d}_perplexity": float(at_key.loc[m, f"{d}_perplexity"])
                    for m in at_key.index for d in params.DOMAINS},
                 **{f"{m}_{key}_pass_all": float(at_key.loc[m, "pass_all"]) for m in at_key.index},
                 wrong_claims=int((claims["verdict"] == "wrong").sum()),
                 not_distinguishable_claims=int((claims["verdict"] == "not distinguishable").sum()))
run.finish()
