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
PRESET = "quick"  # quick (minutes), reference (the committed runs) or smoke (tests); values set below win
INTERACTIVE = False  # show the widget cells
MODEL = "smollm2-135m"
METHODS = ("rtn", "gptq", "awq")
CONFIGS = ("w4g32", "w4g64", "w3g64", "w8")  # w<bits>g<group>, and w8 has one scale per output channel
GPTQ_CALIB = (64, 512)  # calibration (blocks, tokens per block); `lab bench quant` times 128 x 512
AWQ_CALIB = (16, 512)  # `lab bench quant` times 32 x 512
HELDOUT_SEQUENCES = 16
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
SEED = 0

# %%
import torch

from lab.eval.harness import bad_cases
from lab.models import load_model
from lab.models.loader import cache_dir
from lab.runs import params_from_namespace, start_run
from lab.studies import quant_accuracy as study

params = params_from_namespace(study.QuantAccuracyParams, globals())  # validates every value before heavy work
run = start_run("02_quantization_accuracy", params)
reference, tok = load_model(params.MODEL, dtype=torch.float32, device="cpu")
print(f"{params.MODEL}: {sum(p.numel() for p in reference.parameters()) / 1e6:.1f} M parameters, "
      f"dequantized from the GGUF's Q4_1 layers / Q8_0 embedding to float32")

# %% [markdown]
# ## 1. The grid: every method at every configuration
# Perplexity on held-out standard-library code (files no calibration set reads), KL(unquantized ||
# quantized) and top-1 agreement per token, and the sensitive set (`calibration_data/sensitive/`) with
# greedy decoding: pass rate per category, items *lost* (passed unquantized, failed quantized) and the
# share of outputs that changed at all. `pass_all` leaves long context out (only the configurations in
# `LONG_CONTEXT_CONFIGS` run it). Quantization time is wall time on this machine.

# %%
grid, kept, outputs = study.run_grid(params, reference, tok)
run.save_table("grid", grid)
cols = ["method", "config", "weight_MB_fp16_rest", "quant_s", "perplexity", "kl_mean", "top1_agreement"] + \
    [c for c in grid.columns if c.startswith("pass_")]
grid[cols].round(3)

# %%
run.save_figure("grid", study.plot_grid(grid))
run.save_figure("pass_rates", study.plot_pass_rates(grid))

# %% [markdown]
# ## 2. Does GPTQ/AWQ recover RTN's loss, and does perplexity tell the whole story?
# Recovered share = 1 - (method - unquantized) / (RTN - unquantized), for perplexity and KL. Then, per
# model, the perplexity rise beside the sensitive categories' pass-rate change and changed outputs.

# %%
recovery = study.recovery_table(grid)
run.save_table("recovery", recovery)
recovery.round(3)

# %%
sens = study.sensitive_vs_perplexity(grid)
run.save_table("sensitive_vs_perplexity", sens)
sens.round(1)

# %% [markdown]
# ## 3. Bad cases: items the unquantized model passes and a quantized one fails

# %%
worst = max((k for k in outputs if k != "unquantized"),
            key=lambda k: len(bad_cases(outputs["unquantized"], outputs[k], k=None)))
bad = bad_cases(outputs["unquantized"], outputs[worst], k=10)
run.save_table("bad_cases", bad.assign(model=worst))
print(f"most regressions: {worst} ({len(bad_cases(outputs['unquantized'], outputs[worst], k=None))} items)")
bad

# %% [markdown]
# ## 4. Calibration mismatch: short Q&A only versus the stratified mix
# The same method and configuration calibrated on each set at its natural lengths, evaluated on long
# Spec-Bench summarization prompts that neither set contains (KL and top-1 over the prompt, and whether the
# greedy summary matches the unquantized model's) and on the sensitive set.

# %%
mismatch = study.run_mismatch(params, reference, tok, outputs["unquantized"])
run.save_table("calibration_mismatch", mismatch)
mismatch.round(3).T

# %% [markdown]
# ## 5. A checkpoint, saved the way `lab quant` saves it, loaded back into the engine
# GPTQ format for RTN and GPTQ, AWQ GEMM format for AWQ. Greedy outputs of each loaded checkpoint beside the
# unquantized model's, and whether they equal the in-memory quantized model's (they must: loading is exact).
# The file sizes are checked against the byte account of `lab.memory` (fp32 for the unquantized parts, as
# saved here; GPTQ also stores `g_idx`, 4 bytes per input column, which the account leaves out).

# %%
prompts = study.checkpoint_prompts(tok, params.N_PROMPTS)
ckpt_out, ckpt_sizes = study.checkpoint_outputs(kept, reference, tok, prompts, params.MAX_TOKENS,
                                                cache_dir() / "checkpoints" / run.dir.name, params.MODEL)
run.save_table("checkpoint_outputs", ckpt_out)
run.save_table("checkpoint_sizes", ckpt_sizes)
ckpt_sizes.round(3)

# %%
import pandas as pd

with pd.option_context("display.max_colwidth", 120):
    display(ckpt_out.sort_values(["prompt", "model"]))  # noqa: F821 (IPython)

# %% [markdown]
# ## 6. Verdicts, computed from the tables above

# %%
base = grid.iloc[0]
lines = []
for _, r in recovery.iterrows():
    lines.append(f"{r['method']} {r['config']}: recovers {100 * r['perplexity_recovered']:.0f}% of RTN's perplexity "
                 f"loss and {100 * r['kl_mean_recovered']:.0f}% of its KL")
for _, r in grid.iloc[1:].iterrows():
    changed = 100 * (1 - r["same_output_all"])
    lines.append(f"{r['method']} {r['config']}: perplexity {100 * (r['perplexity'] / base['perplexity'] - 1):+.1f}%, "
                 f"sensitive pass {100 * (r['pass_all'] - base['pass_all']):+.1f} pts, {changed:.0f}% of outputs changed")
if len(mismatch) == 2 and "summ_kl_mean" in mismatch:
    a, b = mismatch.set_index("calibration").loc[["short_qa", "stratified"], "summ_kl_mean"]
    lines.append(f"summarization KL: short_qa calibration {a:.3f} vs stratified {b:.3f} ({a / b:.2f}x)")
verdicts = "\n".join(lines)
(run.dir / "verdicts.txt").write_text(verdicts + "\n")
print(verdicts)

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
run.save_metrics(reference_perplexity=float(base["perplexity"]),
                 **{f"{m}_{key}_perplexity": float(at_key.loc[m, "perplexity"]) for m in at_key.index},
                 **{f"{m}_{key}_pass_all": float(at_key.loc[m, "pass_all"]) for m in at_key.index})
run.finish()
