"""Accuracy harness of the weight-quantization study: perplexity, logit agreement and the sensitive set.

Why more than perplexity: perplexity averages the log-loss over every token, and most tokens are easy, so
low-bit models keep a near-unchanged perplexity while exact arithmetic, runnable code, rare names and
long-context retrieval break (Jin et al., 2024, arXiv:2402.16775; Li et al., 2024, arXiv:2402.18158). The
deployment article 003, section 2.2, draws the same conclusion: check task metrics and a set of sensitive
samples, not perplexity alone. So this module reports three things side by side:

- perplexity on held-out text (`heldout_texts`; `long_text` for one long sequence), the cheap and familiar
  number;
- the per-token KL(reference || quantized) and top-1 agreement against the unquantized model, which see
  distribution shifts that perplexity averages away (the KL metric of Dettmers et al.'s and llama.cpp's
  quantization reports); both scored per sequence by `lab.eval.scores`;
- `run_sensitive` over `lab.eval.sensitive` items with greedy decoding through the lab engine, with
  `pass_rates` per category, `flips` (outputs changed, items lost and gained against the reference) and
  `bad_cases`: items the reference passes and the quantized model fails.

`evaluate` bundles them into a JSON-serialisable dict (`lab eval --json`); `evaluate_model` into one flat row of
metrics against a reference, the row the quantization studies tabulate per model or KV format.

Held-out text and the calibration set. `lab.quant.calibration` draws its "code" documents from the first
`STDLIB_FILES` standard-library files in order of `sha256(relative path)`; `heldout_texts(source="stdlib")`
takes only files *after* that cut in the same order, so no held-out file can be in any calibration set,
whatever its seed or mix (the short_qa mix uses no stdlib files at all). The calibration "docs" pool holds
every `pydoc_data.topics` entry, so `source="docs"` needs the calibration `datasets.Dataset` actually used
and keeps only topics whose source label does not occur in it. `source="readme"` is prose: the READMEs of
the installed Python distributions, which no calibration set reads.

Uncertainty: `evaluate_model` scores per sequence (`lab.eval.scores`) and reports perplexity, KL and top-1
with 95% bootstrap intervals over sequences, and the sensitive pass rate with its Wilson interval.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from lab.eval.sensitive import CATEGORIES, Item, build_prompt, check, load_items
from lab.eval.scores import ReferenceLogProbs, SequenceScores, perplexity, score_sequences
from lab.stats.intervals import proportion

if TYPE_CHECKING:  # pandas is imported where a table is built, not on every import of the harness
    import pandas as pd

# ---- held-out text ------------------------------------------------------------------------------------


def heldout_stdlib_files() -> list[tuple[str, str]]:
    """Standard-library files the calibration builder never reads: those ranked at or after STDLIB_FILES in
    its path-hash order (`lab.quant.calibration.stdlib_files`)."""
    from lab.quant.calibration import STDLIB_FILES, stdlib_files, stdlib_root

    return [(f"stdlib:{rel}", str(stdlib_root() / rel)) for rel in stdlib_files()[STDLIB_FILES:]]


def _heldout_docs(calibration) -> list[tuple[str, str]]:
    from pydoc_data.topics import topics

    if calibration is None:
        raise ValueError("source='docs' needs the calibration dataset, to exclude the topics it used")
    used = set(calibration["source"])
    return [(label, topics[key]) for key in sorted(topics)
            if (label := f"pydoc_data.topics[{key!r}]") not in used]


def _required_distributions(root: str = "inference-lab") -> list:
    """The installed distributions `root` requires, directly or through the others it requires (extras and other
    platforms' requirements left out): what a plain install of the lab brings, whatever else the environment holds."""
    from importlib.metadata import PackageNotFoundError, distribution

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    found, todo = {}, [root]
    while todo:
        name = todo.pop()
        if (key := canonicalize_name(name)) in found:
            continue
        try:
            found[key] = dist = distribution(name)
        except PackageNotFoundError:
            if name == root:
                raise ValueError(f"{root!r} is not installed as a distribution (`make setup` installs it): the prose "
                                 f"held-out set is read from the READMEs of what it requires") from None
            found[key] = None  # an optional requirement this environment lacks
            continue
        todo += [r.name for r in map(Requirement, dist.requires or [])
                 if r.marker is None or r.marker.evaluate({"extra": ""})]
    del found[canonicalize_name(root)]
    return [d for d in found.values() if d is not None]


def _readme_docs() -> list[tuple[str, str]]:
    """The long descriptions (READMEs) of the Python distributions the lab requires (`_required_distributions`),
    its own left out: English prose with some markup and code, read from package metadata. No calibration set reads
    them. Only the lab's requirements, so that a tool installed beside it (a profiler, the browser tests'
    Playwright) does not change which documents are drawn: reading every installed distribution, the prose set of
    notebook 02's reference run changed between two runs of one commit on 6 December."""
    docs = {}
    for dist in _required_distributions():
        meta = dist.metadata
        docs.setdefault(f"readme:{meta['Name']}=={meta['Version']}", meta.get_payload() or meta.get("Description") or "")
    return sorted(docs.items())


SOURCES = ("stdlib", "docs", "readme")


def heldout_texts(tokenizer, n: int = 8, max_tokens: int = 256, seed: int = 0, source: str = "stdlib",
                  calibration=None, min_tokens: int = 32, return_sources: bool = False):
    """`n` token-id sequences of up to `max_tokens` tokens of local text disjoint from the calibration set.

    Documents are drawn in a seeded order; each contributes one piece starting at a seeded offset.
    Documents shorter than `min_tokens` are skipped. With `return_sources`, returns (sequences, labels).
    """
    if source == "stdlib":
        docs = heldout_stdlib_files()
    elif source == "docs":
        docs = _heldout_docs(calibration)
    elif source == "readme":
        docs = _readme_docs()
    else:
        raise ValueError(f"source must be one of {SOURCES}, not {source!r}")
    rng = random.Random(seed)
    rng.shuffle(docs)
    seqs, labels = [], []
    for label, text in docs:
        if len(seqs) == n:
            break
        if source == "stdlib":
            text = Path(text).read_text(encoding="utf-8", errors="replace")
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        if len(ids) < min_tokens:
            continue
        start = rng.randint(0, max(len(ids) - max_tokens, 0))
        seqs.append(ids[start:start + max_tokens])
        labels.append(label)
    if len(seqs) < n:
        raise ValueError(f"only {len(seqs)} held-out documents of >= {min_tokens} tokens in source {source!r}")
    return (seqs, labels) if return_sources else seqs


@dataclass
class LongText:
    ids: list[int]
    sources: list[str]


def long_text(tokenizer, n_tokens: int, seed: int = 0) -> LongText:
    """`n_tokens` of held-out standard-library source (files no calibration set reads), whole files joined
    in a seeded order until the length is reached; refuses if the held-out files are too few."""
    files = heldout_stdlib_files()
    random.Random(seed).shuffle(files)
    ids, sources = [], []
    for label, path in files:
        if len(ids) >= n_tokens:
            break
        with open(path, encoding="utf-8", errors="replace") as f:
            ids += tokenizer(f.read(), add_special_tokens=False)["input_ids"]
        sources.append(label)
    if len(ids) < n_tokens:
        raise ValueError(f"held-out text has only {len(ids)} tokens, fewer than n_tokens={n_tokens}")
    return LongText(ids[:n_tokens], sources)


# ---- sensitive set ------------------------------------------------------------------------------------


def engine_for(model, tokenizer, prompts: list[str], max_tokens: int, engine_kwargs: dict | None = None):
    """An `LLM` whose KV pool holds every prompt plus `max_tokens` at once, unless `engine_kwargs` sets
    `num_kv_blocks`/`max_model_len` (the memory-based default would reserve gigabytes on CPU)."""
    from lab.engine import LLM

    kwargs = dict(engine_kwargs or {})
    lengths = [len(tokenizer.encode(p, add_special_tokens=False)) + max_tokens for p in prompts]
    block = kwargs.setdefault("block_size", 16)
    kwargs.setdefault("max_model_len", max(lengths, default=max_tokens))
    kwargs.setdefault("num_kv_blocks", sum(-(-n // block) for n in lengths) + 1)
    return LLM(model, tokenizer=tokenizer, **kwargs)


def greedy_token_ids(model, tokenizer, prompts: list[str], max_tokens: int) -> list[list[int]]:
    """The greedy output token ids of each prompt through the lab engine (sized as by `engine_for`)."""
    from lab.engine import SamplingParams

    llm = engine_for(model, tokenizer, prompts, max_tokens)
    return [o.token_ids for o in llm.generate(prompts, SamplingParams(temperature=0, max_tokens=max_tokens))]


def common_prefix(a: list[int], b: list[int]) -> int:
    """How many leading tokens two outputs share: where a changed output first departs from the reference."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def run_sensitive(model, tokenizer, items: list[Item], max_tokens: int = 64, engine_kwargs: dict | None = None):
    """Greedy outputs of `model` on `items` through the lab engine, checked: a DataFrame with one row per
    item (category, id, passed, reason, output, n_output_tokens, finish_reason); the engine as `engine_for`."""
    import pandas as pd

    from lab.engine import SamplingParams

    prompts = [build_prompt(item, tokenizer) for item in items]
    llm = engine_for(model, tokenizer, prompts, max_tokens, engine_kwargs)
    outputs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=max_tokens))
    rows = []
    for item, out in zip(items, outputs):
        passed, reason = check(item, out.text)
        rows.append({"category": item.category, "id": item.id, "passed": bool(passed), "reason": reason,
                     "output": out.text, "n_output_tokens": len(out.token_ids),
                     "finish_reason": out.finish_reason})
    return pd.DataFrame(rows, columns=["category", "id", "passed", "reason", "output", "n_output_tokens",
                                       "finish_reason"])


def pass_rates(df) -> dict:
    """{category: {"passed": k, "total": n, "rate": k / n}} plus "all"."""
    rates = {}
    for category, group in df.groupby("category", sort=True):
        k, n = int(group["passed"].sum()), len(group)
        rates[category] = {"passed": k, "total": n, "rate": k / n}
    k, n = int(df["passed"].sum()), len(df)
    rates["all"] = {"passed": k, "total": n, "rate": k / n if n else float("nan")}
    return rates


def bad_cases(ref_df, quant_df, k: int | None = 10):
    """Items that pass on the reference and fail on the quantized model, side by side: id, category,
    reference_output, quantized_output, reason (the quantized output's failed check), at most `k` rows."""
    import pandas as pd

    merged = ref_df.merge(quant_df, on=["id", "category"], suffixes=("_ref", "_quant"))
    bad = merged[merged["passed_ref"] & ~merged["passed_quant"]].sort_values(["category", "id"])
    bad = pd.DataFrame({"id": bad["id"], "category": bad["category"], "reference_output": bad["output_ref"],
                        "quantized_output": bad["output_quant"], "reason": bad["reason_quant"]})
    bad = bad.reset_index(drop=True)
    return bad if k is None else bad.head(k)


def flips(ref_df, quant_df) -> dict:
    """Per category (and "all"): how the quantized model's items moved against the reference's.

    same_output: share of items whose greedy output text is identical; lost: passed on the reference,
    failed quantized; gained: the reverse. A pass rate can hold still while items flip both ways, and a
    category the reference already fails (a 135M model's multi-digit arithmetic) shows quantization
    damage only here (Dutta et al., 2024, "Accuracy is Not All You Need", arXiv:2407.09141, count flips)."""
    merged = ref_df.merge(quant_df, on=["id", "category"], suffixes=("_ref", "_quant"))
    if len(merged) != len(ref_df) or len(merged) != len(quant_df):
        raise ValueError(f"the two runs cover different items ({len(ref_df)} and {len(quant_df)}, "
                         f"{len(merged)} in common)")

    def summary(g) -> dict:
        n = len(g)
        return {"total": n, "same_output": float((g["output_ref"] == g["output_quant"]).mean()) if n else float("nan"),
                "lost": int((g["passed_ref"] & ~g["passed_quant"]).sum()),
                "gained": int((~g["passed_ref"] & g["passed_quant"]).sum())}

    out = {category: summary(group) for category, group in merged.groupby("category", sort=True)}
    out["all"] = summary(merged)
    return out


# ---- everything ---------------------------------------------------------------------------------------


def _records(df) -> list[dict]:
    return [{k: (v.item() if hasattr(v, "item") else v) for k, v in row.items()}
            for row in df.to_dict(orient="records")]


def evaluate(model, tokenizer, suite: str = "all", reference=None, *, heldout: list[list[int]] | None = None,
             n_heldout: int = 8, heldout_tokens: int = 256, seed: int = 0, items: list[Item] | None = None,
             categories: tuple[str, ...] = CATEGORIES, max_tokens: int = 64, engine_kwargs: dict | None = None,
             k_bad: int = 10, kv=None) -> dict:
    """Run `suite` ("ppl", "sensitive" or "all") on `model`; with a `reference` model also the model's KL and
    top-1 agreement against it and the reference's perplexity (intervals over the held-out sequences), and the
    sensitive bad cases. Returns plain JSON-serialisable data.

    `kv`: (KVCacheFormat, KVScales or None[, roles]) runs `model` with its KV cache stored through that format
    (the contiguous fake-quant cache for perplexity and logits, the engine's paged quantized cache for the
    sensitive items); the reference, `model` itself by default, keeps an exact cache."""
    if suite not in ("ppl", "sensitive", "all"):
        raise ValueError(f"suite must be 'ppl', 'sensitive' or 'all', not {suite!r}")
    quant_engine = dict(engine_kwargs or {})
    if kv is not None:
        reference = model if reference is None else reference
        if suite != "ppl":
            if len(kv) > 2 and kv[2] != "kv":
                raise ValueError(f"roles={kv[2]!r}: the engine quantizes keys and values together; "
                                 f"K-only or V-only runs are for the ppl suite")
            quant_engine.update(kv_cache_dtype=kv[0], kv_scales=kv[1])
    result: dict = {"suite": suite}
    if suite in ("ppl", "all"):
        if heldout is None:
            heldout, sources = heldout_texts(tokenizer, n_heldout, heldout_tokens, seed, return_sources=True)
        else:
            sources = None
        ppl = {"n_tokens": sum(len(s) for s in heldout), "sources": sources}
        if reference is None:
            ppl.update(perplexity=perplexity(model, heldout, kv), n_sequences=len(heldout))
        else:  # intervals over the held-out sequences, as evaluate_model reports them; the reference's own
            # perplexity reads the forwards its KL and top-1 took (it ran twice a sequence before)
            kept = ReferenceLogProbs(reference)
            ppl.update(score_sequences(reference, model, heldout, kv, cache=kept).summary())
            ppl.update(score_sequences(reference, reference, heldout, cache=kept).perplexity()
                       .columns("reference_perplexity"))
        result["ppl"] = ppl
    if suite in ("sensitive", "all"):
        items = load_items(categories) if items is None else items
        df = run_sensitive(model, tokenizer, items, max_tokens, quant_engine)
        sens = {"max_tokens": max_tokens, "pass_rates": pass_rates(df), "rows": _records(df)}
        if reference is not None:
            ref_df = run_sensitive(reference, tokenizer, items, max_tokens, engine_kwargs)
            sens["reference_pass_rates"] = pass_rates(ref_df)
            sens["vs_reference"] = flips(ref_df, df)
            sens["bad_cases"] = _records(bad_cases(ref_df, df, k_bad))
        result["sensitive"] = sens
    return result


def sensitive_metrics(df, ref_sensitive) -> dict:
    """Per category and "all" (long context left out): pass rate with its Wilson interval (pass_<c>_low and
    _high), items lost and share of outputs unchanged against `ref_sensitive` (a superset of the items), also
    with its Wilson interval (same_output_<c>_low and _high)."""
    ref = ref_sensitive[ref_sensitive["id"].isin(df["id"])]
    rates, moved = pass_rates(df), flips(ref, df)
    # "all" leaves long context out: not every model runs it, and totals must compare across rows.
    short = df["category"] != "long_context"
    rates["all"] = pass_rates(df[short])["all"]
    moved["all"] = flips(ref[ref["category"] != "long_context"], df[short])["all"]
    metrics = {}
    for category in CATEGORIES + ("all",):
        # A category this model did not run (long context, which the weight-quantization study runs only for
        # LONG_CONTEXT_CONFIGS) is NaN, not 0.
        metrics[f"pass_{category}"] = rates[category]["rate"] if category in rates else float("nan")
        if category in rates and rates[category]["total"]:
            metrics.update(proportion(rates[category]["passed"], rates[category]["total"]).columns(f"pass_{category}"))
        metrics[f"lost_{category}"] = moved[category]["lost"] if category in moved else float("nan")
        metrics[f"same_output_{category}"] = moved[category]["same_output"] if category in moved else float("nan")
        if category in moved and moved[category]["total"]:
            same = round(moved[category]["same_output"] * moved[category]["total"])
            metrics.update(proportion(same, moved[category]["total"]).columns(f"same_output_{category}"))
    return metrics


def evaluate_model(model, tokenizer, reference, heldout, items, ref_sensitive, max_tokens: int,
                   df: pd.DataFrame | None = None, kv=None,
                   cache: ReferenceLogProbs | None = None) -> tuple[dict, pd.DataFrame, SequenceScores]:
    """Perplexity, KL and top-1 against `reference` with their intervals over the `heldout` sequences, and
    `sensitive_metrics` of the items against the reference's outputs `ref_sensitive`. `df`: the model's
    sensitive outputs, when already run. `kv`: (KVCacheFormat, KVScales or None) stores `model`'s KV cache
    through that format (as in `evaluate`). Returns (metrics, per-item rows, per-sequence scores), the scores
    for paired comparisons between models (`lab.eval.scores.paired`). `cache`: the reference's forwards kept
    across calls on the same sequences (`ReferenceLogProbs`), as when one reference judges several models."""
    scores = score_sequences(reference, model, heldout, kv, cache=cache)
    metrics = scores.summary()
    engine = None if kv is None else {"kv_cache_dtype": kv[0], "kv_scales": kv[1]}
    df = run_sensitive(model, tokenizer, items, max_tokens, engine) if df is None else df
    metrics.update(sensitive_metrics(df, ref_sensitive))
    return metrics, df, scores
