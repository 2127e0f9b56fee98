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
# # 01 · Memory accounting and the roofline
#
# Every inference argument opens with two accounts: bytes (weights + KV cache + activations: does it fit,
# how many requests) and time (is a step bound by compute or by memory bandwidth). This notebook is that
# calculator (`lab.memory`, `lab.machine.roofline`, `lab.machine.hardware`), checked against the lab engine's real
# allocations and its measured step times, and used to recompute the source articles' numbers.

# %% tags=["parameters"]
PRESET = "quick"  # quick (minutes), reference (committed runs), smoke (tests) or gpu (CUDA); values set below win
INTERACTIVE = False  # show the widget cells
DEVICE = "auto"  # auto (CUDA when present), cpu, cuda or cuda:N: where the engine check runs
MODEL = "llama-3-8b"  # the model accounted: a preset (see the first table) or a model to run (a checkpoint, ...)
WEIGHTS = "int4-g128"  # fp32, bf16, fp8, int8, int4-g128[-asym], int3-g64, gguf-q4_0, ...
KV_DTYPE = "bf16"  # bf16, fp8, int8, int4, int2
SEQ_LEN = 8192
CONCURRENCY = 16
GPU = "h100-sxm"
BLOCK_SIZE = 16
LENGTH_P50 = 600  # request length distribution for the paging-waste study (log-normal fit)
LENGTH_P90 = 2000
LENGTH_P99 = 6000
ENGINE_MODEL = ""  # the engine check's model; "": MODEL where it is a model to run, else smollm2-135m
ENGINE_DTYPE = "float32"  # its dtype: float32, bfloat16, or auto for the serving dtype on DEVICE
ENGINE_BATCHES = (1, 4, 16, 32)  # batch sizes timed on the engine for the roofline check
ENGINE_CONTEXT = 128  # tokens of context of every timed sequence
PROBE_SECONDS = 4.0  # this machine's bandwidth and FLOP/s probe
DECODE_STEPS = 8
INT4_MODEL = ""  # section 7's model (on the CPU); "": ENGINE_MODEL
INT4_BATCHES = (1, 32)  # section 7
INT4_CONTEXT = 128
INT4_STEPS = 16
INT4_ROUNDS = 3  # interleaved runs of every build; the verdict rests on their spread

# %%
import pandas as pd

from lab import memory as mem
from lab.machine import roofline
from lab.machine.hardware import get_gpu, model_ceilings
from lab.workflow.run import params_from_namespace, start_run
from lab.studies.memory_accounting import measure as study

params = params_from_namespace(study.MemoryParams, globals())  # validates every value before heavy work
run = start_run("01_memory_accounting", params)
contexts = [2**k for k in range(9, 18)]

# %% [markdown]
# ## 1. Parameters from shapes
# Counted from each preset's config (explicit head_dim, GQA, tied embeddings, MoE, MLA) and compared
# with the published totals.

# %%
table = study.parameter_table(also=(params.MODEL,))
run.save_table("parameters", table)
table.round(3)

# %% [markdown]
# ## 2. The account for one model

# %%
report = mem.memory_report(params.MODEL, params.WEIGHTS, params.KV_DTYPE, params.SEQ_LEN, params.CONCURRENCY,
                           params.GPU, params.BLOCK_SIZE)
print(mem.format_report(report))
by_context = study.memory_vs_context(params, contexts)
run.save_table("memory_vs_context", by_context)
run.save_figure("memory_vs_context", study.plot_memory_vs_context(by_context, params))

# %% [markdown]
# ## 3. How many requests fit: concurrency against context, per KV dtype
# vLLM's rule: KV blocks = (memory x 0.9 - weights - activation peak) / block bytes; a sequence of
# `max_model_len` tokens needs ceil(max_model_len / block_size) of them. Operate at 80% of that.

# %%
conc = study.concurrency_vs_context(params, contexts)
run.save_table("concurrency_vs_context", conc)
run.save_figure("concurrency_vs_context", study.plot_concurrency(conc, params))
conc.pivot(index="context", columns="kv_dtype", values="max_concurrency").round(1)

# %% [markdown]
# ## 4. Paging waste
# With blocks, a sequence wastes at most its last block's tail; preallocating `SEQ_LEN` per request
# wastes the rest of the context. Lengths follow a log-normal fitted to the given P50/P90/P99.

# %%
paging = study.paging_table(params)
run.save_table("paging_waste", paging)
run.save_figure("paging_waste", study.plot_paging(paging, params))
paging.round(3)

# %% [markdown]
# ## 5. The roofline: prefill is compute-bound, decode bandwidth-bound until the batch is large

# %%
gpu = get_gpu(params.GPU)
shape = mem.ModelShape.load(params.MODEL)
cost = study.model_cost(shape, params.WEIGHTS, params.KV_DTYPE)
fig = roofline.plot_roofline(gpu, study.roofline_points(gpu, cost, params.SEQ_LEN))
run.save_figure("roofline", fig)
decode = roofline.decode_table(gpu, cost, params.SEQ_LEN)
print(f"ridge point {roofline.ridge_point(gpu):.0f} FLOP/byte; decode turns compute-bound at batch "
      f"{roofline.crossover_batch(gpu, cost, params.SEQ_LEN):.0f} (context {params.SEQ_LEN})")
pd.DataFrame(decode)[["batch", "tpot_s", "tokens_per_s", "intensity", "bound", "fits_in_memory"]]

# %% [markdown]
# ## 6. Checked against the lab engine
# The account must match what the engine really allocates, and the roofline's decode bound, with this
# machine's measured ceilings, must sit below the engine's measured step time (how far below is the
# engine's efficiency). `ENGINE_MODEL` runs on `DEVICE` in `ENGINE_DTYPE`; the byte costs and the probed
# ceilings are taken from the model that ran (its dtype, its device), never from a constant.

# %%
from lab.engine import LLM

model, tok = study.load_engine_model(params)
print(f"{params.ENGINE_MODEL}: {model.embed_tokens.weight.dtype} on {model.embed_tokens.weight.device}")
alloc = study.engine_allocation_check(LLM(model, tokenizer=tok, num_kv_blocks=64, max_model_len=512))
run.save_table("engine_allocations", alloc)
alloc

# %%
here = model_ceilings(model, params.PROBE_SECONDS)
print(here)
measured = study.measure_engine_decode(model, tok, params.ENGINE_BATCHES, params.ENGINE_CONTEXT,
                                       params.DECODE_STEPS)
check = study.predicted_vs_measured(measured, here, study.engine_cost(model))
run.save_table("roofline_vs_engine", check)
check.round(2)

# %% [markdown]
# ## 7. "INT4 decode is 2-2.5x faster than FP16", measured (seeds/003 §2.1)
# The same model decodes on the engine in float32, in bfloat16 (the 16-bit serving dtype here; a CPU has no fast
# float16 matmul) and with 4-bit weights packed for torch's int4 kernel (`lab.quant.packed`), at batch 1 and
# 32. This machine's speed drifts between runs minutes apart, more than one run's steps vary, so each speedup is
# the median over `INT4_ROUNDS` interleaved runs of each run's ratio of median step times, with the span of the
# runs as its interval (the verdict rests on it); one run's bootstrap interval over its steps is shown beside it.
# Beside them, what a purely bandwidth-bound step would give (the ratio of bytes read). The logic is in
# `lab.studies.memory_accounting.int4_decode`.

# %%
from lab.studies.memory_accounting import int4_decode

int4_measured, int4_table, int4_claims = int4_decode.run(
    params.INT4_MODEL, batches=params.INT4_BATCHES, context=params.INT4_CONTEXT, steps=params.INT4_STEPS,
    rounds=params.INT4_ROUNDS)
run.save_table("int4_decode", int4_measured.drop(columns="times"))
run.save_table("int4_speedup", int4_table)
run.save_figure("int4_decode", int4_decode.plot(int4_table))
int4_table.round(2)

# %% [markdown]
# ## 8. The articles' numbers, recomputed
# One row per claim (`lab.claims.table.claim_row`): the claim led by its seed and section, the article's figure, the
# lab's, and the verdict the ledger's rules give it (`lab.claims.rules.verdict`: holds, wrong, wrong by rounding or
# not distinguishable), with by how much or why in the note.

# %%
claims = pd.concat([study.claims_table(params), int4_claims], ignore_index=True)
run.save_table("claims", claims)
claims

# %%
run.save_metrics(
    model=params.MODEL, weights_GiB=report["weight_bytes"]["total"] / mem.GIB,
    kv_bytes_per_token=report["kv_bytes_per_token"], engine_model=params.ENGINE_MODEL,
    engine_dtype=str(model.embed_tokens.weight.dtype), engine_device=str(model.embed_tokens.weight.device),
    max_param_error_pct=float(table["error_%"].abs().max()),
    engine_alloc_max_rel_error=float((alloc["measured / predicted"] - 1).abs().max()),
    engine_decode_vs_bound_batch1=float(check["measured / bound"].iloc[0]),
    **{f"int4_over_bf16_batch{r.batch}": round(r.measured_speedup, 3)
       for r in int4_table[int4_table["int4 against"] == "bfloat16"].itertuples()},
    wrong_claims=int((claims["verdict"] == "wrong").sum()))

# %%
if INTERACTIVE:
    import ipywidgets as w

    from lab.workflow.widgets import panel

    controls = {"model": w.Dropdown(options=list(dict.fromkeys([*study.MODEL_NAMES, params.MODEL])), value=params.MODEL),
                "weights": w.Dropdown(options=["bf16", "fp8", "int8", "int4-g128", "gguf-q4_0"],
                                      value=params.WEIGHTS),
                "kv": w.Dropdown(options=study.KV_DTYPES, value=params.KV_DTYPE),
                "seq_len": w.IntSlider(value=params.SEQ_LEN, min=512, max=131072, step=512, continuous_update=False),
                "concurrency": w.IntSlider(value=params.CONCURRENCY, min=1, max=256, continuous_update=False),
                "gpu": w.Dropdown(options=sorted(study.GPUS), value=params.GPU)}
    show = lambda model, weights, kv, seq_len, concurrency, gpu: print(mem.format_report(  # noqa: E731
        mem.memory_report(model, weights, kv, seq_len, concurrency, gpu, params.BLOCK_SIZE)))
    display(panel(show, controls, "memory report"))  # noqa: F821

# %% [markdown]
# ## The finding
# One sentence, filled from this run's files, and its key figure, whose title is the sentence
# (`lab.studies.findings`; the README, the study doc and `lab report` print the same sentence).

# %%
from lab.studies.findings import key_figure, sentence

print(sentence(run.notebook, run.dir))
run.save_figure("finding", key_figure(run.notebook, run.dir))
run.finish()
