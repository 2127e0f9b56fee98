"""KV-cache quantization: formats, calibration, and error growth with context (notebook 03), measured.

The deployment article (seeds/003, section 2.3) claims: FP8 KV is usually safe, INT8 needs care, INT4 should
stay out of online serving; keys are more sensitive than values, so keys want per-channel scales and values
per-token ones (KIVI, arXiv:2402.02750); per-token dynamic scales beat a per-tensor static scale on long
context; and the error accumulates with context, so short prompts hide it. This module measures each claim on
SmolLM2 with the formats of `lab.kv.format`:

- the cache's own error and its end-to-end effect, per position (`lab.eval.kv_error`: the attention output
  against exact K/V on the exact model's own queries, keys and values; next-token KL with every layer's
  K/V stored through the format), on a long held-out text (`lab.eval.harness.long_text`);
- both kept per block of positions within position buckets (256, 512, ... up to the text's length), for
  any list of formats, including K-only and V-only variants (`error_growth`);
- perplexity, KL and the sensitive set through the engine's quantized cache (`end_to_end`), and how many
  sequences one KV pool holds in each format (`max_concurrency`), beside `lab.memory`'s account.

Intervals (a block bootstrap over the long text, a bootstrap over held-out sequences, Wilson intervals for
pass rates) and the claims table live in `claims`, the parameters and format names in `params`, the figures in
`plots`.
"""

from __future__ import annotations

import pandas as pd
import torch
from tqdm.auto import tqdm

from lab.eval.harness import long_text  # noqa: F401  (notebook 03 calls study.long_text)
from lab.eval.kv_error import kl_by_position  # noqa: F401  (the package's name for it)
from lab.eval.kv_error import attention_error_by_position, kl_by_position_of, record
from lab.kv import bytes_per_block
from lab.kv.calibration import KVScales
from lab.studies.kv_quantization.params import ENGINE_BLOCK_SIZE, KVStudyParams, scales_for, study_format


def position_buckets(n: int, first: int = 256) -> list[tuple[int, int]]:
    """[0, first), [first, 2 first), [2 first, 4 first) ... up to n."""
    edges = [0, first]
    while edges[-1] < n:
        edges.append(edges[-1] * 2)
    edges[-1] = n
    return [(a, b) for a, b in zip(edges, edges[1:]) if a < n]


def _blocked(values: torch.Tensor, buckets, block: int, **labels) -> list[dict]:
    """Each bucket cut into blocks of `block` positions: the block's mean over measured (non-NaN) positions and
    how many there were, the units the intervals resample (`claims`)."""
    rows = []
    for a, b in buckets:
        for s in range(a, b, block):
            part = values[s:min(s + block, b)]
            n = int((~part.isnan()).sum())
            rows.append({**labels, "positions": f"{a}-{b}", "position_end": b, "block_start": s, "measured": n,
                         "value": float(part.nanmean()) if n else float("nan")})
    return rows


def error_growth(model, ids: list[int], names: list[str], calibrated: KVScales | None, first_bucket: int = 256,
                 stride: int = 1, block: int = 32, log=print) -> pd.DataFrame:
    """Attention-output relative error and next-token KL for every format name (which may end in
    "/unit-scale"), on one recording of the text, per block of `block` positions within each position bucket
    (`claims.bucket_table` pools them by bucket); static formats use `calibrated` scales. The KL of every
    format reads one pass of the exact model's log-probabilities (`kl_by_position_of`)."""
    rec = record(model, ids)
    buckets = position_buckets(len(ids), first_bucket)
    formats, errors = {}, {}
    for name in tqdm(names, desc="KV formats, attention error by position"):
        fmt, roles, _ = study_format(name)
        formats[name] = (fmt, roles, scales_for(name, model, calibrated))
        errors[name] = attention_error_by_position(model, rec, *formats[name], stride)
    kls = kl_by_position_of(model, ids, rec.hidden, formats,
                            progress=lambda pairs: tqdm(pairs, total=len(formats), desc="KV formats, KL by position"))
    rows = []
    for name in names:
        rows += _blocked(errors[name], buckets, block, format=name, metric="attention_rel_error")
        rows += _blocked(kls[name], buckets, block, format=name, metric="next_token_kl")
        log(f"{name:40s} attention error {float(errors[name].nanmean()):.4f}, KL {float(kls[name].mean()):.5f}")
    return pd.DataFrame(rows)


def bytes_per_token(model, name: str, block_size: int = ENGINE_BLOCK_SIZE) -> float:
    """Pool bytes per token of a format in the engine (`lab.engine`), and of the model's dtype for "auto"."""
    return bytes_per_block(model, block_size, None if name == "auto" else study_format(name)[0]) / block_size


def max_concurrency(model, tokenizer, names: list[str], calibrated: KVScales, pool_mib: float, seq_len: int,
                    shape_name: str, block_size: int = ENGINE_BLOCK_SIZE) -> pd.DataFrame:
    """For each format, a KV pool of `pool_mib` MiB in the engine, and two more requests of `seq_len` tokens
    (prompt seq_len - 1, one output token) than could fit: how many the engine ran in one step
    (measured), beside floor(pool / (blocks per sequence x block bytes)) from `lab.memory`'s bytes per token
    (predicted). The staging area of exact windows is reported beside: it is outside the pool."""
    from lab.engine import LLM, SamplingParams
    from lab.memory import ModelShape, dtype_name, kv_bytes_per_token

    shape = ModelShape.load(shape_name)  # a preset, or the checkpoint MODEL names
    gen = torch.Generator().manual_seed(0)
    blocks_per_seq = -(-seq_len // block_size)
    rows = []
    for name in tqdm(names, desc="KV formats, concurrency"):
        fmt = None if name == "auto" else study_format(name)[0]
        per_block = bytes_per_token(model, name, block_size) * block_size
        num_blocks = int(pool_mib * 2 ** 20 // per_block)
        if fmt is None:
            account = kv_bytes_per_token(shape, dtype_name(model.embed_tokens.weight.dtype))
        else:
            account = kv_bytes_per_token(shape, "fp8" if fmt.is_fp8 else fmt.dtype, fmt.granularity,
                                         token_group=fmt.token_group, asymmetric=fmt.asymmetric)
        predicted = int(pool_mib * 2 ** 20 // (blocks_per_seq * block_size * account))
        row = {"format": name, "bytes_per_token": per_block / block_size, "bytes_per_token_account": account,
               "pool_blocks": num_blocks, "predicted_sequences": predicted}
        if num_blocks < blocks_per_seq:
            rows.append({**row, "measured_sequences": 0, "staging_MiB": 0.0})
            continue
        n = num_blocks // blocks_per_seq + 2  # more than fit: the pool, not the offer, is the limit
        llm = LLM(model, tokenizer=tokenizer, num_kv_blocks=num_blocks, block_size=block_size, max_model_len=seq_len,
                  max_num_seqs=n, max_num_batched_tokens=n * seq_len, enable_prefix_caching=False,
                  kv_cache_dtype="auto" if fmt is None else fmt, kv_scales=scales_for(name, model, calibrated)
                  if fmt is not None else None)
        vocab = model.config.vocab_size
        for _ in range(n):
            llm.add_request(torch.randint(0, vocab, (seq_len - 1,), generator=gen, device="cpu").tolist(),
                            SamplingParams(temperature=0, max_tokens=1, ignore_eos=True))
        peak = 0
        while llm.has_unfinished():
            llm.step()
            peak = max(peak, len(llm.view().last_step.scheduled))
        rows.append({**row, "measured_sequences": peak, "staging_MiB": llm.stats()["kv_staging_bytes"] / 2 ** 20})
    return pd.DataFrame(rows)


def end_to_end(p: KVStudyParams, model, tokenizer, calibrated: KVScales, log=print) -> tuple[pd.DataFrame, dict]:
    """Perplexity, KL and top-1 against the exact cache, and the sensitive set (long context included) with
    flips against the exact cache's outputs, for every E2E format; the exact cache's row first. Each figure
    carries its interval (over held-out sequences, or Wilson over items), and the changes against the exact
    cache are paired over the same sequences and items (`claims`)."""
    from lab.eval.harness import evaluate_model, heldout_texts, run_sensitive
    from lab.eval.scores import ReferenceLogProbs
    from lab.eval.sensitive import CATEGORIES, load_items
    from lab.studies.kv_quantization.claims import item_intervals, perplexity_change

    heldout = heldout_texts(tokenizer, p.HELDOUT_SEQUENCES, p.HELDOUT_TOKENS, p.SEED)
    items = [it for c in CATEGORIES for it in load_items((c,))[
        :p.LONG_CONTEXT_ITEMS if c == "long_context" else (p.ITEMS_PER_CATEGORY or None)]]
    ref_df = run_sensitive(model, tokenizer, items, p.MAX_TOKENS)
    rows, outputs = [], {"exact": ref_df}
    kept = ReferenceLogProbs(model)  # the exact cache's forwards, read by every format (computed once a sequence)
    metrics, _, exact = evaluate_model(model, tokenizer, model, heldout, items, ref_df, p.MAX_TOKENS, df=ref_df,
                                       cache=kept)

    def changes(scores, df):
        return {**perplexity_change(scores, exact), **item_intervals(df, ref_df, CATEGORIES)}

    rows.append({"format": "exact", **metrics, **changes(exact, ref_df)})
    for name in tqdm(p.E2E_FORMATS, desc="KV formats, end to end"):
        fmt, _, _ = study_format(name)
        kv = (fmt, scales_for(name, model, calibrated))
        metrics, df, scores = evaluate_model(model, tokenizer, model, heldout, items, ref_df, p.MAX_TOKENS, kv=kv,
                                             cache=kept)
        rows.append({"format": name, **metrics, **changes(scores, df)})
        outputs[name] = df
        log(f"{name:40s} perplexity {metrics['perplexity']:.3f}, KL {metrics['kl_mean']:.5f}, "
            f"same outputs {metrics['same_output_all']:.2f}")
    return pd.DataFrame(rows), outputs


# ---- figures ------------------------------------------------------------------------------------------------
