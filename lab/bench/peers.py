"""The peers `lab bench engine` times beside the engine, on the same workloads in the same run.

- `transformers`: `AutoModelForCausalLM.generate` on the same weights (the converted checkpoint the lab loads; for
  a `random:` model, the engine's random weights handed over by `lab.models.hf_export`) in the same dtype, greedy, exactly `max_tokens` new tokens (min_new_tokens), prompts left-padded into one
  batch. A decode step is timed as (time for m tokens - time for 1 token) / (m - 1).
- an OpenAI-compatible server at a URL (a vLLM, SGLang or `lab serve` the user started): the same token-id
  prompts sent at once, streamed; TTFT and TPOT per request (`lab.bench.serve.run_prompts`).
"""

from __future__ import annotations

import time

import torch

from lab.bench.engine import Workload, metric_of, prompt_ids
from lab.timing import sync


def _batch(tok, prompts: list[list[int]]) -> dict:
    """The prompts left-padded into one batch (by the tokenizer; without one, with id 0 and the same mask)."""
    if tok is not None:
        return dict(tok.pad({"input_ids": prompts}, padding=True, return_tensors="pt"))
    n = max(map(len, prompts))
    ids = torch.tensor([[0] * (n - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (n - len(p)) + [1] * len(p) for p in prompts])
    return {"input_ids": ids, "attention_mask": mask}


def _hf_generate(hf, tok, prompts: list[list[int]], max_tokens: int) -> float:
    batch = {k: v.to(hf.device) for k, v in _batch(tok, prompts).items()}
    sync()
    t = time.perf_counter()
    hf.generate(**batch, max_new_tokens=max_tokens, min_new_tokens=max_tokens, do_sample=False,
                pad_token_id=tok.pad_token_id if tok is not None else 0)
    sync()
    return time.perf_counter() - t


@torch.inference_mode()
def run_transformers(model: str, dtype: str, workloads: list[Workload], scale: float = 1.0) -> dict:
    from transformers import AutoModelForCausalLM

    from lab.models.loader import default_device, default_dtype, load_tokenizer, parse_dtype, resolve_model_dir

    device = default_device()  # the engine's: a peer on another device would compare devices, not engines
    torch_dtype = parse_dtype(dtype) or default_dtype(device)
    if model.startswith("random:"):  # the engine's random weights (same preset, same seed), in transformers' model
        from lab.models import load_model
        from lab.models.hf_export import to_transformers

        hf, tok = to_transformers(load_model(model, dtype=torch_dtype, device=device)[0]), None
    else:
        model_dir = resolve_model_dir(model)  # the converted checkpoint the lab loads, and its tokenizer
        tok = load_tokenizer(model_dir)
        hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch_dtype).to(device).eval()
        tok.padding_side = "left"
        if tok.pad_token_id is None:
            tok.pad_token = tok.eos_token
    out = {"peer": f"transformers-{str(torch_dtype).removeprefix('torch.')}", "device": str(device), "workloads": {}}
    for w in workloads:
        prompts = prompt_ids(w, tok, hf.config.vocab_size, scale)  # random ids where there is no tokenizer
        _hf_generate(hf, tok, prompts, min(4, w.max_tokens))  # warm-up
        seconds = _hf_generate(hf, tok, prompts, w.max_tokens)
        step_s = None
        if w.metric == "step_ms":
            first = _hf_generate(hf, tok, prompts, 1)
            step_s = (seconds - first) / (w.max_tokens - 1)
        new = w.max_tokens * len(prompts)
        out["workloads"][w.name] = {"seconds": seconds, "new_tokens": new, "step_s": step_s,
                                    "value": metric_of(w, seconds, new, step_s)}
    return out


def run_url_peer(url: str, served_model: str, model: str, workloads: list[Workload], scale: float = 1.0) -> dict:
    """The workloads against a running OpenAI-compatible server serving `served_model` (`model`'s weights)."""
    from lab.bench.serve import run_prompts_sync
    from lab.models.loader import load_tokenizer, preset_config, resolve_model_dir

    if model.startswith("random:"):  # no tokenizer: random prompts below the preset's vocabulary
        tok, vocab = None, preset_config(model.split(":", 1)[1]).vocab_size
    else:
        tok = load_tokenizer(resolve_model_dir(model))
        vocab = len(tok)
    out = {"peer": f"server at {url}", "workloads": {}}
    for w in workloads:
        prompts = prompt_ids(w, tok, vocab, scale)
        run_prompts_sync(url, served_model, prompts, min(4, w.max_tokens))  # warm-up
        records, seconds = run_prompts_sync(url, served_model, prompts, w.max_tokens)
        failed = [r for r in records if r.status != "ok"]
        if failed:
            raise RuntimeError(f"{len(failed)} of {len(records)} requests to {url} failed: {failed[0].error}")
        tpots = [r.tpot for r in records if r.tpot is not None]
        step_s = sum(tpots) / len(tpots) if tpots else None
        new = sum(r.output_tokens for r in records)
        out["workloads"][w.name] = {"seconds": seconds, "new_tokens": new, "step_s": step_s,
                                    "value": metric_of(w, seconds, new, step_s)}
    return out
