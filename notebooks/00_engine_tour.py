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
# # 00 · Engine tour: one batch of requests through the lab engine
#
# We follow a batch of chat requests through `lab.engine.LLM` on the real model (SmolLM2-135M-Instruct):
# tokenize, schedule (continuous batching with chunked prefill), allocate KV blocks, prefill, decode,
# and then a second batch that shares the system prompt and hits the prefix cache. Every number here is
# measured in this run; the code is in `lab/studies/engine_tour/measure.py` and `lab/engine/`.

# %% tags=["parameters"]
PRESET = "quick"  # quick (minutes), reference (committed runs), smoke (tests) or gpu (CUDA); values set below win
INTERACTIVE = False  # show the widget cells
DEVICE = "auto"  # auto (CUDA when present), cpu, cuda or cuda:N
MODEL = "smollm2-135m"
NUM_REQUESTS = 8
MAX_TOKENS = 48
BLOCK_SIZE = 16
NUM_KV_BLOCKS = 20  # small on purpose: the pool fills and the scheduler preempts
MAX_NUM_SEQS = 4
MAX_NUM_BATCHED_TOKENS = 64
TTFT_REPEATS = 5
BUDGETS = (16, 32, 64, 128, 256)  # the token-budget sweep and the widget's slider

# %%
import pandas as pd

from lab.engine import SamplingParams
from lab.workflow.run import params_from_namespace, start_run
from lab.studies.engine_tour import measure as tour

params = params_from_namespace(tour.TourParams, globals())  # validates every value before heavy work
run = start_run("00_engine_tour", params)
llm = tour.make_engine(params)
prompts = tour.chat_prompts(llm.tokenizer, params.NUM_REQUESTS)
print(run.dir)

# %% [markdown]
# ## 1. Tokenize
# The chat template wraps each question in a shared system prompt. The engine sees token ids only.

# %%
tokens = tour.token_table(llm.tokenizer, prompts[0])
print(f"{len(tokens)} tokens; the first {min(24, len(tokens))}:")
tokens.head(24)

# %% [markdown]
# ## 2. Schedule and allocate: the first steps
# Each step has a budget of `MAX_NUM_BATCHED_TOKENS` tokens and at most `MAX_NUM_SEQS` running requests.
# A prompt longer than what is left of the budget is prefilled in chunks; decodes take one token each.

# %%
for p in prompts:
    llm.add_request(p, SamplingParams(temperature=0.0, max_tokens=params.MAX_TOKENS))
for _ in range(2):
    llm.step()
    print("scheduled (request, tokens):", list(llm.view().last_step.scheduled))
tour.block_table_view(llm)

# %% [markdown]
# ## 3. Run to completion with a trace of every step

# %%
while llm.has_unfinished():
    llm.step()
llm = tour.make_engine(params, model=llm.model, tokenizer=llm.tokenizer)  # fresh pool, same weights
cold, cold_steps = tour.run_batch(llm, prompts, params.MAX_TOKENS)
run.save_table("requests_cold", cold)
run.save_table("steps_cold", cold_steps.drop(columns="scheduled"))
cold[["request", "prompt_tokens", "cached_tokens", "output_tokens", "ttft_ms", "tpot_ms", "text"]]

# %%
fig = tour.plot_kv_over_time(cold_steps, params.NUM_KV_BLOCKS, "Cold batch: KV blocks in use per step")
run.save_figure("kv_blocks_over_time", fig)

# %% [markdown]
# ## 4. Prefix cache: the same system prompt again
# Within the cold batch, later requests already reused the shared system prompt's full blocks
# (`cached_tokens` above). Now the same batch again in the same engine: whole prompts are found by
# their chained block hash; the last prompt token is always recomputed. In float32 the outputs do not change
# (the tests check hit == miss); in the serving dtype they may, as the cell after the comparison shows.

# %%
warm, warm_steps = tour.run_batch(llm, prompts, params.MAX_TOKENS)
run.save_table("requests_warm", warm)
comparison = pd.DataFrame({"cached_cold": cold["cached_tokens"], "cached_warm": warm["cached_tokens"],
                           "prompt_tokens": warm["prompt_tokens"], "same_output": cold["text"] == warm["text"]})
comparison

# %% [markdown]
# Why an output can change in bfloat16: a cached prefix changes which tokens each step computes, so the shapes of
# its matrix products and how they round; a near-tie between two tokens can flip, and greedy decoding then
# follows another path. The same batch twice in a fresh engine of each dtype, `first_difference` being the
# first output position that differs:

# %%
dtypes = list(dict.fromkeys([str(llm.model.embed_tokens.weight.dtype).removeprefix("torch."), "float32"]))
batch_invariance = pd.concat([tour.cached_rerun_outputs(params, llm.tokenizer, prompts, d) for d in dtypes])
run.save_table("hit_vs_miss_by_dtype", batch_invariance)
batch_invariance

# %% [markdown]
# TTFT of one request alone (no queueing in the number), on a fresh engine and then as a hit.

# %%
hit_vs_miss = tour.ttft_hit_vs_miss(llm.model, llm.tokenizer, prompts[0], params, repeats=params.TTFT_REPEATS)
run.save_table("ttft_hit_vs_miss", hit_vs_miss)
ttft = hit_vs_miss.groupby("case")["ttft_ms"].median()
ttft

# %%
stats = llm.stats()
metrics = run.save_metrics(
    requests=len(prompts), steps_cold=len(cold_steps), peak_kv_blocks_cold=int(cold_steps["kv_blocks_used"].max()),
    preemptions_cold=int(cold_steps["preempted"].sum()), mean_tpot_ms=float(cold["tpot_ms"].mean()),
    ttft_ms_alone_miss=float(ttft["miss"]), ttft_ms_alone_hit=float(ttft["hit"]),
    prefix_cache_hit_rate=stats["prefix_cache_hit_rate"],
    outputs_identical_hit_vs_miss=bool(comparison["same_output"].all()),
    outputs_identical_hit_vs_miss_float32=bool(batch_invariance.query("dtype == 'float32'")["same_output"].all()))
metrics

# %% [markdown]
# ## 5. Sweep the per-step token budget (widget when `INTERACTIVE`)
# A larger budget prefills more per step (fewer steps, earlier first tokens for queued requests) at
# the cost of longer steps for the requests already decoding. The sweep is a plain library loop, so a
# papermill rerun prints the same table the slider shows.

# %%
budgets = list(params.BUDGETS)
factory = lambda **kw: tour.make_engine(params, model=llm.model, tokenizer=llm.tokenizer, **kw)  # noqa: E731
sweep = tour.budget_sweep(factory, prompts, params.MAX_TOKENS, budgets)
run.save_table("budget_sweep", sweep)
sweep

# %%
if INTERACTIVE:
    import ipywidgets as w

    from lab.workflow.widgets import panel

    def show(budget):
        _, steps = tour.run_batch(factory(max_num_batched_tokens=budget), prompts, params.MAX_TOKENS)
        tour.plot_kv_over_time(steps, params.NUM_KV_BLOCKS, f"max_num_batched_tokens = {budget}")

    budget = w.SelectionSlider(options=budgets, value=budgets[-1], continuous_update=False)
    display(panel(show, {"budget": budget}, "KV blocks over time at a token budget"))  # noqa: F821

# %% [markdown]
# ## The finding
# One sentence, filled from this run's files, and its key figure, whose title is the sentence
# (`lab.studies.findings`; the README, the study doc and `lab report` print the same sentence).

# %%
from lab.studies.findings import key_figure, sentence

print(sentence(run.notebook, run.dir))
run.save_figure("finding", key_figure(run.notebook, run.dir))
run.finish()
