"""Speculative decoding acceptance by task (notebook 05): a, mean accepted tokens per step, c, and the
predicted against the measured speedup, per drafter and task category.

Every run is at batch 1 (one request at a time, Spec-Bench's setting), greedy, on the lab engine, and every
speculative run is checked to give the plain run's tokens. Per category:

- a: the conditional acceptance (accepted positions / verified positions), pooled over the category's rounds;
  vLLM's accepted / drafted beside it, labelled, because it is not a;
- mean accepted tokens per step (Spec-Bench's metric, the bonus or replacement token included);
- c: the drafter's wall time per drafted token over the plain run's time per token (c_effective: what the
  run paid, catch-up prefill of the draft's own cache included), and one draft forward over one target forward
  at the same context (c_forward, timed by `lab.speculative.measure`);
- the article's predicted speedup E / (k c + 1), the same with the measured verification cost v(k) in place of
  its "1", both applied to the run's actual rounds (`lab.speculative.theory.predicted_run_speedup`), and the measured
  wall-clock speedup: plain decode time over speculative decode time for the same prompts in the same run.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import ClassVar

import pandas as pd
from tqdm.auto import tqdm

from lab.engine import LLM, SamplingParams
from lab.quant.calibration import SPEC_BENCH_PATH, chat_token_ids
from lab.workflow.run import as_tuple, check_choice, check_device, check_model, ModelRefused, check_dtype, check_range, resolve_device
from lab.speculative.drafters import layer_skip_model, quantized_copy
from lab.speculative.measure import StepCosts, step_costs
from lab.speculative.prompts import TaskPrompt, load_prompts
from lab.speculative.speculator import DRAFTERS, SpeculativeConfig, SpecStats
from lab.speculative.theory import best_k, expected_tokens_by_position, expected_tokens_per_round, predicted_run_speedup
from lab.studies.spec_acceptance.intervals import beside, error_columns, interval_columns

STUDY_DRAFTERS = tuple(d for d in DRAFTERS if d != "model")
MAX_MODEL_LEN = 4096
PROMPT_MODEL = "smollm2-135m"  # whose tokenizer renders the prompts (a random: target has none of its own)


def target_config(model: str):
    """The target's config, read before any weight loads (`lab.models.loader.describe_model`: the embedded SmolLM2,
    a `random:<preset>` shape, a checkpoint directory or a .gguf; the weights load later, `load_target`)."""
    from lab.models.loader import describe_model

    return describe_model(model).config


@dataclass
class SpecParams:
    PRESET: str = "quick"
    INTERACTIVE: bool = False
    DEVICE: str = "auto"  # auto: CUDA when present, else the CPU
    MODEL: str = PROMPT_MODEL  # the target: SmolLM2, random weights of a preset shape ("random:llama-3-8b") or a dir
    DATA: str = ""  # "": the lab's prompt set (calibration_data/spec_prompts.jsonl); else a JSONL path
    PER_CATEGORY: int = 5
    MAX_TOKENS: int = 64
    DRAFTERS: tuple = ("ngram", "layerskip", "quantized")
    K: int = 4  # drafts per round (the article's draft_len)
    K_SWEEP: tuple = (1, 2, 4, 8)
    SWEEP_DRAFTERS: tuple = ("ngram", "quantized")
    SWEEP_PER_CATEGORY: int = 2
    DRAFT_LAYERS: int = 0  # layerskip: the first N of the target's layers; 0: a third of them (SmolLM2: 10 of 30)
    DRAFT_QUANT: str = "rtn"  # quantized: lab.quant method of the copy (rtn, gptq, awq)
    DRAFT_BITS: int = 4
    THRESHOLD: float = 0.55  # the article's acceptance_threshold
    # Spec-Bench questions a category when its file is present (0: skip). The ledger reads its translation and
    # summarization rows only, "not checkable here" on this CPU and model whatever their size; 10 widens each
    # interval by about 1.4x over 20 (docs/studies/05_speculative_acceptance.md, "How the reference is sized")
    SPEC_BENCH_PER_CATEGORY: int = 10
    SPEC_BENCH_DRAFTERS: tuple = ("ngram", "quantized")
    REPEATS: int = 5  # timing repeats of the step-cost forwards
    DTYPE: str = "auto"  # the target's: the serving dtype, as a deployment would run it
    # quick: fewer prompts a category, shorter outputs, k = 1 and 4 only, Spec-Bench with the n-gram drafter only
    # (a minute and a half, within `make run`'s budget); smoke: the tests' seconds.
    PRESETS: ClassVar[dict] = {
        "quick": {"PER_CATEGORY": 2, "MAX_TOKENS": 32, "K_SWEEP": (1, 4), "SWEEP_PER_CATEGORY": 1,
                  "SPEC_BENCH_PER_CATEGORY": 1, "SPEC_BENCH_DRAFTERS": ("ngram",), "REPEATS": 3},
        "smoke": {"PER_CATEGORY": 1, "MAX_TOKENS": 8, "K": 2, "K_SWEEP": (1, 2), "SWEEP_PER_CATEGORY": 1,
                  "SWEEP_DRAFTERS": ("ngram",), "SPEC_BENCH_DRAFTERS": ("ngram",), "SPEC_BENCH_PER_CATEGORY": 1,
                  "REPEATS": 1},
        # gpu: speculation where verification is truly memory-bound: a Llama-3-8B-shaped target (random weights)
        # in bfloat16, whose (k + 1)-token verification reads 16 GB of weights like a one-token step, against the
        # roofline of the device's measured ceilings. Random weights say nothing about acceptance by task: the
        # preset tests the cost side (c, v(k), predicted against measured speedup), with the drafters that cost
        # less than the target on a GPU (the quantized copy runs dequantized there, at the target's cost), and
        # without Spec-Bench's categories (acceptance by task again). One prompt a category, 16 tokens each; the
        # k sweep (1 to 8) on the n-gram drafter, whose rounds cost a verification alone: v(k) at 8B. ~21 s on one
        # H200: ~760 target steps or rounds at ~10.5 ms (6 ms Python, 4.5 ms of weights; layer-skip rounds ~16 ms),
        # ~210 timed forwards, probe 2 s, 8 s start.
        "gpu": {"MODEL": "random:llama-3-8b", "DTYPE": "bfloat16", "DRAFT_LAYERS": 4, "PER_CATEGORY": 1,
                "MAX_TOKENS": 16, "DRAFTERS": ("ngram", "layerskip"), "SWEEP_DRAFTERS": ("ngram",),
                "SWEEP_PER_CATEGORY": 1, "SPEC_BENCH_PER_CATEGORY": 0, "REPEATS": 5},
    }

    def __post_init__(self):
        check_device("DEVICE", self.DEVICE)
        check_dtype("DTYPE", self.DTYPE)
        # the target and its quantized drafter (a 4-bit copy) at once
        info = check_model("MODEL", self.MODEL, self.DEVICE, self.DTYPE, copies=1.5)
        target = info.config
        # A target without a tokenizer of its own (random weights, a weights-only directory) has its prompts
        # rendered by SmolLM2's (load_target): their ids must be in its vocabulary.
        if not info.tokenizer and target.vocab_size < target_config(PROMPT_MODEL).vocab_size:
            raise ModelRefused(f"parameter MODEL={self.MODEL!r} has no tokenizer, and its vocabulary "
                               f"({target.vocab_size}) is smaller than that of the tokenizer that would render "
                               f"its prompts ({PROMPT_MODEL}'s)")
        for name in ("DRAFTERS", "K_SWEEP", "SWEEP_DRAFTERS", "SPEC_BENCH_DRAFTERS"):
            setattr(self, name, as_tuple(name, getattr(self, name)))
        for name in ("DRAFTERS", "SWEEP_DRAFTERS", "SPEC_BENCH_DRAFTERS"):
            for d in getattr(self, name):
                check_choice(name, d, STUDY_DRAFTERS)
        check_range("PER_CATEGORY", self.PER_CATEGORY, 1, 1000, int)
        check_range("SWEEP_PER_CATEGORY", self.SWEEP_PER_CATEGORY, 1, 1000, int)
        check_range("SPEC_BENCH_PER_CATEGORY", self.SPEC_BENCH_PER_CATEGORY, 0, 1000, int)
        check_range("MAX_TOKENS", self.MAX_TOKENS, 2, 1024, int)
        check_range("K", self.K, 1, 32, int)
        for k in self.K_SWEEP:
            check_range("K_SWEEP", k, 1, 32, int)
        check_range("DRAFT_LAYERS", self.DRAFT_LAYERS, 0, target.num_hidden_layers - 1, int)
        if target.num_hidden_layers < 2:
            raise ModelRefused(f"parameter MODEL={self.MODEL!r} has one layer: the layer-skip drafter needs fewer "
                               f"layers than its target")
        self.DRAFT_LAYERS = self.DRAFT_LAYERS or max(1, round(target.num_hidden_layers / 3))
        check_choice("DRAFT_QUANT", self.DRAFT_QUANT, ("rtn", "gptq", "awq"))
        check_choice("DRAFT_BITS", self.DRAFT_BITS, (2, 3, 4, 8))
        check_range("THRESHOLD", self.THRESHOLD, 0.0, 1.0)
        check_range("REPEATS", self.REPEATS, 1, 100, int)


def load_target(p: SpecParams):
    """The target on DEVICE in DTYPE (weights prepacked where that pays, as `LLM` would) and the tokenizer that
    renders the prompts: its own, or SmolLM2's for a random target (its ids fit the target's vocabulary, checked
    in `__post_init__`, and the engine's text output skips ids the tokenizer lacks)."""
    from lab.models import load_model
    from lab.models.loader import load_tokenizer, resolve_model_dir

    model, tok = load_model(p.MODEL, dtype=p.DTYPE, device=resolve_device(p.DEVICE), prepack_weights=True)
    return model, tok or load_tokenizer(resolve_model_dir(PROMPT_MODEL))


def task_prompts(p: SpecParams, per_category: int | None = None) -> list[TaskPrompt]:
    return load_prompts(p.DATA or None, per_category or p.PER_CATEGORY)


def draft_models(p: SpecParams, model, tokenizer) -> dict:
    """The model drafters' models, built once for every engine of the study."""
    wanted = set(p.DRAFTERS) | set(p.SWEEP_DRAFTERS) | set(p.SPEC_BENCH_DRAFTERS)
    out = {}
    if "layerskip" in wanted:
        out["layerskip"] = layer_skip_model(model, p.DRAFT_LAYERS)
    if "quantized" in wanted:
        out["quantized"] = quantized_copy(model, tokenizer, p.DRAFT_QUANT, p.DRAFT_BITS)
    return out


def spec_config(drafter: str, k: int, p: SpecParams, drafts: dict, **policy) -> SpeculativeConfig:
    return SpeculativeConfig(k=k, method=drafter, draft_layers=p.DRAFT_LAYERS, draft_quant=p.DRAFT_QUANT,
                             draft_bits=p.DRAFT_BITS, draft_model=drafts.get(drafter), **policy)


def _engine(model, tokenizer, speculative=None) -> LLM:
    return LLM(model, tokenizer=tokenizer, num_kv_blocks=MAX_MODEL_LEN // 16 + 8, max_model_len=MAX_MODEL_LEN,
               max_num_seqs=1, speculative=speculative)


def _token_ids(tokenizer, prompts: list[TaskPrompt], max_tokens: int) -> tuple[list[list[int]], int]:
    """The prompts as the engine receives them, and the mean context of a decode step (where step costs are
    timed): mean prompt length plus half the output."""
    ids = [chat_token_ids(tokenizer, q.text) for q in prompts]
    return ids, int(sum(map(len, ids)) / len(ids) + max_tokens / 2)


def agreeing_share(outputs, reference) -> float:
    """The mean share of each output's tokens before it first differs from the reference run's (1.0: identical).
    In float32 speculative greedy decoding is lossless (tested); in bfloat16 a (k + 1)-row verification rounds
    differently from a one-row step, so a near-tie can flip and the greedy paths part from there on."""
    shares = []
    for out, ref in zip(outputs, reference):
        same = next((i for i, (x, y) in enumerate(zip(out, ref)) if x != y), min(len(out), len(ref)))
        shares.append(same / max(len(ref), 1))
    return sum(shares) / max(len(shares), 1)


def run_requests(llm: LLM, prompts: list[TaskPrompt], ids: list[list[int]], max_tokens: int) -> pd.DataFrame:
    """Each prompt alone (batch 1), greedy: one row a request with its decode time and speculation record."""
    rows = []
    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    for prompt, tokens in zip(prompts, ids):
        llm.reset_prefix_cache()  # no request is helped by an earlier one's prompt
        spec = llm.extensions.get("speculative")
        drafted_s, forwards = (spec.draft_seconds, spec.drafter.stats().get("forwards", 0)) if spec else (0.0, 0)
        out = llm.generate([tokens], params)[0]
        m, s = out.metrics, out.metrics.speculation
        rows.append({"id": prompt.id, "category": prompt.category, "prompt_tokens": len(tokens),
                     "output": out.token_ids, "decode_tokens": len(out.token_ids) - 1,
                     "decode_s": m.finish_time - m.first_token_time,
                     "draft_s": spec.draft_seconds - drafted_s if spec else 0.0,
                     "draft_forwards": spec.drafter.stats().get("forwards", 0) - forwards if spec else 0,
                     "drafted_per_round": s.drafted_per_round if s else [],
                     "accepted_per_round": s.accepted_per_round if s else []})
    return pd.DataFrame(rows)


def pooled(rows: pd.DataFrame) -> SpecStats:
    """One SpecStats over the rounds of several requests."""
    stats = SpecStats()
    for drafted, accepted in zip(rows["drafted_per_round"], rows["accepted_per_round"]):
        for d, a in zip(drafted, accepted):
            stats.record(d, a)
    return stats


def summarize(drafter: str, k: int, spec: pd.DataFrame, plain: pd.DataFrame, costs: StepCosts) -> pd.DataFrame:
    """Per category (and 'all'): acceptance metrics, c, three predictions and the measured speedup.

    The unit of cost is the plain run's time per token (its TPOT). Predictions: the article's (E(a, d) tokens
    for d c + 1 steps a round); with measured costs (a verification of d drafts costs its measured forward plus
    the engine's fixed per-step work, which is the plain TPOT less a one-token forward); and the same with
    E from the measured acceptance at each draft position instead of one a (`expected_tokens_by_position`).
    Each measured figure has its 95% interval over the category's prompts (`<metric>_low`, `<metric>_high`;
    `lab.studies.spec_acceptance.intervals`), and each comparison its word (speedup against 1, prediction
    against measurement within 10%)."""
    rows = []
    groups = [(cat, spec.index[spec["category"] == cat]) for cat in dict.fromkeys(spec["category"])]
    for cat, idx in groups + [("all", spec.index)]:
        s, base = spec.loc[idx], plain.loc[idx]
        st = pooled(s)
        a, rates = st.conditional_acceptance, st.acceptance_by_position
        tokens = int(s["decode_tokens"].sum())
        plain_steps = tokens - (st.accepted + st.rounds)  # decode steps without drafts (no match, paused)
        plain_tpot = base["decode_s"].sum() / tokens
        overhead = max(plain_tpot - costs.target_step_s, 0.0)  # scheduling, sampling: paid by every step

        def verify(d, tpot=plain_tpot, overhead=overhead):
            return 1.0 if d == 0 else (costs.verify_s[d] + overhead) / tpot

        c_eff = s["draft_s"].sum() / max(st.drafted, 1) / plain_tpot
        measured = base["decode_s"].sum() / s["decode_s"].sum()
        if st.rounds:
            article = predicted_run_speedup(st.drafted_per_round, plain_steps, c_eff,
                                            lambda d, a=a: expected_tokens_per_round(a, d))
            with_v = predicted_run_speedup(st.drafted_per_round, plain_steps, c_eff,
                                           lambda d, a=a: expected_tokens_per_round(a, d), verify)
            by_pos = predicted_run_speedup(st.drafted_per_round, plain_steps, c_eff,
                                           lambda d, r=rates: expected_tokens_by_position(r, d), verify)
        else:
            article = with_v = by_pos = 1.0
        rows.append({
            "drafter": drafter, "k": k, "category": cat, "requests": len(s), "decode_tokens": tokens,
            "lossless": bool((s["output"].apply(tuple) == base["output"].apply(tuple)).all()),
            "identical_outputs": float((s["output"].apply(tuple) == base["output"].apply(tuple)).mean()),
            "agreeing_tokens": agreeing_share(s["output"], base["output"]),
            "rounds": st.rounds, "plain_steps": plain_steps, "a": a,
            "accepted/drafted (vLLM)": st.accepted / st.drafted if st.drafted else float("nan"),
            "mean_accepted_tokens_per_step": st.mean_accepted_tokens_per_step,
            "E[tokens] at k (formula)": expected_tokens_per_round(a, k) if st.rounds else float("nan"),
            "mean_drafts_per_round": st.drafted / st.rounds if st.rounds else 0.0,
            "c_effective": c_eff, "c_forward": costs.c if costs.c is not None else float("nan"),
            "v(k)": verify(k), "predicted_article": article, "predicted_measured_costs": with_v,
            "predicted_by_position": by_pos, "measured_speedup": measured,
            "error_article": article / measured - 1, "error_measured_costs": with_v / measured - 1,
            "error_by_position": by_pos / measured - 1, "acceptance_by_position": [round(x, 4) for x in rates],
            **interval_columns(s, base),
        })
        for name in ("article", "measured_costs", "by_position"):
            rows[-1] |= error_columns(rows[-1], name)
    return beside(pd.DataFrame(rows))


def study(p: SpecParams, model, tokenizer, prompts: list[TaskPrompt], drafters, k: int, drafts: dict,
          log=print) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, StepCosts]]:
    """Plain, then each drafter, over `prompts`: (per-category table, per-request table, step costs)."""
    ids, context = _token_ids(tokenizer, prompts, p.MAX_TOKENS)
    plain_llm = _engine(model, tokenizer)
    t = time.perf_counter()
    plain = run_requests(plain_llm, prompts, ids, p.MAX_TOKENS)
    log(f"plain: {len(prompts)} requests in {time.perf_counter() - t:.1f} s")
    tables, requests, costs = [], [plain.assign(drafter="plain", k=0)], {}
    for drafter in tqdm(drafters, desc=f"drafters, k={k}"):
        llm = _engine(model, tokenizer, spec_config(drafter, k, p, drafts))
        t = time.perf_counter()
        spec = run_requests(llm, prompts, ids, p.MAX_TOKENS)
        costs[drafter] = step_costs(llm, context, range(1, k + 1), p.REPEATS)
        tables.append(summarize(drafter, k, spec, plain, costs[drafter]))
        requests.append(spec.assign(drafter=drafter, k=k))
        log(f"{drafter} k={k}: {time.perf_counter() - t:.1f} s")
    return pd.concat(tables, ignore_index=True), pd.concat(requests, ignore_index=True), costs


def k_sweep(p: SpecParams, model, tokenizer, drafts: dict, log=print) -> pd.DataFrame:
    """Measured and predicted speedup against k, per drafter and category (fewer prompts than the main run)."""
    prompts = task_prompts(p, p.SWEEP_PER_CATEGORY)
    ids, context = _token_ids(tokenizer, prompts, p.MAX_TOKENS)
    plain = run_requests(_engine(model, tokenizer), prompts, ids, p.MAX_TOKENS)
    tables = []
    for drafter, k in tqdm([(d, k) for d in p.SWEEP_DRAFTERS for k in p.K_SWEEP], desc="k sweep"):
        llm = _engine(model, tokenizer, spec_config(drafter, k, p, drafts))
        spec = run_requests(llm, prompts, ids, p.MAX_TOKENS)
        tables.append(summarize(drafter, k, spec, plain, step_costs(llm, context, range(1, k + 1), p.REPEATS)))
        log(f"sweep {drafter} k={k} done")
    return pd.concat(tables, ignore_index=True)


def best_k_table(sweep: pd.DataFrame, main: pd.DataFrame, max_k: int) -> pd.DataFrame:
    """Per drafter and category: the k with the best measured speedup in the sweep, and the k the model picks
    from the main run's a and c (with the article's v = 1, and with v(k) measured as a line through the
    measured points)."""
    rows = []
    for (drafter, cat), g in sweep[sweep["category"] != "all"].groupby(["drafter", "category"], sort=False):
        m = main[(main["drafter"] == drafter) & (main["category"] == cat)]
        if m.empty:
            continue
        a, c = float(m["a"].iloc[0]), float(m["c_effective"].iloc[0])
        v = _verify_line(g)
        best = g.loc[g["measured_speedup"].idxmax()]
        rows.append({"drafter": drafter, "category": cat, "a": a, "c_effective": c,
                     "best_k_measured": int(best["k"]), "speedup_at_best_k": best["measured_speedup"],
                     "best_k_article (v=1)": best_k(a, c, max_k) if a == a else 0,
                     "best_k_measured_costs": best_k(a, c, max_k, v) if a == a else 0})
    return pd.DataFrame(rows)


def _verify_line(g: pd.DataFrame):
    """v(k) as a line through the sweep's measured (k, v(k)) points (v(0) = 1)."""
    ks, vs = g["k"].to_numpy(float), g["v(k)"].to_numpy(float)
    if len(ks) < 2:
        return lambda k: 1.0 if k == 0 else float(vs[0])
    slope = float(((ks - ks.mean()) * (vs - vs.mean())).sum() / ((ks - ks.mean()) ** 2).sum())
    icept = float(vs.mean() - slope * ks.mean())
    return lambda k: 1.0 if k == 0 else icept + slope * k


def policy_table(main: pd.DataFrame, threshold: float) -> pd.DataFrame:
    """The article's per-category switch: speculate where the measured a reaches the threshold. "switch right"
    compares with the measured speedup's point value; `speedup_vs_plain` says whether its interval excludes 1."""
    t = main[main["category"] != "all"][["drafter", "category", "a", "a_low", "a_high", "measured_speedup",
                                         "measured_speedup_low", "measured_speedup_high", "speedup_vs_plain"]].copy()
    t["speculate (a >= threshold)"] = t["a"] >= threshold
    t["speedup with the switch"] = t["measured_speedup"].where(t["speculate (a >= threshold)"], 1.0)
    t["switch right"] = t["speculate (a >= threshold)"] == (t["measured_speedup"] > 1)
    return t


def adaptive_policy(p: SpecParams, model, tokenizer, prompts: list[TaskPrompt], drafter: str, drafts: dict,
                    plain: pd.DataFrame) -> pd.DataFrame:
    """The per-request adaptive switch (lab.speculative.speculator's min_acceptance) on one drafter."""
    ids, context = _token_ids(tokenizer, prompts, p.MAX_TOKENS)
    cfg = spec_config(drafter, p.K, p, drafts, min_acceptance=p.THRESHOLD, probe_rounds=4, backoff_tokens=16)
    llm = _engine(model, tokenizer, cfg)
    spec = run_requests(llm, prompts, ids, p.MAX_TOKENS)
    table = summarize(f"{drafter} + adaptive switch", p.K, spec, plain.reset_index(drop=True),
                      step_costs(llm, context, range(1, p.K + 1), p.REPEATS))
    return table.assign(pauses=llm.stats()["spec_policy_pauses"])


def spec_bench_available(p: SpecParams) -> bool:
    return p.SPEC_BENCH_PER_CATEGORY > 0 and SPEC_BENCH_PATH.is_file()


def spec_bench(p: SpecParams, model, tokenizer, drafts: dict, log=print):
    prompts = load_prompts(SPEC_BENCH_PATH, p.SPEC_BENCH_PER_CATEGORY)
    return study(replace(p, DATA=str(SPEC_BENCH_PATH)), model, tokenizer, prompts, p.SPEC_BENCH_DRAFTERS, p.K,
                 drafts, log)
