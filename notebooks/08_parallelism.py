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
# # 08 · Tensor and pipeline parallelism: what communication costs
#
# The deployment article (seeds/003, section 4.3) says tensor parallelism (TP) splits every layer and syncs
# after each, so it needs fast links and should stay within a node of at most 8 cards, and that pipeline
# parallelism (PP) sends little but leaves a bubble, which micro-batches "at least 4x the stages" fill; the
# replay article (seeds/000, section 5.2) reports all-reduce at 40% of a decode step with 8-way TP on a 70B
# model; the TTFT article (seeds/002) puts a 140 GB model at 17.5 GB per GPU on 8 GPUs. The lab engine runs
# TP on `torch.distributed` (`LLM(..., tensor_parallel_size=2)`: Megatron-style shards in processes, gloo on
# this CPU; `lab.parallel`, docs/engine.md). This notebook measures this machine's collectives and fits the
# alpha-beta model (latency + bytes / bandwidth), times the engine's decode and prefill steps at TP=1 and TP=2
# with the seconds spent in collectives inside them, checks the model against that, projects the communication
# share to Llama-3-70B at TP=8 on NVLink and on PCIe, asks what the article's 40% takes, times one TP=8 rank's
# compute on DEVICE (the gpu preset: every layer of a 70B rank on one GPU) to project the step from a measurement,
# and checks the memory per device. The processes run on this machine's CPU with gloo whatever DEVICE is (one GPU
# cannot hold two NCCL ranks). The logic lives in `lab.studies.parallelism` and `parallelism_rank`.

# %% tags=["parameters"]
PRESET = "quick"  # quick (minutes), reference (committed runs), smoke (tests) or gpu (CUDA); values set below win
INTERACTIVE = False  # show the widget cells
DEVICE = "auto"  # where one rank is timed: auto (CUDA when present), cpu, cuda or cuda:N
MODEL = "smollm2-135m"
DTYPE = "auto"  # of the timed steps (the equality check runs in float32)
COMM_SIZES = tuple(4 ** k for k in range(1, 13))  # bytes, 4 B to 16 MiB
COMM_REPEATS = 30
BATCHES = (1, 8, 32)  # decode batch sizes, timed at TP 1 and 2
PREFILL_TOKENS = (128, 512)  # prompt lengths of the timed prefill steps
STEPS = 16  # timed steps per point
MICRO_BATCHES = (1, 2, 4, 8, 16)  # the micro-batch counts of the pipeline
PP_BATCH = 16  # sequences in the pipeline decode and prefill steps
PP_PROMPT = 64  # tokens of each prompt in its prefill steps
PROJECT_MODEL = "llama-3-70b"
PROJECT_TP = 8
PROJECT_BATCHES = (1, 8, 64, 256)
CONTEXT = 2048  # tokens of context per sequence in the projection
HARDWARE = "h100-sxm"
ALPHAS_US = (1, 2, 5, 10, 15, 20, 30, 50, 80)  # the latency sweep of the projection
RANK_LAYERS = 1  # layers of one PROJECT_TP rank timed on DEVICE (the step scaled to all of them)

# %%
import pandas as pd

from lab.machine.hardware import probe_inference
from lab.memory import ModelShape
from lab.parallel.comm_model import LINKS
from lab.workflow.run import params_from_namespace, resolve_device, start_run
from lab.studies.parallelism import measure as study, claims as claims_mod, rank as parallelism_rank

params = params_from_namespace(study.ParallelParams, globals())  # validates every value before heavy work
run = start_run("08_parallelism", params)
shape = ModelShape.load(params.MODEL)

# %% [markdown]
# ## 1. This machine's links
# Two processes of one `torch.distributed` group (gloo, one thread each, as the engine's TP ranks), over message
# sizes, COMM_REPEATS calls each: a ping-pong and an all-reduce, each call after a barrier, and an all-reduce
# after a small matmul on every rank with no barrier, as the collectives inside a step meet. Each is fitted by
# the alpha-beta model to the median and to the mean times (`lab.parallel.comm_bench`; weighted by 1 / time so
# the small messages set alpha). On these 2 virtual cores the mean is several times the median: some calls wait
# milliseconds for the other process to be scheduled. A step of 64 collectives pays the mean, so the model of
# section 2 uses the mean fit of the all-reduce between matmuls.

# %%
sweep, fitted = study.links(params)
run.save_table("comm_sweep", sweep)
run.save_table("comm_fit", fitted)
run.save_figure("comm_sweep", study.plot_links(sweep, fitted))
fitted.round(3)

# %% [markdown]
# ## 2. TP=2 on the engine: steps, and the collectives inside them
# Decode steps of BATCHES sequences of 256 tokens and prefill steps of PREFILL_TOKENS prompts, STEPS each, at
# TP=1 (one process, the machine's 2 threads) and TP=2 (two processes of one thread). On rank 0, every
# collective of a step is timed (`LLM.stats()`'s `tp_*` entries): 2 L + 1 all-reduces and a gather of the logits
# on the tensor group, two broadcasts of the batch on the control group. Rank 0 holds 2 of SmolLM2's 3 KV heads
# (6 of its 9 query heads): the heads do not split evenly, so its all-reduces also wait for less work on rank 1.

# %%
steps = pd.concat([study.tp_steps(params, 1), study.tp_steps(params, 2)], ignore_index=True)
run.save_table("tp_steps", steps)
tp = study.tp_summary(steps, fitted, shape, params.torch_dtype.itemsize)
run.save_table("tp_summary", tp)
tp.round(3)

# %% [markdown]
# ## 3. Projected: Llama-3-70B at TP=8 on NVLink and on PCIe
# The step is the roofline's bound for one rank's share of the weights and KV cache on HARDWARE (bf16, CONTEXT
# tokens a sequence) plus the collectives by the alpha-beta model, with bus bandwidths from nccl-tests
# (`lab.parallel.comm_model.LINKS`, sources there) and an assumed latency; "alpha for 40%" is the all-reduce
# latency at which communication would take the article's 40% of the step.

# %%
proj = study.projection(params)
run.save_table("projection", proj)
sweep_alpha = study.alpha_sweep(params)
run.save_table("alpha_sweep", sweep_alpha)
run.save_figure("alpha_sweep", study.plot_alpha_sweep(sweep_alpha, params))
proj.round(3)

# %% [markdown]
# ## 3b. One rank measured on DEVICE, and the step projected from it
# What a TP rank computes between its collectives needs one device: rank 0's share of PROJECT_MODEL at PROJECT_TP
# (its heads, MLP features and vocabulary slice) as random weights on DEVICE in its serving dtype, RANK_LAYERS of
# its layers timed at each of PROJECT_BATCHES (CONTEXT tokens of KV a sequence) and scaled to all of them, plus its
# LM head slice (`lab.studies.parallelism.rank`). The collectives come from the alpha-beta model as above; the
# roofline's compute is shown on DEVICE's ceilings measured in the same dtype (`lab.machine.hardware.probe_inference`) and
# on HARDWARE's datasheet. The CPU presets time one layer, and their projection reads as this machine's, not a
# GPU's.

# %%
device = resolve_device(params.DEVICE)
rank = parallelism_rank.rank_decode(params, device, params.device_dtype)
run.save_table("rank_decode", rank)
here = probe_inference(params.device_dtype, str(device))
print(f"{here.name}: {here.peak_flops / 1e12:.2f} TFLOP/s, {here.mem_bandwidth / 1e9:.1f} GB/s ({here.source})")
rank_proj = parallelism_rank.rank_projection(params, rank, here)
run.save_table("rank_projection", rank_proj)
display(rank.round(3))  # noqa: F821
rank_proj.drop(columns=["device", "datasheet"]).round(3)

# %% [markdown]
# ## 4. Memory per device
# Each rank's weights and KV bytes per token, `lab.memory`'s accounts of the rank's shape (split as the engine
# splits: `lab.parallel.sharding.rank_shapes`), against what the engine allocated.
# The engine's shards at TP=2 (a 64-block pool) against the same count: rank 0 holds the larger share (2 of 3
# KV heads). And the articles' figure: Llama-3-70B at TP=8.

# %%
engine_mem = study.engine_memory(params)
run.save_table("engine_memory", engine_mem)
per_rank = study.rank_memory(ModelShape.preset(params.PROJECT_MODEL), params.PROJECT_TP)
run.save_table("projected_memory", per_rank)
display(engine_mem)  # noqa: F821
per_rank.head(2)

# %% [markdown]
# ## 5. The pipeline bubble
# PP=2 (`pipeline_parallel_size=2`: rank 0 runs the first half of the layers for each micro-batch and sends its
# hidden states on, rank 1 the second half and the LM head), decode steps of PP_BATCH sequences and prefill steps
# of PP_BATCH prompts of PP_PROMPT tokens, for each micro-batch count. Rank 0's wait for the last stage's logits
# (`pp_recv_seconds`) is its idle share, to set against GPipe's (p - 1) / (m + p - 1); the step against PP=1 says
# what the micro-batches cost.

# %%
pp = study.pp_steps(params)
run.save_table("pp_steps", pp)
bubble = study.bubble_summary(pp)
run.save_table("bubble", bubble)
run.save_figure("bubble", claims_mod.plot_bubble(bubble))
bubble.round(3)

# %% [markdown]
# ## 6. The articles' claims

# %%
claims = claims_mod.claims_table(params, tp, proj, bubble, per_rank)
run.save_table("claims", claims)
with pd.option_context("display.max_colwidth", 160):
    display(claims)  # noqa: F821

# %% [markdown]
# ## 7. Explore (INTERACTIVE)
# The communication share of a decode step for another model, degree, link latency and batch size.

# %%
if INTERACTIVE:
    import ipywidgets as widgets

    from lab.machine.hardware import GPUS
    from lab.parallel.comm_model import Link, tp_decode_step
    from lab.workflow.widgets import panel

    def show(model_name, tp_degree, link, alpha_us, batch):
        bw = LINKS[link].bandwidth
        step = tp_decode_step(ModelShape.preset(model_name), GPUS[params.HARDWARE], tp_degree, batch, params.CONTEXT,
                              Link(link, alpha_us * 1e-6, bw))
        print(f"compute {1e3 * step.compute_s:.2f} ms, collectives {1e3 * step.comm_s:.2f} ms "
              f"({step.allreduces} all-reduces of {step.allreduce_bytes:.0f} B): {100 * step.comm_share:.1f}% of the step")

    display(panel(show, {"model_name": widgets.Dropdown(options=["llama-3-70b", "llama-3-8b", "qwen2.5-72b"]),  # noqa: F821
                         "tp_degree": widgets.Dropdown(options=[2, 4, 8]),
                         "link": widgets.Dropdown(options=list(LINKS)),
                         "alpha_us": widgets.FloatSlider(value=15, min=1, max=100),
                         "batch": widgets.IntSlider(value=1, min=1, max=256)},
                  "TP communication share"))

# %%
decode1 = tp[tp["phase"] == "decode"].sort_values("tokens").iloc[0]
in_step = fitted.query("op == 'all-reduce between matmuls' and statistic == 'mean'").iloc[0]
nvlink1 = proj[(proj["link"] == "nvlink-h100x8")].sort_values("batch").iloc[0]
measured1 = rank_proj[(rank_proj["link"] == "nvlink-h100x8")].sort_values("batch").iloc[0]
run.save_metrics(allreduce_alpha_us=float(in_step["alpha_us"]),
                 tp2_decode_speedup_batch1=float(decode1["speedup"]),
                 tp2_decode_comm_share_batch1=float(decode1["comm share (measured)"]),
                 tp2_comm_model_over_measured=float(decode1["model / measured"]),
                 projected_comm_share_70b_tp8_nvlink=float(nvlink1["comm share"]),
                 alpha_for_40pct_us=float(nvlink1["alpha for 40% (us)"]),
                 rank_step_ms_measured_batch1=float(measured1["compute ms (measured)"]),
                 comm_share_from_measured_rank_nvlink=float(measured1["comm share"]),
                 pp_wait_share_prefill_m8=float(bubble.query("phase == 'prefill'").iloc[-1]["wait share (measured)"]),
                 weights_per_rank_70b_tp8_GB=float(per_rank["weight bytes"].max() / 1e9),
                 wrong_claims=int((claims["holds"] == False).sum()))  # noqa: E712

# %% [markdown]
# ## The finding
# One sentence, filled from this run's files, and its key figure, whose title is the sentence
# (`lab.studies.findings`; the README, the study doc and `lab report` print the same sentence).

# %%
from lab.studies.findings import key_figure, sentence

print(sentence(run.notebook, run.dir))
run.save_figure("finding", key_figure(run.notebook, run.dir))
run.finish()
