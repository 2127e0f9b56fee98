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
# # 04 · Replay: recompute a window's KV, or move it?
#
# The replay article (seeds/000) argues, by a roofline argument, that on long contexts recomputing the KV of a
# recent window of W tokens is cheaper than reading the KV cache, and gives a controller (W of 16-64, triggers
# on memory headroom < 20%, bandwidth > 80%, position past 70% of the context, chunked recomputation, no
# write-back) and a self-diagnosis rule. Related work asks the same question honestly: vLLM preempts by
# recompute rather than swapping, Cake (Jin et al., 2024, arXiv:2410.03065) computes from the front while
# loading from the back, HCache (Gao et al., 2024, arXiv:2410.05004) restores KV from stored hidden states.
# This notebook runs the article's controller in the lab engine (lossless: tested), then answers **when is
# recomputing KV cheaper than moving it, for which model, link and context length**, by a cost model
# (`lab.replay.cost`) checked against measurements on this machine (`lab.replay.measure`). The logic lives in
# `lab.studies.replay_break_even`.

# %% tags=["parameters"]
PRESET = "quick"  # quick (minutes), reference (committed runs), smoke (tests) or gpu (CUDA); values set below win
INTERACTIVE = False  # show the widget cells
DEVICE = "auto"  # auto (CUDA when present), cpu, cuda or cuda:N: where every model runs
MODEL = "smollm2-135m"  # section 1's model (is replay lossless, in float32) and the first timed in section 4
LOSSLESS_TOKENS = 32
MORE_MODELS = ("random:smollm2-360m",)  # timed beside MODEL on the engine, in DTYPE: another scale
PREFIXES = (1024, 2048, 4096, 7680)  # M: cached tokens before the window (SmolLM2's limit is 8192)
WINDOWS = (16, 32, 64, 128, 256, 512)  # W
REPEATS = 3
HARDWARE = "h100-sxm"  # the accelerator of the break-even and PD tables
EFFICIENCY = 0.5  # the article's compute efficiency
PD_WINDOW = 64
PD_PREFIX = 32768
DTYPE = "auto"  # of the timed models (section 4): the serving dtype on DEVICE, or "float32"
PROBE_SECONDS = 6.0  # this machine's ceilings in DTYPE on DEVICE, per timed model

# %%
import pandas as pd

from lab.engine import LLM, SamplingParams
from lab.machine.hardware import GPUS
from lab.models import load_model
from lab.replay import ReplayConfig
from lab.workflow.run import params_from_namespace, start_run
from lab.studies import replay_break_even as study

params = params_from_namespace(study.ReplayParams, globals())  # validates every value before heavy work
run = start_run("04_replay_break_even", params)
hw = GPUS[params.HARDWARE]

# %% [markdown]
# ## 1. The controller in the engine: lossless
# The article's controller drops the last W tokens' KV before a decode step and the engine recomputes them from
# their token ids (a rewind: the scheduler's one rule gives the sequence W + 1 tokens, a chunk over its cached
# prefix). Greedy outputs must equal the run without replay, whatever the window and triggers. This check runs
# in float32: its subject is exact equality, which bfloat16's rounding of a recomputed K/V could blur; the
# timings of section 4 run in DTYPE, the serving dtype.

# %%
model, tok = load_model(params.MODEL, dtype="float32", device=params.device)
prompts = ([tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False)
            for q in ("Explain how a bicycle stays upright.", "List three uses of copper.")] if tok else
           [list(range(1, 40)), list(range(7, 60))])
sampling = SamplingParams(max_tokens=params.LOSSLESS_TOKENS, temperature=0, ignore_eos=True)
want = [o.token_ids for o in LLM(model, tokenizer=tok, num_kv_blocks=64, max_model_len=256).generate(prompts, sampling)]
rows = []
for config in (ReplayConfig(window=16, always=True, min_position=0.0),
               ReplayConfig(window=32, chunk=8, always=True, min_position=0.0, write_back=True),
               ReplayConfig(window=32, memory_headroom=0.99, min_position=0.7)):
    llm = LLM(model, tokenizer=tok, num_kv_blocks=64, max_model_len=256, replay=config)
    got = [o.token_ids for o in llm.generate(prompts, sampling)]
    rows.append({"window": config.window, "chunk": config.chunk, "write_back": config.write_back,
                 "trigger": "every step" if config.always else "memory headroom < 99%, past 70%",
                 "replays": llm.stats()["replays"], "recomputed tokens": llm.stats()["replayed_tokens"],
                 "greedy outputs unchanged": got == want})
lossless = pd.DataFrame(rows)
run.save_table("lossless", lossless)
lossless

# %% [markdown]
# ## 2. The cost model
# Recomputing W tokens after an M-token prefix from token ids runs every layer: 2 x (non-embedding parameters)
# x W for the linears, 2 L H (d_qk + d_v) W (M + W/2) for the attention, and that attention reads the whole
# prefix's KV. Moving the window costs its KV bytes. The crossover link bandwidth is
# B* = achieved FLOP/s x KV bytes / FLOPs: a link slower than B* loses to recomputing. HCache's stored hidden
# states are larger than the KV for GQA and MLA models (`hidden_MB` vs `kv_MB`), smaller only for MHA.

# %%
costs = study.cost_table(params.PD_WINDOW, params.PD_PREFIX, hw, params.EFFICIENCY)
run.save_table("cost_model", costs)
costs.round(3)

# %% [markdown]
# ## 3. Break-even per model and link
# Window W = PD_WINDOW after PD_PREFIX tokens, recomputed on the accelerator at EFFICIENCY x its peak, or
# loaded over each link (device memory included).

# %%
table = study.break_even(params)
run.save_table("break_even", table.reset_index())
table

# %% [markdown]
# ## 4. Measured on this machine: recompute on the engine against loading from each tier
# For each model, prefix M and window W: the engine's forward of the W tokens over the cached M-token prefix on
# DEVICE in DTYPE, against reading the window's KV from host memory and from a file on disk (page cache
# dropped), and on a GPU from its memory and over PCIe from host memory. HCache's restore (the K/V projections
# alone, from the layer inputs the engine kept) is timed beside them, on a family whose keys are the K projection
# and a full RoPE only (Qwen3's k_norm, Phi-3's partial RoPE: not timed, and `hcache_not_measured` says why).
#
# Three predictions of the recompute time. The article's compute-only rule (FLOPs at EFFICIENCY x the probed
# peak); the roofline with this machine's probed ceilings (`lab.machine.hardware.model_ceilings`: a GEMV's read rate, a
# square matmul's FLOP/s), plus a per-forward overhead measured once; and the engine's cost model
# (`lab.replay.engine_cost`), the sum of what the step does, each term's ceiling measured by its own
# microbenchmark in this run (`lab.replay.microbench`), none fitted to the times it predicts:
#
# t(M, W) = fixed + forward(W) + L x gather(M + W) + L x attention(W, M + W)
#
# - fixed: a step's metadata and per-layer calls (the engine's step of two tokens after one block, less the rest);
# - forward(W): the model's forward over W tokens with attention left out (its linears at its own shapes);
# - gather: the paged store's copy of the blocks holding the M + W positions' K and V, per layer (bytes over the
#   gather rate measured on the largest prefix, caches flushed);
# - attention: W queries over M + W keys, every score computed (4 H d W (M + W) FLOPs over the FLOP/s
#   `causal_attention` reaches at W queries over a reference context).

# %%
print(f"timed in {params.torch_dtype} on {params.device}")
measured = study.measure(params)
run.save_table("measured", measured)
run.save_figure("crossover", study.plot_crossover(measured))
run.save_figure("predicted_vs_measured", study.plot_predicted(measured))
study.terms_table(measured).round(6)

# %%
summary = study.summarize(measured)
run.save_table("measured_summary", summary)
summary.T

# %% [markdown]
# `model_within_20pct` counts the points the cost model predicts within 20%; `terms_table` shows, per point, each
# term, the largest, and where the sum misses by more than 20% what it leaves unexplained. The break-even
# verdicts, measured and from the cost model, stand side by side in `measured.csv` (`measured: recompute beats
# <tier>`, `model: recompute beats <tier>`) and are counted in the summary (`recompute_beats_*`,
# `model_recompute_beats_*`, `verdict_agrees_*`); the roofline's are kept as `roofline_verdict_agrees_*`.
#
# ## 5. The PD-disaggregation scenario
# A decode node either receives the last PD_WINDOW tokens' KV over a link or recomputes them locally
# (bounded by compute at EFFICIENCY, and by reading the weights and the PD_PREFIX-token prefix's KV).

# %%
pd_table = study.pd_scenario(params)
run.save_table("pd_scenario", pd_table)
pd_table.round(3)

# %% [markdown]
# ## 6. The article's numbers, recomputed
# One row per claim (`lab.claims.table.claim_row`): the claim led by its section, the article's figure, the lab's, and
# the verdict the ledger's rules give it (`lab.claims.rules.verdict`: holds, wrong or wrong by rounding), with by
# how much or why in the note; "replaying spares reading the prefix" has no number to decide it and is wrong by
# argument, the argument in its note.

# %%
claims = study.claims_table(params, measured)
run.save_table("claims", claims)
with pd.option_context("display.max_colwidth", 120):
    display(claims)  # noqa: F821

# %% [markdown]
# ## 7. Explore (INTERACTIVE)
# The break-even window and prefix for another model and accelerator.

# %%
if INTERACTIVE:
    import ipywidgets as widgets

    from lab.workflow.widgets import panel

    def show(model, hardware, window, prefix):
        display(study.cost_table(window, prefix, GPUS[hardware], params.EFFICIENCY)  # noqa: F821
                .query("model == @model").T)

    display(panel(show, {"model": widgets.Dropdown(options=study.COST_MODELS),  # noqa: F821
                         "hardware": widgets.Dropdown(options=sorted(GPUS)),
                         "window": widgets.IntSlider(value=64, min=16, max=512, step=16),
                         "prefix": widgets.IntSlider(value=32768, min=1024, max=131072, step=1024)},
                  "cost model"))

# %%
run.save_metrics(lossless=bool(lossless["greedy outputs unchanged"].all()),
                 model_points_within_20pct=int(summary["model_within_20pct"].sum()),
                 roofline_points_within_20pct=int(summary["roofline_within_20pct"].sum()),
                 measured_points=int(summary["points"].sum()),
                 verdicts_agree=int(summary["verdict_agrees_host memory"].sum() + summary["verdict_agrees_disk file"].sum()),
                 recompute_beats_host_memory=int(summary["recompute_beats_host memory"].sum()),
                 recompute_beats_disk=int(summary["recompute_beats_disk file"].sum()),
                 wrong_claims=int((claims["verdict"] == "wrong").sum()))

# %% [markdown]
# ## The finding
# One sentence, filled from this run's files, and its key figure, whose title is the sentence
# (`lab.studies.findings`; the README, the study doc and `lab report` print the same sentence).

# %%
from lab.studies.findings import key_figure, sentence

print(sentence(run.notebook, run.dir))
run.save_figure("finding", key_figure(run.notebook, run.dir))
run.finish()
