"""The peers `lab bench engine` times beside the engine, on the same workloads in the same run.

- `transformers`: `AutoModelForCausalLM.generate` on the same weights (the converted checkpoint the lab loads; for
  a `random:` model, the engine's random weights handed over by `lab.models.hf_export`) in the same dtype, greedy, exactly `max_tokens` new tokens (min_new_tokens), prompts left-padded into one
  batch. A decode step is the mean gap between the streamed tokens after the first (the engine's TPOT), read from
  a `transformers` streamer in the timed run itself: the difference of two runs' times (m tokens against 1) came
  out negative on a tiny model when noise between the runs exceeded m - 1 steps.
- an OpenAI-compatible server at a URL (a vLLM, SGLang or `lab serve` the user started): the same token-id
  prompts sent at once, streamed; TTFT and TPOT per request (`lab.bench.serve.run_prompts`).
- vLLM's CPU build, in its own environment (`lab.bench.vllm_peer`).

Each is built once and held (`lab.bench.rounds`): `measure` times one workload once, after a short warm-up of the
same shapes, since the rounds interleave it with the engine's variants.
"""

from __future__ import annotations

import time

import torch

from lab.bench.workloads import Workload, metric_of, prompt_ids
from lab.machine.timing import sync


def _batch(tok, prompts: list[list[int]]) -> dict:
    """The prompts left-padded into one batch (by the tokenizer; without one, with id 0 and the same mask)."""
    if tok is not None:
        return dict(tok.pad({"input_ids": prompts}, padding=True, return_tensors="pt"))
    n = max(map(len, prompts))
    ids = torch.tensor([[0] * (n - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (n - len(p)) + [1] * len(p) for p in prompts])
    return {"input_ids": ids, "attention_mask": mask}


class _TokenTimes:
    """A `transformers` streamer that keeps the time each step's tokens arrive (its first call is the prompt)."""

    def __init__(self):
        self.times: list[float] = []

    def put(self, value) -> None:
        self.times.append(time.perf_counter())

    def end(self) -> None:
        pass

    def step_s(self) -> float:
        """Mean seconds between consecutive new tokens after the first."""
        tokens = self.times[1:]
        if len(tokens) < 2:
            raise ValueError(f"a decode step needs at least 2 streamed tokens, got {len(tokens)}")
        return (tokens[-1] - tokens[0]) / (len(tokens) - 1)


def _hf_generate(hf, tok, prompts: list[list[int]], max_tokens: int, streamer=None) -> float:
    batch = {k: v.to(hf.device) for k, v in _batch(tok, prompts).items()}
    sync()
    t = time.perf_counter()
    hf.generate(**batch, max_new_tokens=max_tokens, min_new_tokens=max_tokens, do_sample=False,
                pad_token_id=tok.pad_token_id if tok is not None else 0, streamer=streamer)
    sync()
    return time.perf_counter() - t


class TransformersPeer:
    """`transformers`' generate held for the whole benchmark (`lab.bench.rounds.Contender`) on the engine's
    weights in `dtype` ("auto": the serving dtype), on the engine's device: a peer on another device would compare
    devices, not engines."""

    def __init__(self, model: str, dtype: str, workloads: list[Workload], scale: float = 1.0):
        from transformers import AutoModelForCausalLM

        from lab.models.loader import default_device, default_dtype, load_tokenizer, parse_dtype, resolve_model_dir

        device = default_device()
        torch_dtype = parse_dtype(dtype) or default_dtype(device)
        if model.startswith("random:"):  # the engine's random weights (same preset, same seed), in transformers'
            from lab.models import load_model
            from lab.models.hf_export import to_transformers

            self.hf, self.tok = to_transformers(load_model(model, dtype=torch_dtype, device=device)[0]), None
        else:
            model_dir = resolve_model_dir(model)  # the converted checkpoint the lab loads, and its tokenizer
            self.tok = load_tokenizer(model_dir)
            self.hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch_dtype).to(device).eval()
            self.tok.padding_side = "left"
            if self.tok.pad_token_id is None:
                self.tok.pad_token = self.tok.eos_token
        self.label = f"transformers-{str(torch_dtype).removeprefix('torch.')}"
        self.device = str(device)
        # random ids where there is no tokenizer
        self.prompts = {w.name: prompt_ids(w, self.tok, self.hf.config.vocab_size, scale) for w in workloads}

    @torch.inference_mode()
    def measure(self, w: Workload) -> dict:
        prompts = self.prompts[w.name]
        _hf_generate(self.hf, self.tok, prompts, min(4, w.max_tokens))  # warm-up (the rounds interleave)
        times = _TokenTimes() if w.metric == "step_ms" else None
        seconds = _hf_generate(self.hf, self.tok, prompts, w.max_tokens, times)
        step_s = times.step_s() if times is not None else None
        new = w.max_tokens * len(prompts)
        return {"seconds": seconds, "new_tokens": new, "step_s": step_s, "value": metric_of(w, seconds, new, step_s)}

    def about(self) -> dict:
        return {}

    def close(self) -> None:
        self.hf = None


class UrlPeer:
    """The workloads against a running OpenAI-compatible server serving `served_model` (`model`'s weights): the
    same token-id prompts sent at once, streamed."""

    def __init__(self, url: str, served_model: str, model: str, workloads: list[Workload], scale: float = 1.0):
        from lab.models.loader import load_tokenizer, preset_config, resolve_model_dir

        if model.startswith("random:"):  # no tokenizer: random prompts below the preset's vocabulary
            tok, vocab = None, preset_config(model.split(":", 1)[1]).vocab_size
        else:
            tok = load_tokenizer(resolve_model_dir(model))
            vocab = len(tok)
        self.url, self.served_model = url, served_model
        self.label, self.device = f"server at {url}", "server"
        self.prompts = {w.name: prompt_ids(w, tok, vocab, scale) for w in workloads}

    def measure(self, w: Workload) -> dict:
        from lab.bench.serve import run_prompts_sync

        prompts = self.prompts[w.name]
        run_prompts_sync(self.url, self.served_model, prompts, min(4, w.max_tokens))  # warm-up
        records, seconds = run_prompts_sync(self.url, self.served_model, prompts, w.max_tokens)
        failed = [r for r in records if r.status != "ok"]
        if failed:
            raise RuntimeError(f"{len(failed)} of {len(records)} requests to {self.url} failed: {failed[0].error}")
        tpots = [r.tpot for r in records if r.tpot is not None]
        step_s = sum(tpots) / len(tpots) if tpots else None
        new = sum(r.output_tokens for r in records)
        return {"seconds": seconds, "new_tokens": new, "step_s": step_s, "value": metric_of(w, seconds, new, step_s)}

    def about(self) -> dict:
        return {}

    def close(self) -> None:
        pass
