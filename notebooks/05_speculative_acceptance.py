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
# # 05 · Speculative decoding: acceptance by task, and what it buys
#
# The deployment article (seeds/003, section 5) says a round of k drafts emits (1 - a^(k+1)) / (1 - a) tokens
# for a cost of 1 + k c target steps, that "acceptance decides everything", that a depends on the task (code
# completion, rewriting, translation and summarization above 0.7; open-ended writing often below 0.5), and
# recommends switching speculation per task below an acceptance threshold (0.55 in its configuration). This
# notebook measures it on the lab engine with SmolLM2-135M-Instruct at batch 1 (Spec-Bench's setting, Xia et
# al. 2024): for three drafters (n-gram prompt lookup, the target's first layers, a 4-bit copy of the target),
# per task category, the conditional acceptance a, Spec-Bench's mean accepted tokens per step, vLLM's
# accepted/drafted (which is not a), the draft cost ratio c, and the predicted against the measured speedup.
# The target runs in the serving dtype (DTYPE, bfloat16 here), as a deployment would. Speculative greedy decoding
# is lossless in float32 (tested token for token in `tests/test_spec_engine.py`, and the sampling case by a
# chi-square test); in bfloat16 a (k + 1)-row verification forward rounds differently from a one-row step, so a
# near-tie between two tokens can flip and the greedy paths part from there. `identical_outputs` (share of
# requests) and `agreeing_tokens` (mean share of each output before it parts) measure how much. The logic lives
# in `lab.studies.spec_acceptance`. The embedded target is itself a dequantized Q4_1 GGUF (notebook 02), so its 4-bit
# copy re-rounds a 4-bit model onto another grid: its acceptance is not what a 4-bit copy of a 16-bit target keeps.
#
# The `gpu` preset runs where a CPU cannot: a Llama-3-8B-shaped target with random weights, in bfloat16 on a GPU,
# where a decode step reads 16 GB of weights and a (k + 1)-token verification should cost what one step costs.
# Random weights say nothing about acceptance by task; that run tests the cost side of the model (c, v(k), the
# predicted against the measured speedup) beside the roofline of the device it ran on.

# %% tags=["parameters"]
PRESET = "quick"  # quick (minutes), reference (committed runs), smoke (tests) or gpu (CUDA); values set below win
INTERACTIVE = False  # show the widget cells
DEVICE = "auto"  # auto (CUDA when present, else the CPU), cpu, cuda or cuda:N; gpu preset needs CUDA
MODEL = "smollm2-135m"  # the target; or random weights of a preset shape, e.g. random:llama-3-8b
DATA = ""  # "": the lab's prompt set (calibration_data/spec_prompts.jsonl); or a JSONL path (Spec-Bench's format too)
PER_CATEGORY = 5  # prompts a category in the main run
MAX_TOKENS = 64  # new tokens a request (greedy, EOS ignored: every run decodes the same count)
DRAFTERS = ("ngram", "layerskip", "quantized")
K = 4  # drafts per round (the article's draft_len)
K_SWEEP = (1, 2, 4, 8)
SWEEP_DRAFTERS = ("ngram", "quantized")
SWEEP_PER_CATEGORY = 2
DRAFT_LAYERS = 0  # layerskip: the first N of the target's layers; 0: a third of them (SmolLM2: 10 of 30)
DRAFT_QUANT = "rtn"  # quantized copy: rtn, gptq or awq (lab.quant)
DRAFT_BITS = 4
THRESHOLD = 0.55  # the article's acceptance_threshold
SPEC_BENCH_PER_CATEGORY = 10  # Spec-Bench questions a category, when ../shared/data/spec_bench is present (0: skip)
SPEC_BENCH_DRAFTERS = ("ngram", "quantized")
REPEATS = 5  # timing repeats of the step-cost forwards
DTYPE = "auto"  # the target dtype: "auto" is the serving dtype (bfloat16 here and on a GPU), or "float32"

# %% [markdown]
# **On your own model.** `MODEL` takes a local Hugging Face directory (config.json, safetensors, tokenizer files) of
# a supported architecture (docs/engine.md), read for its config before any weight loads:
# `lab run 05_speculative_acceptance --preset reference --model /path/to/checkpoint` (the layer-skip drafter takes
# a third of the target's layers unless `-p DRAFT_LAYERS` says otherwise; add `-p DEVICE cuda` on a GPU, or take
# `--preset gpu --model /path/to/checkpoint`; docs/your_model.md runs every notebook so). What changes: the prompts are rendered by the model's own chat
# template (a directory without a tokenizer borrows SmolLM2's, whose ids must fit its vocabulary); acceptance by
# task is then the question asked of a trained target, and in the serving dtype (bfloat16) its losslessness is
# measured as above. The 4-bit drafter quantizes the target's decoder linears (`lab.quant`: dense families only).
# What takes longer: every target step reads all the weights, so decode time grows with the parameter count (a
# batch-1 step is memory-bound); the step-cost section times forwards at each k, and `REPEATS` of them.

# %%
import pandas as pd

from lab.machine.hardware import probe_inference
from lab.workflow.run import params_from_namespace, start_run
from lab.studies import spec_acceptance as study
from lab.studies.spec_acceptance import plots

params = params_from_namespace(study.SpecParams, globals())  # validates every value before heavy work
run = start_run("05_speculative_acceptance", params)
prompts = study.task_prompts(params)
model, tok = study.load_target(params)
weights = model.embed_tokens.weight
print(f"{params.MODEL} on {weights.device} in {weights.dtype}")
drafts = study.draft_models(params, model, tok)
pd.DataFrame([{"category": c, "prompts": sum(p.category == c for p in prompts)}
              for c in dict.fromkeys(p.category for p in prompts)])

# %% [markdown]
# ## 1. The costs: c and the verification step
# The article's model charges one target step for verifying k drafts. The engine's verification is a
# (k+1)-token forward over the cached prefix whose LM head runs on k + 1 rows; `lab.speculative.measure` times it
# (v(k) in plain steps) beside one draft forward (c). The n-gram drafter runs no model: its c is its lookup
# time. Beside them, the roofline's floor under a target step and under v(k) on this device's ceilings, measured
# in the dtype and on the device the target ran (`lab.machine.hardware.probe_inference`, the weight read of a GEMV the
# shape of the target's LM head): a v(k) floor of 1.0 says verification is memory-bound, as the article assumes.

# %%
main, requests, costs = study.study(params, model, tok, prompts, params.DRAFTERS, params.K, drafts)
lm_head_shape = (model.config.vocab_size, model.config.hidden_size)
machine = probe_inference(weights.dtype, str(weights.device), gemv_shape=lm_head_shape, seconds_budget=2.0)
print(f"{machine.name}: {machine.mem_bandwidth / 1e9:.0f} GB/s weight read, "
      f"{machine.peak_flops / 1e12:.2f} TFLOP/s ({weights.dtype})")
cost_rows = pd.DataFrame([{"drafter": d, "context": c.context, "target step ms": 1e3 * c.target_step_s,
                           "draft step ms": None if c.draft_step_s is None else 1e3 * c.draft_step_s,
                           "c_forward": c.c, **{f"v({k}) forward only": c.verify_s[k] / c.target_step_s
                                                for k in sorted(c.verify_s)},
                           **study.roofline_costs(model, c.context, sorted(c.verify_s), machine)}
                          for d, c in costs.items()])
run.save_table("step_costs", cost_rows)
cost_rows.round(3)

# %% [markdown]
# ## 2. Per drafter and category: a, accepted tokens, c, predicted and measured speedup
# `predicted_article` is E(a, d) / (d c + 1) over the run's rounds; `predicted_measured_costs` replaces the 1
# with the measured verification (its forward plus the engine's per-step work); `predicted_by_position` also
# replaces the single a with the measured acceptance at each draft position. `measured_speedup` is the plain
# run's decode time over the speculative run's for the same prompts, in the same process.
#
# Every measured figure has a 95% interval over the category's prompts (`_low`, `_high`: a percentile bootstrap
# that resamples prompts and recomputes the pooled ratio of sums; the speedup is paired, the same prompts for
# both runs). `speedup_vs_plain` says whether the speedup's interval excludes 1; `error_measured_costs_vs_10pct`
# whether the measured speedup is within 10% of the prediction ("not distinguishable" where its interval
# straddles the 10% line). With few prompts a category (the quick preset has 2) the intervals are wide.

# %%
run.save_table("by_category", main)
run.save_table("requests", requests.drop(columns=["output"]))
main[["drafter", "category", "lossless", "identical_outputs", "agreeing_tokens", "a", "a_low", "a_high",
      "accepted/drafted (vLLM)", "mean_accepted_tokens_per_step", "mean_accepted_tokens_per_step_low",
      "mean_accepted_tokens_per_step_high", "c_effective", "c_effective_low", "c_effective_high", "v(k)",
      "predicted_article", "predicted_measured_costs", "predicted_by_position", "measured_speedup",
      "measured_speedup_low", "measured_speedup_high", "speedup_vs_plain", "error_measured_costs",
      "error_measured_costs_vs_10pct"]].round(3)

# %% [markdown]
# Drafter against drafter on the same prompts (over all categories): the difference in a and the ratio of the
# speedups, each with its paired 95% interval and whether it excludes no difference.

# %%
versus = study.drafter_comparison(requests)
run.save_table("drafter_comparison", versus)
versus.round(3)

# %% [markdown]
# The error bars are the 95% intervals over prompts.

# %%
run.save_figure("acceptance_by_position", plots.plot_acceptance_by_position(main))
run.save_figure("predicted_vs_measured", plots.plot_predicted_vs_measured(main))

# %% [markdown]
# ## 3. Which k? Speedup against the number of drafts
# Fewer prompts a category (SWEEP_PER_CATEGORY), every k of K_SWEEP. The best k per category, measured,
# against the k the model picks from the main run's a and c (with the article's v = 1, and with the verification
# cost measured in the sweep).

# %%
sweep = study.k_sweep(params, model, tok, drafts)
run.save_table("k_sweep", sweep)
run.save_figure("speedup_vs_k", plots.plot_speedup_vs_k(sweep))
best = study.best_k_table(sweep, main, max(params.K_SWEEP))
run.save_table("best_k", best)
best.round(3)

# %% [markdown]
# ## 4. The acceptance-threshold policy
# Per category (the article's switch): speculate where the measured a reaches THRESHOLD, plain decoding
# elsewhere; "switch right" says whether that matched the measured speedup, and `speedup_vs_plain` whether
# that speedup is distinguishable from 1 at all (where it is not, neither choice is shown wrong). Per request
# (the engine's adaptive switch, `SpeculativeConfig(min_acceptance=...)`): a request whose a over its last 4
# rounds falls below the threshold decodes plainly for 16 tokens, then probes again, pausing twice as long after
# each failed probe; shown on the drafter with the lowest a.

# %%
policy = study.policy_table(main, params.THRESHOLD)
run.save_table("policy_by_category", policy)
lowest = main[main["category"] == "all"].sort_values("a")["drafter"].iloc[0]
plain_rows = requests[requests["drafter"] == "plain"].reset_index(drop=True)
adaptive = study.adaptive_policy(params, model, tok, prompts, lowest, drafts, plain_rows)
run.save_table("policy_adaptive", adaptive)
pd.concat([main[(main["drafter"] == lowest)], adaptive])[["drafter", "category", "a", "rounds", "plain_steps",
                                                          "measured_speedup", "measured_speedup_low",
                                                          "measured_speedup_high", "speedup_vs_plain"]].round(3)

# %%
policy.round(3)

# %% [markdown]
# ## 5. Spec-Bench's categories
# The first SPEC_BENCH_PER_CATEGORY questions of each Spec-Bench category (multi-turn conversation is MT-bench's
# first turn), when `../shared/data/spec_bench/question.jsonl` is present. Its translation and summarization
# categories are two of the article's tasks: with 20 prompts each (the reference), the acceptance-by-task claim
# reads them there rather than from the lab's set of 5 prompts a category.

# %%
if study.spec_bench_available(params):
    bench, _, _ = study.spec_bench(params, model, tok, drafts)
    run.save_table("spec_bench", bench)
    display(bench[["drafter", "category", "lossless", "a", "a_low", "a_high",  # noqa: F821
                   "mean_accepted_tokens_per_step", "c_effective", "predicted_measured_costs", "measured_speedup",
                   "measured_speedup_low", "measured_speedup_high", "speedup_vs_plain"]].round(3))
else:
    bench = None
    print("Spec-Bench's question.jsonl is not at ../shared/data/spec_bench/: section skipped")

# %% [markdown]
# ## 6. The article's numbers, recomputed or measured
# A measured figure is printed as "value [low, high]" (95% over prompts). A claim holds when the whole interval
# satisfies it, is wrong when the whole interval refutes it, and is "not distinguishable" when the interval
# holds values of both kinds (the ledger's rules, `lab.claims.rules`).

# %%
claims = study.claims_table(main, costs, params, model, bench)
run.save_table("claims", claims)
with pd.option_context("display.max_colwidth", 140):
    display(claims)  # noqa: F821

# %% [markdown]
# ## 7. Explore (INTERACTIVE)
# The article's model: speedup against a for several k, at a chosen c and verification cost.

# %%
if INTERACTIVE:
    import ipywidgets as widgets
    import matplotlib.pyplot as plt

    from lab.speculative import predicted_speedup
    from lab.workflow.widgets import panel

    def show(c, verify_cost):
        a = [i / 100 for i in range(0, 100)]
        fig, ax = plt.subplots(figsize=(5, 3.4))
        for k in (1, 2, 4, 8):
            ax.plot(a, [predicted_speedup(x, k, c, verify_cost) for x in a], label=f"k={k}")
        ax.axhline(1, color="grey", lw=0.8)
        ax.set(xlabel="a", ylabel="predicted speedup")
        ax.legend()
        plt.show()

    display(panel(show, {"c": widgets.FloatSlider(value=0.05, min=0, max=1.2, step=0.01),  # noqa: F821
                         "verify_cost": widgets.FloatSlider(value=1.0, min=1.0, max=3.0, step=0.05)},
                  "predicted speedup"))

# %%
overall = main[main["category"] == "all"].set_index("drafter")
run.save_metrics(lossless=bool(main["lossless"].all() and (bench is None or bench["lossless"].all())),
                 identical_outputs=float(main.loc[main["category"] == "all", "identical_outputs"].mean()),
                 agreeing_tokens=float(main.loc[main["category"] == "all", "agreeing_tokens"].mean()),
                 **{f"a_{d}": float(overall.loc[d, "a"]) for d in overall.index},
                 **{f"a_{d}_{end}": float(overall.loc[d, f"a_{end}"]) for d in overall.index
                    for end in ("low", "high")},
                 **{f"speedup_{d}": float(overall.loc[d, "measured_speedup"]) for d in overall.index},
                 **{f"speedup_{d}_{end}": float(overall.loc[d, f"measured_speedup_{end}"]) for d in overall.index
                    for end in ("low", "high")},
                 speedups_distinguishable_from_1=int((main["category"].ne("all") &
                                                      main["speedup_vs_plain"].eq("distinguishable")).sum()),
                 categories_within_10pct=int((main["category"].ne("all") &
                                              main["error_measured_costs"].abs().le(0.10)).sum()),
                 categories=int(main["category"].ne("all").sum()),
                 article_within_10pct=int((main["category"].ne("all") & main["error_article"].abs().le(0.10)).sum()),
                 categories_not_distinguishable_from_10pct=int((main["category"].ne("all") & main[
                     "error_measured_costs_vs_10pct"].eq("not distinguishable")).sum()),
                 claims_that_fail=int(claims["holds"].eq(False).sum()))

# %% [markdown]
# ## The finding
# One sentence, filled from this run's files, and its key figure, whose title is the sentence
# (`lab.studies.findings`; the README, the study doc and `lab report` print the same sentence).

# %%
from lab.studies.findings import key_figure, sentence

print(sentence(run.notebook, run.dir))
run.save_figure("finding", key_figure(run.notebook, run.dir))
run.finish()
