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
# # 02 · Weight quantization and accuracy on sensitive samples
#
# The folklore: "INT4 through GPTQ or AWQ is free". The deployment article (seeds/003, section 2) says
# more carefully that it is the highest-return optimization *and* the most common source of incidents:
# perplexity barely moves while numbers, code, rare names and long contexts break, and calibration data
# that does not match the traffic damages long summarization. This notebook measures that on
# SmolLM2-135M-Instruct with the lab's own RTN, GPTQ and AWQ (`lab.quant`), llama.cpp's GGUF grids (Q4_1, Q4_0,
# Q8_0) and its accuracy harness (`lab.eval`). The logic lives in `lab.studies.quant_accuracy`.
#
# **The embedded model is already 4-bit.** It ships as a GGUF whose decoder linears are Q4_1 (blocks of 32 columns,
# each w = d q + m with q in 0..15 and a float16 scale d and minimum m) and whose embedding is Q8_0; the lab
# dequantizes it to float32, and that is the "unquantized" model here. So quantizing it to 4 bits again measures
# a *grid mismatch*: on its own grid (`gguf-q4_1`, the control) it comes back bit for bit and its perplexity
# change is exactly 0, while RTN w4g32 re-rounds it onto a grid shifted from its own. Section 0 detects this from
# the weights; section 6 splits each model's loss into the grid's part and the part from fewer bits. None of this
# measures what quantizing a 16-bit model costs, which is what the article's claims are about: on this model
# their verdicts are "not checkable here" (section 7), and what it can say is which method best preserves an
# already-4-bit model. Set `MODEL` to a 16-bit checkpoint and the same notebook measures the claims themselves.

# %% tags=["parameters"]
PRESET = "quick"  # quick (minutes), reference (committed runs), smoke (tests) or gpu (CUDA); values set below win
INTERACTIVE = False  # show the widget cells
DEVICE = "auto"  # auto (CUDA when present, else the CPU), cpu, cuda or cuda:N; gpu preset needs CUDA
MODEL = "smollm2-135m"
METHODS = ("rtn", "gptq", "awq", "gguf-q4_1")  # GGUF grids (also gguf-q4_0, gguf-q8_0) once each, at their own grid
CONFIGS = ("w4g64",)  # w<bits>g<group> (w4g32, w3g64, ...), and w8 has one scale per output channel
GPTQ_CALIB = (64, 512)  # calibration (blocks, tokens per block); `lab bench quant` times 128 x 512
AWQ_CALIB = (16, 512)  # `lab bench quant` times 32 x 512
DOMAINS = ("code", "prose")  # held-out text for perplexity and KL: stdlib code and package READMEs
HELDOUT_SEQUENCES = 16  # per domain
HELDOUT_TOKENS = 512
MAX_TOKENS = 64  # greedy tokens per sensitive item
ITEMS_PER_CATEGORY = 0  # sensitive items per category (long context aside); 0: all
LONG_CONTEXT_ITEMS = 4  # each ~25 s per model on 2 cores; 0 leaves the category out
LONG_CONTEXT_CONFIGS = ("w4g64",)
MISMATCH_METHOD = "gptq"
MISMATCH_CONFIG = "w3g64"
MISMATCH_SAMPLES = 128
SUMMARIZATION_DOCS = 8
CHECKPOINT_CONFIG = "w4g64"
N_PROMPTS = 6
QUANT_LAYERS = ()  # decoder layers to quantize, the rest left unquantized; () quantizes all of them
LADDER_GROUPS = (64, 128)  # the loss decomposition: RTN's group sizes after w4g32 (section 5)
LADDER_BITS = (3, 2)  # then fewer bits, at the last of LADDER_GROUPS
SEED = 0

# %% [markdown]
# **On your own model.** `MODEL` takes a local Hugging Face directory (config.json, safetensors, one file or
# sharded with model.safetensors.index.json, and the tokenizer files) of a supported dense architecture (the list:
# docs/engine.md; the mixtures of experts are refused by `lab.quant`, and GPTQ/AWQ also refuse OLMo 2's post-norm
# layer), or a `.gguf` file (Llama, Qwen2). From a shell, with papermill:
# `lab run 02_quantization_accuracy --preset reference -p MODEL /path/to/checkpoint` (add `-p DEVICE cuda` on a
# GPU, or take `--preset gpu`). What changes: section 0 then finds whether the weights are 16-bit; for a 16-bit
# checkpoint the GGUF control is no longer exactly 0, the ladder measures the cost of fewer bits on trained weights,
# and section 7's claims get verdicts about quantizing 16-bit weights rather than "not checkable here". What takes
# longer: every forward, GPTQ's per-layer Hessians and the held-out perplexities grow with the parameter count, so
# on this CPU expect the run time to grow about in proportion to it (a 0.5B model about 4x SmolLM2-135M's; a
# proportion, not a measurement); the sensitive items' long-context category grows with the context too.

# %%
import pandas as pd
import torch

from lab.eval.harness import bad_cases
from lab.models import load_model
from lab.models.loader import cache_dir
from lab.quant.gguf_grids import already_quantized
from lab.workflow.run import params_from_namespace, resolve_device, start_run
from lab.studies.quant_accuracy import measure as study, ladder, plots, stats

params = params_from_namespace(study.QuantAccuracyParams, globals())  # validates every value before heavy work
run = start_run("02_quantization_accuracy", params)
# float32 on a GPU too: accuracy is a small numerical difference, measured against a float32 reference (torch
# leaves TF32 off for float32 matmuls by default, so CUDA computes them in full float32 as well).
reference, tok = load_model(params.MODEL, dtype=torch.float32, device=resolve_device(params.DEVICE))
print(f"{params.MODEL} on {reference.embed_tokens.weight.device}: "
      f"{sum(p.numel() for p in reference.parameters()) / 1e6:.1f} M parameters, in float32")

# %% [markdown]
# ## 0. Is the baseline already quantized?
# A trained 16-bit weight has 32 distinct values in nearly every block of 32 consecutive input columns; a
# dequantized 4-bit GGUF has at most 16. `already_quantized` counts them over every decoder linear, and the run
# records the answer (`weights16` in metrics.json, which the ledger reads): only a baseline found not quantized
# makes the accuracy figures below evidence about quantizing 16-bit weights.

# %%
baseline = already_quantized(reference)
run.save_metrics(**ladder.baseline_metrics(baseline))
print(f"{params.MODEL}: {baseline}")
print("so re-quantizing it measures a grid mismatch, not the cost of quantizing 16-bit weights" if baseline.detected
      else "so the accuracy figures below measure what quantizing these weights costs")

# %% [markdown]
# ## 1. The grid: every method at every configuration
# Perplexity, KL(unquantized || quantized) and top-1 agreement per token on two held-out domains that no
# calibration set reads: **code** (standard-library files after the calibration cut) and **prose** (the READMEs of
# the Python distributions the lab requires), each with a 95% bootstrap interval over the `HELDOUT_SEQUENCES` sequences. The
# sensitive set (`calibration_data/sensitive/`) with greedy decoding: pass rate per category with its Wilson
# interval, items *lost* (passed unquantized, failed quantized) and the share of outputs that changed. `pass_all`
# leaves long context out (only `LONG_CONTEXT_CONFIGS` run it). Beside each GPTQ/AWQ row, what its calibration
# set is made of (`calib_<domain>_share`: code, prose = Python docs, chat = chat and Spec-Bench prompts), and
# each model's relative weight error over the decoder linears (`weight_error_%`, with an interval over layers;
# none for AWQ, whose linears hold rescaled weights). The GGUF grids run once each at their own bits and blocks of
# 32. Quantization time is wall time on the device the run used (DEVICE).

# %%
res = study.run_grid(params, reference, tok)
grid = res.table
run.save_table("grid", grid)
run.save_table("sequence_scores", res.scores)
cols = ["model", "weight_MB_fp16_rest", "quant_s", "weight_error_%"] + \
    [c for c in grid.columns if c.startswith("calib_")] + [f"{d}_{m}" for d in params.DOMAINS for m in ("perplexity", "kl_mean", "top1_agreement")] + ["pass_all"]
grid[cols].round(3)

# %%
interval_cols = ["model"] + [c for c in grid.columns if c.endswith(("_low", "_high")) and not c.startswith("pass_")]
grid[interval_cols].round(3)

# %% [markdown]
# ## 2. Does GPTQ/AWQ recover RTN's loss, per domain, and is the difference distinguishable?
# Each method against RTN at the same configuration on the same sequences: perplexity as a ratio and KL as a
# difference (paired bootstrap over sequences), the recovered share 1 - (method - unquantized) / (RTN -
# unquantized) with its interval, and the sensitive pass rate minus RTN's (paired over items). `*_vs_rtn` says
# whether the interval excludes no difference. The GGUF grids at w4g32 are set against RTN w4g32 as well: on a Q4_1
# model, `gguf-q4_1` recovers all of RTN's loss, since it loses nothing. Then each model against the unquantized
# one: the perplexity rise per domain beside the sensitive categories' pass-rate change (paired over items) and
# outputs changed; the figure draws the perplexity change and KL of every model, the control at exactly 0.

# %%
recovery = stats.recovery_table(grid, res.scores, res.outputs)
run.save_table("recovery", recovery)
recovery.round(3)

# %%
sens = stats.sensitive_vs_perplexity(grid, res.scores, res.outputs)
run.save_table("sensitive_vs_perplexity", sens)
control = sens[sens["model"].str.startswith("gguf-q4_1")]
for _, r in control.iterrows():
    print(f"{r['model']} against the unquantized model: " + ", ".join(
        f"{d} perplexity {r[f'{d}_ppl_rise_%']:+.6f}%" for d in params.DOMAINS))
sens.round(1)

# %%
run.save_figure("grid", plots.plot_grid(grid, sens, params.DOMAINS))
run.save_figure("pass_rates", plots.plot_pass_rates(grid))

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
mismatch, mismatch_scores = study.run_mismatch(params, reference, tok, outputs["unquantized"],
                                              cache=res.reference_log_probs)
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
# ## 6. Where the loss comes from: the grid or fewer levels
# First the weights alone: the relative weight error of a 4-bit min-max grid with each zero-point rule (a float
# offset, as Q4_1; an integer zero point; the range widened to include 0, as RTN) at groups of 32, 64 and 128.
# Then a ladder of quantizers (`lab.quant.ladder`), each one change from the rung before: Q4_1 as llama.cpp writes
# it, a float32 scale and offset, an integer zero point, the range widened to include 0 (= RTN w4g32), groups of
# `LADDER_GROUPS`, then `LADDER_BITS` bits. Per rung: the weight error (interval over decoder layers) and the
# perplexity change against the unquantized model and against the rung before (paired over the held-out
# sequences, each from its own document). Last, each model of the grid split in two factors: the same method at 4
# bits with its group size (on an already-4-bit model, all of it a grid mismatch) and its change from there to
# fewer bits; (1 + grid)(1 + levels) = 1 + total.

# %%
variants = ladder.grid_variants(reference, params.QUANT_LAYERS or None)
run.save_table("grid_variants", variants)
variants.pivot(index="zero point", columns="group_size", values="weight_error_%").round(2)

# %%
rungs, rung_scores = ladder.run_ladder(reference, study.heldout(params, tok), params.LADDER_GROUPS,
                                       params.LADDER_BITS, params.QUANT_LAYERS or None, cache=res.reference_log_probs)
rung_scores = pd.concat([res.scores[res.scores["model"] == "unquantized"], rung_scores])
steps = ladder.ladder_table(rungs, rung_scores, params.DOMAINS)
run.save_table("ladder", steps)
run.save_table("ladder_sequence_scores", rung_scores)
run.save_figure("ladder", plots.plot_ladder(steps, params.DOMAINS))
steps.drop(columns="change").round(3)

# %%
decomp = ladder.decomposition(grid, res.scores, params.DOMAINS)
run.save_table("decomposition", decomp)
run.save_figure("decomposition", plots.plot_decomposition(decomp, params.DOMAINS))
decomp.round(2)

# %% [markdown]
# ## 7. Claims and verdicts, computed from the tables above
# The deployment article's quantization claims (seeds/003 section 2) judged from the paired intervals: holds when
# the whole interval agrees, wrong when none of it does, not distinguishable when it straddles. Every one of them
# is about quantizing a 16-bit model, so the intervals decide only where section 0 found the baseline not
# quantized; on an already-quantized model each verdict is "not checkable here", its note saying why, what would
# decide it (a 16-bit checkpoint through `MODEL`) and the verdict in this setting. What such a model can say is
# printed after the table's verdict lines: which method best preserves it when re-quantized to each grid.
# `lab claims` gathers this table into the ledger (`results/CLAIMS.md`).

# %%
claims = stats.claims_table(sens, recovery, grid, res.scores, outputs, params.CHECKPOINT_CONFIG, mismatch_ratio,
                            baseline=baseline, on_gpu=reference.embed_tokens.weight.is_cuda)
run.save_table("claims", claims)
verdicts = "\n".join(stats.verdict_lines(recovery, sens, mismatch_ratio)
                     + ["", "which method best preserves the model, per configuration:"]
                     + stats.preservation_lines(grid, sens, res.scores))
(run.dir / "verdicts.txt").write_text(verdicts + "\n")
print(verdicts)
claims

# %% [markdown]
# ## 8. Explore (INTERACTIVE)
# Pick a model and a category to read its outputs beside the unquantized model's.

# %%
if INTERACTIVE:
    import ipywidgets as widgets

    from lab.workflow.widgets import panel

    pick_model = widgets.Dropdown(options=[k for k in outputs if k != "unquantized"], description="model")
    pick_cat = widgets.Dropdown(options=sorted(outputs["unquantized"]["category"].unique()), description="category")

    def show(model, category):
        ref = outputs["unquantized"]
        merged = ref.merge(outputs[model], on=["id", "category"], suffixes=("_ref", "_quant"))
        view = merged[merged["category"] == category][["id", "passed_ref", "passed_quant", "output_ref",
                                                        "output_quant", "reason_quant"]]
        differ = int((view["output_ref"] != view["output_quant"]).sum())
        print(f"{model}, {category}: {differ} of {len(view)} outputs differ from the unquantized model's")
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
                 not_distinguishable_claims=int((claims["verdict"] == "not distinguishable").sum()),
                 not_checkable_claims=int((claims["verdict"] == "not checkable here").sum()),
                 **{f"ladder_{r['rung'].replace(' ', '_')}_weight_error_%": float(r["weight_error_%"])
                    for _, r in steps.iterrows()},
                 **{f"{m.replace(' ', '_')}_{d}_ppl_change_%": float(sens.set_index("model").loc[m, f"{d}_ppl_rise_%"])
                    for m in control["model"] for d in params.DOMAINS})

# %% [markdown]
# ## The finding
# One sentence, filled from this run's files, and its key figure, whose title is the sentence
# (`lab.studies.findings`; the README, the study doc and `lab report` print the same sentence).

# %%
from lab.studies.findings import key_figure, sentence

print(sentence(run.notebook, run.dir))
run.save_figure("finding", key_figure(run.notebook, run.dir))
run.finish()
