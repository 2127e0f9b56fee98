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
# # 07 · Structured output: what the grammar mask costs, and what it buys
#
# The deployment article (seeds/003, section 5.3) says constrained decoding gives "an absolutely correct format"
# and more speed (a smaller search space, fewer retries), that masking a vocabulary of a hundred thousand tokens
# or more every step can take 20-30% of a step at small batch, that precompiling the state transitions turns the
# mask into a table lookup and a bitwise AND, and that deeply nested schemas make the state machine explode. The
# lab engine constrains requests with xgrammar (Dong et al., 2024, arXiv:2411.15100; what vLLM and SGLang use):
# a JSON schema, a regex or an EBNF grammar becomes a pushdown automaton whose token masks are mostly
# precomputed; each request has a matcher, and its mask sets forbidden logits to -inf before any sampling
# (`lab.engine.structured`, docs/structured_output.md). This notebook measures, on SmolLM2-135M-Instruct in the
# serving dtype on DEVICE (the gpu preset: batches to 256 against a decode step of milliseconds): (a) the mask
# cost per decode step at each of BATCHES, (b) grammar compile times, cold and cached, and against nesting
# depth, (c) valid-JSON rates and field accuracy on an extraction task with and without the grammar, (d)
# jump-forward (tokens the grammar forces, appended without sampling), and (e) the article's claims. The logic
# lives in `lab.studies.structured_output`, `structured_output_task` and `structured_output_claims`.

# %% tags=["parameters"]
PRESET = "quick"  # quick (minutes), reference (committed runs), smoke (tests) or gpu (CUDA); values set below win
INTERACTIVE = False  # show the widget cells
DEVICE = "auto"  # auto (CUDA when present), cpu, cuda or cuda:N
MODEL = "smollm2-135m"  # needs its tokenizer: grammars are over its vocabulary
DTYPE = "auto"  # the serving dtype, or "float32"
BATCHES = (1, 4, 16, 32, 64)  # the mask-cost batch sizes
MASK_STEPS = 16  # timed decode steps per batch size and round, with and without the grammar
ROUNDS = 3  # interleaved runs of every batch size, on and off: the ratio's interval is their spread
WARM_STEPS = 4
LIST_ITEMS = 16  # the mask-cost output: a list of this many objects (long enough for every step)
NAIVE_SAMPLE = 2048  # tokens the naive mask tries per state (scaled to the vocabulary)
NAIVE_POSITIONS = 24  # states it is timed at
COMPILE_REPEATS = 5
NESTING_DEPTHS = (1, 2, 4, 8, 16, 32)
ITEMS = 120  # extraction task sentences
TEMPERATURE = 0.7  # the sampled run (one seed per item)
MAX_TOKENS = 96
JUMP_ITEMS = 16  # items generated one at a time with jump-forward on and off
HARDWARE = "h100-sxm"  # the projection accelerator
PROJECT_MODELS = ("llama-3-8b", "qwen2.5-7b", "llama-3-70b")

# %%
import pandas as pd

from lab.engine.grammar import grammars_for
from lab.machine.hardware import probe_inference
from lab.models import load_model
from lab.workflow.run import params_from_namespace, resolve_device, start_run
from lab.studies.structured_output import claims as claims_mod, measure as study, task

params = params_from_namespace(study.StructuredParams, globals())  # validates every value before heavy work
run = start_run("07_structured_output", params)
device = resolve_device(params.DEVICE)
model, tok = load_model(params.MODEL, dtype=params.torch_dtype, device=device, prepack_weights=True)
print(f"{params.MODEL} in {params.torch_dtype} on {device}")
vocab = model.config.vocab_size
stop_ids = set(model.config.eos_token_ids)  # as the engine builds its grammars
grammars = grammars_for(tok, vocab, stop_ids)

# %% [markdown]
# ## 1. What the mask costs per decode step
# A batch of requests decodes a long JSON list (an object holding LIST_ITEMS small objects, so every timed step
# is inside the grammar) with the grammar, and the same prompts for the same number of steps without it (EOS
# ignored): the same shapes, so the difference is the mask. Each step is timed on its own; the engine's
# `structured_mask_seconds` gives the mask time inside it (filling each request's bitmask from its matcher, then
# setting forbidden logits to -inf, one request after another). Only steps where the whole batch ran count.
# The machine's speed drifts between runs more than one run's steps vary, so the whole comparison runs ROUNDS
# times, interleaved (on first in every other round): the ratio with / without and the mask's share are medians
# over rounds with the rounds' span as their interval; one round's interval over its steps is shown beside it.

# %%
steps, constrained_outputs = study.mask_cost(params, model, tok)
run.save_table("mask_steps", steps)
summary = study.mask_summary(steps)
run.save_table("mask_summary", summary)
summary.round(3)

# %% [markdown]
# The outputs are then replayed through a new matcher, token by token: the fill (xgrammar's precomputed masks
# plus the tokens whose validity depends on the stack) and the apply are timed per row, with how many tokens
# the state allows. At a few states, the naive mask the article describes is timed too: every token tried
# against the grammar (accept, then roll back), on a sample scaled to the vocabulary, and checked against
# xgrammar's mask on that sample.

# %%
components = study.mask_components(params, grammars, constrained_outputs, vocab, device)
run.save_table("mask_components", components)
run.save_figure("mask_cost", claims_mod.plot_mask_cost(summary, components))
components.describe().T[["count", "50%", "max"]]

# %% [markdown]
# ## 2. Compile time: cold, cached, and against nesting depth
# Cold is a fresh compile (a cache miss: what the first request with a new schema waits for before its prefill);
# cached is the engine's lookup by the grammar's text. The tokenizer info (the vocabulary decoded for the
# matcher) is built once per model. Then objects nested 1 to 32 deep: compile time, and the fill time along a
# valid instance, to see whether the automaton "explodes".

# %%
compile_df, depth = study.compile_times(params, tok, vocab, stop_ids)
run.save_table("compile_times", compile_df)
run.save_table("nesting_depth", depth)
display(compile_df.round(3))  # noqa: F821
depth.round(2)

# %% [markdown]
# ## 3. Valid JSON and field accuracy, with and without the grammar
# ITEMS generated sentences about a person (name, age, city, job; `lab.studies.structured_output.task`), each asked to
# be extracted as a JSON object with four keys, greedy and sampled at TEMPERATURE, with and without the schema.
# Scoring is lenient with the unconstrained outputs (a JSON object anywhere in the text counts for the content).
# Rates carry Wilson 95% intervals; field accuracy a bootstrap interval over items. "Per valid answer" divides
# by the schema-valid rate: what an application that retries invalid answers pays on average.

# %%
extraction = study.extraction(params, model, tok)
run.save_table("extraction_outputs", extraction.drop(columns="token_ids"))
validity = task.validity_table(extraction)
run.save_table("validity", validity)
run.save_figure("validity", claims_mod.plot_validity(validity))
validity.round(3).T

# %% [markdown]
# Does the grammar change what the model says, beyond its format? Per item, the share of fields right with the
# grammar minus without (paired), over all items and over the items where both outputs held a JSON object.

# %%
comparison = task.accuracy_comparison(extraction)
run.save_table("accuracy_comparison", comparison)
display(comparison.round(3))  # noqa: F821
extraction[["item", "temperature", "grammar", "text"]].head(6)

# %% [markdown]
# ## 4. Jump-forward
# Where the grammar allows exactly one token (the `"` after `{`, a `,` or `}` with no alternative, the end of
# an enum value), the engine can append it without sampling (`StructuredOutputsConfig(jump_forward=True)`): the
# token is computed in the next step's forward together with the sampled one, so a forced run of tokens costs
# one step. At batch 1, one item at a time, off and on, in the serving dtype. The forced token has probability
# 1 under the mask, so in float32 greedy outputs are equal token for token (tested, and checked below); in
# bfloat16 a two-token forward rounds differently from two one-token steps, so a near-tie later in the output
# can flip (as with speculative verification, notebook 05).

# %%
jump = study.jump_forward(params, model, tok)
run.save_table("jump_forward", jump)
jump_summary = jump.groupby("jump_forward")[["seconds", "steps", "tokens", "forced_tokens"]].sum()
jump_summary["items with equal outputs"] = jump.groupby("jump_forward")["equal_to_off"].sum()
model32, _ = load_model(params.MODEL, dtype="float32", device=device)
jump32 = study.jump_forward(params, model32, tok)
jump_summary["items equal in float32"] = jump32.groupby("jump_forward")["equal_to_off"].sum()
run.save_table("jump_forward_summary", jump_summary.reset_index())
jump_summary

# %% [markdown]
# Token-level forcing only skips a token when no other tokenization is allowed; JSON keys rarely qualify, since
# the vocabulary spells `"name"` in several allowed ways. The string-level bound counts the output tokens that
# lie wholly inside the text the grammar forces where they are written (xgrammar's `find_jump_forward_string`):
# what a jump-forward that appends text and retokenizes it (SGLang's) could skip at most, at the price of
# tokenizations the model might not have produced.

# %%
bound = study.string_jump_bound(grammars, list(extraction.query("grammar and temperature == 0")["token_ids"]), vocab)
bound

# %% [markdown]
# ## 5. Projected to a GPU and a larger vocabulary
# The article's setting: a vocabulary of 100k+ on a GPU whose decode step is milliseconds. The step is the
# roofline's lower bound on HARDWARE (bf16 weights and KV, 2048 tokens of context per sequence); the host fills
# each request's mask in turn, at the mean fill time measured above scaled by the vocabulary; applying the mask
# is one small kernel on the GPU, left out. The shares are upper bounds (a real step is longer than its bound);
# "overlapped" fills the next masks during the forward (vLLM v1 does) and shows what is left uncovered; "naive"
# is the token-by-token mask (`lab.studies.structured_output.claims`). The same projection follows on the device
# this run used, at the ceilings measured on it in the run's dtype (`lab.machine.hardware.probe_inference`).

# %%
fill_row = float(components["fill_s"].mean())  # the host work per request and step (applying runs on the GPU)
naive_row = float(components["naive_s"].dropna().median())
here = probe_inference(params.torch_dtype, str(device))
print(f"{here.name}: {here.peak_flops / 1e12:.2f} TFLOP/s, {here.mem_bandwidth / 1e9:.1f} GB/s ({here.source})")
proj = pd.concat([claims_mod.projection(params, fill_row, naive_row, vocab),
                  claims_mod.projection(params, fill_row, naive_row, vocab, here)], ignore_index=True)
run.save_table("projection", proj)
proj.round(3)

# %% [markdown]
# ## 6. The article's claims

# %%
claims = claims_mod.claims_table(params, validity, summary, components, depth, compile_df, proj, vocab)
run.save_table("claims", claims)
with pd.option_context("display.max_colwidth", 160):
    display(claims)  # noqa: F821

# %% [markdown]
# ## 7. Explore (INTERACTIVE)
# The projected share of the mask for another model, accelerator and batch size (fill time measured above).

# %%
if INTERACTIVE:
    import ipywidgets as widgets

    from lab.machine.hardware import GPUS
    from lab.workflow.widgets import panel

    def show(model_name, hardware, batch):
        display(claims_mod.projection(params, fill_row, naive_row, vocab, hardware, (batch,),  # noqa: F821
                                       (model_name,)).round(4).T)

    display(panel(show, {"model_name": widgets.Dropdown(options=list(params.PROJECT_MODELS)),  # noqa: F821
                         "hardware": widgets.Dropdown(options=sorted(GPUS)),
                         "batch": widgets.IntSlider(value=1, min=1, max=256)},
                  "mask share projection"))

# %%
greedy_on = validity.query("temperature == 0 and grammar == 'on'").iloc[0]
greedy_off = validity.query("temperature == 0 and grammar == 'off'").iloc[0]
run.save_metrics(**{f"mask_share_batch_{int(r['batch'])}": float(r["mask share of step"]) for _, r in summary.iterrows()},
                 mask_ms_per_row=float(summary["mask ms per row"].iloc[-1]), fill_us_per_row=1e6 * fill_row, schema_valid_with_grammar=float(greedy_on["schema_valid"]),
                 schema_valid_without=float(greedy_off["schema_valid"]),
                 field_accuracy_with=float(greedy_on["field accuracy"]),
                 field_accuracy_without=float(greedy_off["field accuracy"]),
                 jump_forward_tokens=int(jump_summary.loc[True, "forced_tokens"]),
                 jump_forward_steps_saved=int(jump_summary.loc[False, "steps"] - jump_summary.loc[True, "steps"]),
                 jump_forward_equal_float32=int(jump_summary.loc[True, "items equal in float32"]),
                 string_jump_share=float(bound["share"]),
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
