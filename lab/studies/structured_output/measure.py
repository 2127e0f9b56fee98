"""Structured output (notebook 07): what a grammar mask costs, what it buys, and what the article says about both.

Seed 003 (section 5.3) says constrained decoding makes the format "absolutely correct" and faster (fewer
retries), that masking a 100k+ vocabulary each step can take 20-30% of a step at small batch, that a
precompiled state-transition table reduces the mask to a lookup and a bitwise AND, and that deeply nested
schemas make the state machine explode. This module measures each on the lab engine
(`lab.engine.structured`, xgrammar's matcher; Dong et al., 2024, arXiv:2411.15100):

- `mask_cost`: decode steps of a batch with and without a grammar, the same shapes, timed step by step, with
  the engine's own mask time (`structured_mask_seconds`) per step;
- `mask_components`: the outputs replayed through a matcher: filling a mask, applying it, and the naive mask
  the article describes (every token of the vocabulary tried against the grammar, timed on a sample and
  scaled to the vocabulary), checked against xgrammar's mask on that sample;
- `compile_times`: each grammar compiled cold and found in the cache, and compile and fill times against the
  nesting depth of a schema, a recursive one included;
- `extraction`: the task of `lab.studies.structured_output.task` with and without the grammar, greedy and sampled:
  valid-JSON rates with Wilson intervals, field accuracy with a paired bootstrap interval;
- `jump_forward`: tokens the grammar forces, appended without sampling (`StructuredOutputsConfig(jump_forward=
  True)`), on and off at batch 1, and the string-level bound (xgrammar's `find_jump_forward_string`).

The projection to a GPU serving a larger vocabulary and the claims table are `lab.studies.structured_output.claims`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from lab.engine import LLM, SamplingParams, StructuredOutputsParams
from lab.engine.chat import render
from lab.engine.grammar import apply_bitmask
from lab.engine.structured import GrammarState, StructuredOutputsConfig
from lab.machine.hardware import GPUS
from lab.memory import ModelShape
from lab.models.loader import default_dtype, parse_dtype
from lab.workflow.run import as_tuple, check_choice, check_device, check_model, check_dtype, check_range, resolve_device
from lab.studies.structured_output import task
from lab.machine.timing import median_seconds, sync

EMAIL, DATE = r"[a-z]{1,10}\.[a-z]{1,10}@[a-z]{2,8}\.(com|org|net)", r"\d{4}-\d{2}-\d{2}"
ARITHMETIC = ('root ::= expr\nexpr ::= term (("+" | "-") term)*\nterm ::= factor (("*" | "/") factor)*\n'
              'factor ::= [0-9]+ | "(" expr ")"')


def list_schema(n: int) -> dict:
    """An object holding a list of exactly n small objects: a long output that stays inside the grammar."""
    entry = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                              "qty": {"type": "integer", "minimum": 1, "maximum": 99}},
             "required": ["name", "qty"]}
    return {"type": "object", "properties": {"items": {"type": "array", "minItems": n, "maxItems": n,
                                                       "items": entry}}, "required": ["items"]}


def nested_schema(depth: int) -> dict:
    """Objects nested `depth` deep, each with an integer and a string (and, but the innermost, its child)."""
    node = {"type": "object", "properties": {"v": {"type": "integer"}, "s": {"type": "string", "maxLength": 8}},
            "required": ["v", "s"]}
    for _ in range(depth - 1):
        node = {"type": "object", "properties": {"v": {"type": "integer"}, "s": {"type": "string", "maxLength": 8},
                                                 "child": node}, "required": ["v", "s", "child"]}
    return node


def nested_instance(depth: int) -> dict:
    node = {"v": depth, "s": "ab"}
    for d in range(depth - 1):
        node = {"v": d, "s": "ab", "child": node}
    return node


TREE = {"$defs": {"node": {"type": "object", "properties": {"v": {"type": "integer"}, "children": {
    "type": "array", "items": {"$ref": "#/$defs/node"}}}, "required": ["v", "children"]}}, "$ref": "#/$defs/node"}


def grammar_suite(list_items: int) -> dict[str, StructuredOutputsParams]:
    """The grammars whose compile time the notebook reports."""
    return {"extraction schema (4 fields)": StructuredOutputsParams(json=task.SCHEMA),
            f"list of {list_items} objects": StructuredOutputsParams(json=list_schema(list_items)),
            "objects nested 8 deep": StructuredOutputsParams(json=nested_schema(8)),
            "recursive tree ($ref)": StructuredOutputsParams(json=TREE),
            "any JSON object": StructuredOutputsParams(json_object=True),
            "regex: email": StructuredOutputsParams(regex=EMAIL), "regex: ISO date": StructuredOutputsParams(regex=DATE),
            "EBNF: arithmetic": StructuredOutputsParams(grammar=ARITHMETIC),
            "choice of 3": StructuredOutputsParams(choice=["positive", "negative", "neutral"])}


@dataclass
class StructuredParams:
    PRESET: str = "quick"
    INTERACTIVE: bool = False
    DEVICE: str = "auto"  # where the model runs: "auto" (CUDA when present), "cpu", "cuda" or "cuda:N"
    MODEL: str = "smollm2-135m"  # needs its tokenizer: grammars are over its vocabulary
    DTYPE: str = "auto"  # the serving dtype, or "float32"
    BATCHES: tuple = (1, 4, 16, 32, 64)  # the mask-cost batch sizes
    MASK_STEPS: int = 16  # timed decode steps per batch size and round, with and without the grammar
    ROUNDS: int = 3  # interleaved runs of every batch size, on and off: the ratio's interval is their spread
    WARM_STEPS: int = 4
    LIST_ITEMS: int = 16  # the mask-cost output: a list of this many objects (long enough for every step)
    NAIVE_SAMPLE: int = 2048  # tokens the naive mask tries per state (scaled to the vocabulary)
    NAIVE_POSITIONS: int = 24  # states it is timed at
    COMPILE_REPEATS: int = 5
    NESTING_DEPTHS: tuple = (1, 2, 4, 8, 16, 32)
    ITEMS: int = 120  # extraction task sentences
    TEMPERATURE: float = 0.7  # the sampled run (one seed per item)
    MAX_TOKENS: int = 96
    JUMP_ITEMS: int = 16  # items generated one at a time with jump-forward on and off
    HARDWARE: str = "h100-sxm"  # the projection's accelerator
    PROJECT_MODELS: tuple = ("llama-3-8b", "qwen2.5-7b", "llama-3-70b")
    PRESETS: ClassVar[dict] = {
        "quick": {"BATCHES": (1, 32), "MASK_STEPS": 8, "NAIVE_SAMPLE": 1024, "NAIVE_POSITIONS": 12, "COMPILE_REPEATS": 3,
                  "NESTING_DEPTHS": (1, 4, 16), "ITEMS": 16, "JUMP_ITEMS": 3},
        "smoke": {"BATCHES": (1, 4), "MASK_STEPS": 3, "ROUNDS": 1, "WARM_STEPS": 1, "LIST_ITEMS": 4, "NAIVE_SAMPLE": 64,
                  "NAIVE_POSITIONS": 3, "COMPILE_REPEATS": 1, "NESTING_DEPTHS": (1, 2), "ITEMS": 3,
                  "MAX_TOKENS": 48, "JUMP_ITEMS": 1},
        # the article's regime: the host's mask fill against a decode step of milliseconds on one GPU, batches
        # to 256 (on a CPU the step is so long that the mask vanishes in it), projected to the H200's datasheet;
        # the extraction and jump-forward sections at a few items (the CPU reference has them in full). ~19 s on
        # one H200 (gpu/gpu_suite.sh allots 20): mask steps ~2 s, mask replay ~0.7 s, extraction 4 x ~65 steps
        # ~1.7 s, jump-forward ~2.3 s, and ~4.6 s no parameter removes (probe 3 s, the float32 reload, grammar
        # compiles); 8 s start.
        "gpu": {"BATCHES": (1, 64, 256), "MASK_STEPS": 16, "WARM_STEPS": 2, "COMPILE_REPEATS": 2,
                "NESTING_DEPTHS": (1, 8, 32), "NAIVE_POSITIONS": 12, "ITEMS": 8, "MAX_TOKENS": 64, "JUMP_ITEMS": 1,
                "HARDWARE": "h200"},
    }

    def __post_init__(self):
        check_device("DEVICE", self.DEVICE)
        check_dtype("DTYPE", self.DTYPE)
        check_model("MODEL", self.MODEL, self.DEVICE, self.DTYPE, needs_tokenizer="grammars are over its vocabulary")
        self.torch_dtype = parse_dtype(self.DTYPE) or default_dtype(resolve_device(self.DEVICE))
        self.BATCHES, self.NESTING_DEPTHS, self.PROJECT_MODELS = (
            as_tuple(n, getattr(self, n)) for n in ("BATCHES", "NESTING_DEPTHS", "PROJECT_MODELS"))
        for b in self.BATCHES:
            check_range("BATCHES", b, 1, 256, int)
        for d in self.NESTING_DEPTHS:
            check_range("NESTING_DEPTHS", d, 1, 64, int)
        for name, lo, hi in (("MASK_STEPS", 1, 1000), ("ROUNDS", 1, 50), ("WARM_STEPS", 0, 100), ("LIST_ITEMS", 1, 64),
                             ("NAIVE_SAMPLE", 1, 1 << 20), ("NAIVE_POSITIONS", 1, 1000), ("COMPILE_REPEATS", 1, 100),
                             ("ITEMS", 1, 400), ("MAX_TOKENS", 16, 1024), ("JUMP_ITEMS", 1, 400)):
            check_range(name, getattr(self, name), lo, hi, int)
        check_range("TEMPERATURE", self.TEMPERATURE, 0.01, 2.0)
        check_choice("HARDWARE", self.HARDWARE, sorted(GPUS))
        for m in self.PROJECT_MODELS:
            ModelShape.preset(m)  # an unknown preset is refused here, by name
        if self.JUMP_ITEMS > self.ITEMS:
            raise ValueError(f"parameter JUMP_ITEMS={self.JUMP_ITEMS} is more than ITEMS={self.ITEMS}")


# ---- (a) the mask's cost per step ---------------------------------------------------------------------------
def _list_prompt(tok, i: int) -> str:
    return render(tok, [{"role": "user", "content": f"List {10 + i % 7} things found in a {['kitchen', 'garage', 'garden', 'office'][i % 4]}"
                         " with a quantity for each, as JSON."}])


def _timed_steps(p: StructuredParams, model, tok, batch: int, constrained: bool) -> tuple[list[dict], list[list[int]]]:
    max_tokens = p.WARM_STEPS + p.MASK_STEPS + 2
    llm = LLM(model, tokenizer=tok, max_num_seqs=batch, max_model_len=256 + max_tokens,
              num_kv_blocks=batch * (-(-(256 + max_tokens) // 16)), max_num_batched_tokens=max(2048, batch * 128))
    spec = StructuredOutputsParams(json=list_schema(p.LIST_ITEMS)) if constrained else None
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True, structured_outputs=spec)
    for i in range(batch):
        llm.add_request(_list_prompt(tok, i), params)
    ext = llm.extensions["structured_outputs"]
    outputs = []
    while any(s.prefilling for s in llm.view().requests):
        outputs += llm.step()
    for _ in range(p.WARM_STEPS):
        outputs += llm.step()
    rows = []
    for step in range(p.MASK_STEPS):
        running, mask0 = len(llm.view().running), ext.mask_seconds
        start = time.perf_counter()
        outputs += llm.step()
        rows.append({"batch": batch, "grammar": constrained, "step": step, "running": running,
                     "step_s": time.perf_counter() - start, "mask_s": ext.mask_seconds - mask0})
    while llm.has_unfinished():
        outputs += llm.step()
    llm.close()
    return rows, [d.output.token_ids for d in outputs if d.finished]


def mask_cost(p: StructuredParams, model, tok) -> tuple[pd.DataFrame, list[list[int]]]:
    """Per timed decode step: its wall time and the mask time within it, at each batch size, grammar on and
    off (the same prompts and lengths: the off run ignores EOS), in `ROUNDS` interleaved rounds (on first in
    odd rounds), so the machine's drift between runs shows as the rounds' spread. Returns the steps and the
    first round's constrained outputs."""
    rows, outputs = [], []
    jobs = [(r, batch) for r in range(p.ROUNDS) for batch in p.BATCHES]
    for r, batch in tqdm(jobs, desc="mask cost: rounds x batch sizes"):
        for constrained in ((False, True) if r % 2 == 0 else (True, False)):
            steps, out = _timed_steps(p, model, tok, batch, constrained)
            rows += [{**row, "round": r} for row in steps]
            outputs += out if constrained and r == 0 else []
    return pd.DataFrame(rows), outputs


def mask_summary(steps: pd.DataFrame) -> pd.DataFrame:
    """Per batch size: the median step with and without the grammar, the engine's mask time, and the mask's
    share of the constrained step; only steps where the whole batch ran count. The ratio with / without is the
    median over rounds of each round's ratio of median steps, its interval the rounds' span
    (`lab.stats.intervals.spread`: the machine drifts between runs more than one run's steps vary); it is
    distinguishable from 1 only when every round falls on one side. One round's bootstrap interval over its
    steps is shown beside it. The mask's share gets the rounds' span too."""
    from lab.stats.intervals import spread as run_spread
    from lab.machine.timing import ratio_interval

    rows = []
    for batch, g in steps.groupby("batch"):
        full = g[g["running"] == batch]
        on, off = full[full["grammar"]], full[~full["grammar"]]
        rounds = sorted(full["round"].unique())
        ratio = run_spread([on[on["round"] == r]["step_s"].median() / off[off["round"] == r]["step_s"].median()
                            for r in rounds])
        share = run_spread([(on[on["round"] == r]["mask_s"] / on[on["round"] == r]["step_s"]).median()
                            for r in rounds])
        (ratio_lo, ratio_hi), (share_lo, share_hi) = ratio.interval, share.interval
        first_on, first_off = on[on["round"] == rounds[0]], off[off["round"] == rounds[0]]
        _, step_lo, step_hi = ratio_interval(list(first_on["step_s"]), list(first_off["step_s"]))
        rows.append({"batch": batch, "rounds": len(rounds), "steps timed": len(on),
                     "step without grammar ms": 1e3 * off["step_s"].median(),
                     "step with grammar ms": 1e3 * on["step_s"].median(), "with / without": ratio.median,
                     "ratio runs low": ratio_lo, "ratio runs high": ratio_hi,
                     "ratio one run's steps low": step_lo, "ratio one run's steps high": step_hi,
                     "mask ms per step": 1e3 * on["mask_s"].median(),
                     "mask ms per row": 1e3 * on["mask_s"].median() / batch,
                     "mask share of step": share.median, "share runs low": share_lo, "share runs high": share_hi,
                     "distinguishable": bool(ratio_lo > 1 or ratio_hi < 1)})
    return pd.DataFrame(rows)


def mask_components(p: StructuredParams, grammars, outputs: list[list[int]], vocab: int,
                    device: torch.device) -> pd.DataFrame:
    """Each constrained output replayed through a new matcher: per position, the fill and apply times and the
    allowed tokens; at NAIVE_POSITIONS positions, the naive mask (NAIVE_SAMPLE tokens tried one by one with
    accept and rollback), scaled to the vocabulary, and whether it agrees with xgrammar's mask on the sample.
    The mask is applied to logits on `device`, where the engine applies it (its copy there included)."""
    compiled = grammars.compile(StructuredOutputsParams(json=list_schema(p.LIST_ITEMS)), any_whitespace=False)
    rng = np.random.default_rng(0)
    total = sum(len(o) for o in outputs)
    naive_at = set(np.linspace(0, max(total - 1, 0), min(p.NAIVE_POSITIONS, total)).astype(int).tolist())
    logits = torch.zeros(1, vocab, device=device)
    rows, k = [], 0
    for out in tqdm(outputs, desc="mask components: outputs"):
        state = GrammarState(compiled, vocab)
        for token in out:
            if state.matcher.is_terminated():
                break
            t0 = time.perf_counter()
            state.words()  # fills row 0 with this state's mask
            t1 = time.perf_counter()
            apply_bitmask(logits, state.bitmask[:1])
            sync()  # the apply's time, not its launch's
            t2 = time.perf_counter()
            row = {"fill_s": t1 - t0, "apply_s": t2 - t1, "allowed": int(state.allowed().sum())}
            if k in naive_at:
                row.update(_naive(state, rng, p.NAIVE_SAMPLE, vocab))
            rows.append(row)
            k += 1
            state.accept(token)
    return pd.DataFrame(rows)


def _naive(state: GrammarState, rng, sample: int, vocab: int) -> dict:
    """The article's mask: every token tried against the grammar (here `sample` of them, scaled to `vocab`)."""
    tokens = rng.choice(vocab, size=min(sample, vocab), replace=False)
    bits = state.allowed()
    agree = 0
    start = time.perf_counter()
    for t in tokens.tolist():
        ok = state.matcher.accept_token(t)
        if ok:
            state.matcher.rollback(1)
        agree += ok == bool(bits[t])
    seconds = time.perf_counter() - start
    return {"naive_s": seconds * vocab / len(tokens), "naive_agrees": agree == len(tokens)}


# ---- (b) compile times ---------------------------------------------------------------------------------------
def compile_times(p: StructuredParams, tok, vocab: int, stop_ids) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(each grammar of `grammar_suite` cold and cached, plus the tokenizer info built once per model;
    compile and fill time against nesting depth). Medians after a warm-up call (`lab.machine.timing.median_seconds`):
    a cold compile bypasses the cache, so its warm-up leaves it cold; the cached one's fills the cache."""
    import xgrammar as xgr

    from lab.engine.grammar import Grammars

    info_s = median_seconds(lambda: xgr.TokenizerInfo.from_huggingface(
        tok, vocab_size=vocab, stop_token_ids=sorted(stop_ids)), p.COMPILE_REPEATS)
    g = Grammars(tok, vocab, list(stop_ids))
    rows = [{"grammar": "tokenizer info (once per model)", "cold ms": 1e3 * info_s, "cached ms": float("nan")}]
    for name, spec in tqdm(grammar_suite(p.LIST_ITEMS).items(), desc="compile: grammars"):
        cold = median_seconds(lambda: g.compile_uncached(spec, any_whitespace=False), p.COMPILE_REPEATS)
        cached = median_seconds(lambda: g.compile(spec, any_whitespace=False), p.COMPILE_REPEATS)
        rows.append({"grammar": name, "cold ms": 1e3 * cold, "cached ms": 1e3 * cached})
    depth_rows = []
    for depth in tqdm(p.NESTING_DEPTHS, desc="compile: nesting depth"):
        spec = StructuredOutputsParams(json=nested_schema(depth))
        cold = median_seconds(lambda: g.compile_uncached(spec, any_whitespace=False), p.COMPILE_REPEATS)
        fills = _walk_fills(g.compile(spec, any_whitespace=False), tok, nested_instance(depth), vocab)
        depth_rows.append({"depth": depth, "compile ms": 1e3 * cold, "fill us median": 1e6 * np.median(fills),
                           "fill us max": 1e6 * np.max(fills), "tokens walked": len(fills)})
    return pd.DataFrame(rows), pd.DataFrame(depth_rows)


def _walk_fills(compiled, tok, instance: dict, vocab: int) -> list[float]:
    """Fill times along a valid instance, tokenized as the model would write it (compact)."""
    import json

    state, fills = GrammarState(compiled, vocab), []
    for t in tok.encode(json.dumps(instance, separators=(", ", ": ")), add_special_tokens=False):
        start = time.perf_counter()
        state.words()  # fills row 0 with this state's mask
        fills.append(time.perf_counter() - start)
        if not state.accept(t):
            raise RuntimeError(f"the nested instance's token {t} is refused by its own schema")
    return fills


# ---- (c) validity and field accuracy ---------------------------------------------------------------------------
def _engine(model, tok, n: int, jump_forward: bool = False) -> LLM:
    return LLM(model, tokenizer=tok, max_num_seqs=min(n, 32), max_model_len=512,
               structured_outputs=StructuredOutputsConfig(jump_forward=jump_forward))


def extraction(p: StructuredParams, model, tok) -> pd.DataFrame:
    """Every item with and without the grammar, greedy and at TEMPERATURE (seed = item index): one row per
    output with its text, tokens, finish reason and scores (`structured_output_task.score`), and the batch's wall time
    per item."""
    data, rows = task.items(p.ITEMS), []
    for temperature in tqdm((0.0, p.TEMPERATURE), desc="extraction: temperatures"):
        for constrained in (False, True):
            spec = StructuredOutputsParams(json=task.SCHEMA) if constrained else None
            params = [SamplingParams(temperature=temperature, seed=i, max_tokens=p.MAX_TOKENS, structured_outputs=spec)
                      for i in range(len(data))]
            llm = _engine(model, tok, len(data))
            llm.chat(data[0].prompt, SamplingParams(max_tokens=2, structured_outputs=spec))  # warm-up, untimed
            start = time.perf_counter()
            outs = llm.chat([it.prompt for it in data], params)
            seconds = time.perf_counter() - start
            for i, (it, out) in enumerate(zip(data, outs)):
                rows.append({"item": i, "temperature": temperature, "grammar": constrained, "text": out.text,
                             "tokens": len(out.token_ids), "token_ids": list(out.token_ids), "finish_reason": out.finish_reason,
                             "batch_s_per_item": seconds / len(data), **task.score(it, out.text)})
            llm.close()
    return pd.DataFrame(rows)


# ---- (d) jump-forward ------------------------------------------------------------------------------------------
def jump_forward(p: StructuredParams, model, tok) -> pd.DataFrame:
    """The first JUMP_ITEMS items, greedy and constrained, one at a time (batch 1), jump-forward off and on: engine
    steps, wall time, tokens appended without sampling, and whether the outputs are equal."""
    data, rows = task.items(p.ITEMS)[:p.JUMP_ITEMS], []
    engines = {on: _engine(model, tok, 1, jump_forward=on) for on in (False, True)}
    params = SamplingParams(temperature=0, max_tokens=p.MAX_TOKENS,
                            structured_outputs=StructuredOutputsParams(json=task.SCHEMA))
    for name in engines:  # warm-up: the first request compiles the grammar
        engines[name].chat(data[0].prompt, params)
    for i, it in enumerate(tqdm(data, desc="jump-forward: items")):
        out = {}
        for on, llm in engines.items():
            steps, forced = llm.num_steps, llm.stats().get("structured_jump_forward_tokens", 0)
            start = time.perf_counter()
            out[on] = llm.chat(it.prompt, params)[0]
            rows.append({"item": i, "jump_forward": on, "seconds": time.perf_counter() - start,
                         "steps": llm.num_steps - steps, "tokens": len(out[on].token_ids),
                         "forced_tokens": llm.stats().get("structured_jump_forward_tokens", 0) - forced})
        rows[-1]["equal_to_off"] = rows[-2]["equal_to_off"] = out[True].token_ids == out[False].token_ids
    for llm in engines.values():
        llm.close()
    return pd.DataFrame(rows)


def string_jump_bound(grammars, outputs: list[list[int]], vocab: int) -> dict:
    """Over the constrained outputs: the tokens that lie wholly inside the string the grammar forces where they
    are written (xgrammar's `find_jump_forward_string`): what a string-level jump-forward, which appends the
    forced text and retokenizes it (SGLang's), could skip at most, against the token-level forcing above."""
    decoded = grammars.info.decoded_vocab
    compiled = grammars.compile(StructuredOutputsParams(json=task.SCHEMA), any_whitespace=False)
    covered = total = 0
    for out in outputs:
        state, i = GrammarState(compiled, vocab), 0
        while i < len(out) and not state.matcher.is_terminated():
            forced, j, text = state.matcher.find_jump_forward_string().encode(), i, b""
            while forced and j < len(out) and forced.startswith(text + decoded[out[j]]):
                text += decoded[out[j]]
                j += 1
            covered += j - i
            for t in out[i:max(j, i + 1)]:
                state.accept(t)
            i = max(j, i + 1)
        total += len(out)
    return {"tokens": total, "inside forced strings": covered, "share": covered / total if total else float("nan")}
