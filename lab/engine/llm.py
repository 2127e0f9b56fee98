"""`LLM`: the offline engine. `add_request` / `step` / `generate`, in the shape of vLLM and nano-vllm.

A request's path: `generate` -> `add_request` (validated, tokenized, queued) -> `step`:
`Scheduler.schedule` picks (sequence, tokens) pairs under the budgets -> `ModelRunner.execute`
builds the flat batch and runs `LlamaModel` whose layers call `TorchPagedAttention.attend`
(`lab.engine.attention`), or with attention_backend="triton" `TritonPagedAttention.attend`
(`lab.engine.triton_attention` -> `lab.kernels.paged_attention`) -> tokens are sampled, appended,
finished sequences free their blocks.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import torch

from lab.models import LlamaModel, default_device, default_dtype, load_model
from lab.quant.kv import KV_CACHE_DTYPES as QUANT_KV_DTYPES
from lab.quant.kv import KVCacheFormat

from .block_manager import BlockManager
from .model_runner import ModelRunner, kv_cache_bytes_per_block, kv_staging_bytes
from .sampling import SamplingParams
from .scheduler import Scheduler
from .sequence import RequestOutput, Sequence, Status

# "torch": gather the blocks, then SDPA (lab.engine.attention); "triton": the lab.kernels read them in place.
ATTENTION_BACKENDS = ("torch", "triton")
# "auto": the model's dtype; the others are lab.quant.kv formats (a KVCacheFormat picks the granularity).
KV_CACHE_DTYPES = ("auto",) + QUANT_KV_DTYPES
# Share of the free memory the KV pool may take when num_kv_blocks is not given.
KV_CACHE_MEMORY_FRACTION = 0.4


@dataclass
class EngineConfig:
    block_size: int = 16
    num_kv_blocks: int | None = None
    max_model_len: int = 2048
    max_num_seqs: int = 32
    max_num_batched_tokens: int = 2048
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    attention_backend: str = "torch"
    kv_cache_dtype: str | KVCacheFormat = "auto"

    def __post_init__(self):
        for name in ("block_size", "max_model_len", "max_num_seqs", "max_num_batched_tokens"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"{name} must be a positive integer, got {getattr(self, name)!r}")
        if self.num_kv_blocks is not None and self.num_kv_blocks < 1:
            raise ValueError(f"num_kv_blocks must be a positive integer, got {self.num_kv_blocks}")
        if self.attention_backend not in ATTENTION_BACKENDS:
            raise ValueError(f"attention_backend {self.attention_backend!r} is not one of {ATTENTION_BACKENDS}")
        if not isinstance(self.kv_cache_dtype, KVCacheFormat) and self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"kv_cache_dtype {self.kv_cache_dtype!r} is not one of {KV_CACHE_DTYPES} "
                             f"(or a lab.quant.kv.KVCacheFormat)")
        if self.attention_backend == "triton" and isinstance(self.kv_cache_dtype, KVCacheFormat):
            from lab.kernels import check_supported
            check_supported(self.kv_cache_dtype)
        if not self.enable_chunked_prefill and self.max_num_batched_tokens < self.max_model_len:
            raise ValueError(
                f"without chunked prefill a whole prompt must fit one step: max_num_batched_tokens "
                f"{self.max_num_batched_tokens} < max_model_len {self.max_model_len}"
            )


def _available_memory(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


class LLM:
    def __init__(self, model: str | LlamaModel = "smollm2-135m", dtype: torch.dtype | None = None,
                 block_size: int = 16, num_kv_blocks: int | None = None, max_model_len: int = 2048,
                 max_num_seqs: int = 32, max_num_batched_tokens: int = 2048, enable_prefix_caching: bool = True,
                 enable_chunked_prefill: bool = True, attention_backend: str = "torch",
                 kv_cache_dtype: str | KVCacheFormat = "auto", kv_scales=None, tokenizer=None,
                 device: str | torch.device | None = None, replay=None, speculative=None):
        """`model` is a name or path for `load_model`, or an already loaded `LlamaModel` (pass its tokenizer).

        `kv_cache_dtype`: "auto" (the model's dtype), a quantized dtype with its default granularity (fp8
        per-tensor, integers per-token), or a `lab.quant.kv.KVCacheFormat` (any granularity, per-channel keys
        and a full-precision window included); static granularities need `kv_scales`
        (`lab.quant.kv_calibration.KVScales`). A window's exact copies take `max_num_seqs` lanes outside the
        pool (`stats()["kv_staging_bytes"]`).

        `replay`: a `lab.replay.ReplayConfig`: before each step, sequences about to decode may drop the KV of
        their last tokens and recompute it from their token ids (`lab.replay.controller`).

        `speculative`: a `lab.spec.SpeculativeConfig`: requests (whose SamplingParams.speculate) decode k drafted
        tokens a round from its drafter (n-gram lookup, the first layers, a quantized copy or a draft model, whose
        KV pool has num_kv_blocks blocks too), verified losslessly (`lab.spec.speculator`)."""
        self.config = EngineConfig(block_size, num_kv_blocks, max_model_len, max_num_seqs, max_num_batched_tokens,
                                   enable_prefix_caching, enable_chunked_prefill, attention_backend, kv_cache_dtype)
        if isinstance(model, LlamaModel):
            self.model, self.tokenizer = model, tokenizer
        else:
            device = torch.device(device) if device is not None else default_device()
            self.model, self.tokenizer = load_model(model, dtype=dtype or default_dtype(device), device=device,
                                                    max_positions=max_model_len)
        window = self.model.config.sliding_window
        if window is not None and max_model_len > window:
            raise ValueError(f"max_model_len {max_model_len} exceeds the model's sliding window of {window} tokens, "
                             f"which the lab's attention does not implement; use max_model_len <= {window}")
        if max_model_len > self.model.rope.max_positions:
            raise ValueError(f"max_model_len {max_model_len} exceeds the model's rotary table of "
                             f"{self.model.rope.max_positions} positions")
        self.device = self.model.embed_tokens.weight.device
        kv_format = kv_cache_dtype if isinstance(kv_cache_dtype, KVCacheFormat) else (
            None if kv_cache_dtype == "auto" else KVCacheFormat(kv_cache_dtype))
        per_block = kv_cache_bytes_per_block(self.model, block_size, kv_format)
        staging = kv_staging_bytes(self.model, max_num_seqs, kv_format)
        num_blocks = num_kv_blocks or self._default_num_blocks(per_block, staging)
        self.block_manager = BlockManager(num_blocks, block_size, enable_prefix_caching)
        self.scheduler = Scheduler(self.block_manager, max_num_seqs, max_num_batched_tokens, enable_chunked_prefill)
        self.runner = ModelRunner(self.model, num_blocks, block_size, kv_format, kv_scales, max_num_seqs,
                                  attention_backend)
        self.eos_token_ids = set(self.model.config.eos_token_ids)
        self.spec = None
        if speculative is not None:
            from lab.spec.speculator import Speculator
            if replay is not None:
                raise ValueError("replay and speculative decoding cannot be combined in one engine")
            if self.runner.stages:  # a rollback would leave the exact copies behind the rewound position
                raise ValueError(f"speculative decoding needs a KV format without staged exact copies; "
                                 f"kv_cache_dtype {kv_cache_dtype!r} keeps a full-precision window or per-channel "
                                 f"keys")
            self.spec = Speculator(speculative, self.model, num_blocks, block_size, max_model_len, self.tokenizer)
        self.replay = None
        if replay is not None:
            from lab.replay.controller import ReplayController
            if replay.chunk is not None and not enable_chunked_prefill:
                raise ValueError("replay in chunks needs enable_chunked_prefill=True")
            hidden = None
            if replay.source == "hidden":
                from lab.replay.hidden import HiddenStateStore
                hidden = HiddenStateStore(self.runner, replay.window)
            self.replay = ReplayController(replay, hidden)
            self._weight_bytes = sum(p.numel() * p.element_size() for p in self.model.parameters())
            self._kv_bytes_per_token = per_block / block_size
        self.sequences: dict[int, Sequence] = {}
        self.num_prefill_tokens = self.num_decode_tokens = self.num_steps = 0
        self.last_schedule = None

    def _default_num_blocks(self, per_block: int, staging: int) -> int:
        """Enough blocks for max_num_seqs sequences of max_model_len, within a share of free memory (less the
        staging area of a quantized cache's exact windows)."""
        c = self.config
        per_seq = -(-c.max_model_len // c.block_size)
        affordable = max(int(_available_memory(self.device) * KV_CACHE_MEMORY_FRACTION) - staging, 0) // per_block
        num = min(c.max_num_seqs * per_seq, affordable)
        if num < per_seq:
            raise ValueError(f"the KV pool that fits in memory ({num} blocks of {c.block_size} tokens) cannot hold "
                             f"one sequence of max_model_len {c.max_model_len}; lower max_model_len")
        return num

    # ---- requests -----------------------------------------------------------------------------
    def _tokenize(self, prompt) -> tuple[list[int], str | None]:
        salt = None
        if isinstance(prompt, dict):
            salt = prompt.get("cache_salt")
            prompt = prompt["prompt_token_ids"] if "prompt_token_ids" in prompt else prompt["prompt"]
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("this model has no tokenizer (a random:<preset> model?); pass token ids")
            return self.tokenizer.encode(prompt, add_special_tokens=False), salt
        ids = [int(t) for t in prompt]
        bad = [t for t in ids if not 0 <= t < self.model.config.vocab_size]
        if bad:
            raise ValueError(f"token id {bad[0]} is outside the vocabulary [0, {self.model.config.vocab_size})")
        return ids, salt

    def add_request(self, prompt, params: SamplingParams | None = None, cache_salt: str | None = None) -> int:
        """Validate and queue one request; returns its id. Raises ValueError, leaving other requests untouched."""
        return self.enqueue(self.make_sequence(prompt, params, cache_salt))

    def enqueue(self, seq: Sequence) -> int:
        """Queue a sequence from `make_sequence` (a server validates in one thread and queues in another)."""
        self.sequences[seq.request_id] = seq
        self.scheduler.add(seq)
        return seq.request_id

    def make_sequence(self, prompt, params: SamplingParams | None, cache_salt: str | None = None) -> Sequence:
        """Tokenize and validate one request (ValueError names the value and the limit) without queueing it."""
        params = params or SamplingParams()
        ids, salt = self._tokenize(prompt)
        salt = cache_salt if cache_salt is not None else salt
        c = self.config
        if not ids:
            raise ValueError("the prompt is empty: at least one token is needed")
        if len(ids) + params.max_tokens > c.max_model_len:
            raise ValueError(f"prompt of {len(ids)} tokens + max_tokens {params.max_tokens} = "
                             f"{len(ids) + params.max_tokens} exceeds max_model_len {c.max_model_len}")
        need = self.block_manager.blocks_for(len(ids) + params.max_tokens)
        if need > self.block_manager.num_blocks:
            raise ValueError(f"the request needs {need} KV blocks ({len(ids)} + {params.max_tokens} tokens) but the "
                             f"whole pool has {self.block_manager.num_blocks} blocks of {c.block_size} tokens")
        return Sequence(ids, params, salt)

    def abort(self, request_id: int) -> None:
        seq = self.sequences.pop(request_id, None)
        if seq is not None and seq.status != Status.FINISHED:
            self.scheduler.finish(seq, "abort")
            if self.spec is not None:
                self.spec.finish(seq)

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    # ---- stepping -----------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """One scheduler step and one model forward; returns the requests that finished in it."""
        if self.replay is not None:
            bm = self.block_manager
            self.replay.before_step(self.scheduler.running, bm.num_free_blocks / bm.num_blocks, self._kv_read_share())
        if self.spec is not None:
            self.spec.propose(self.scheduler.running)
        out = self.scheduler.schedule()
        drafts = self.spec.withdraw_unscheduled(out.scheduled) if self.spec is not None else {}
        if self.replay is not None:
            self.replay.begin_step(out.scheduled)
        self.last_schedule = out  # for tracing: what this step ran (see lab.engine.trace)
        if not out.scheduled:
            return []
        tokens = self.runner.execute(out.scheduled, drafts)
        now = time.perf_counter()
        finished = []
        self.num_steps += 1
        for (seq, n), result in zip(out.scheduled, tokens):
            if seq.num_computed_tokens < seq.num_prompt_tokens:
                self.num_prefill_tokens += n
            else:
                self.num_decode_tokens += n
            if seq.request_id in drafts:  # verified: accepted drafts and one more token, rejected ones rolled back
                emitted = self.spec.accept(seq, result)
            else:
                seq.num_computed_tokens += n
                emitted = [] if result is None else [result]
            self.block_manager.cache_full_blocks(seq)
            for token in emitted:
                seq.token_ids.append(token)
                m = seq.metrics
                m.token_times.append(now)
                if m.first_token_time is None:
                    m.first_token_time = now
                reason = self._finish_reason(seq, token)
                if reason:
                    m.finish_time = now
                    self.scheduler.finish(seq, reason)
                    finished.append(self._output(self.sequences.pop(seq.request_id)))
                    if self.replay is not None:
                        self.replay.forget(seq.request_id)
                    if self.spec is not None:
                        self.spec.finish(seq)
                    break
        if self.replay is not None:
            self.replay.after_step(self.scheduler.running)
        return finished

    def _kv_read_share(self) -> float:
        """The share of a decode step's memory traffic that reads KV (the running contexts' KV against the
        weights): the lab's stand-in for the article's bandwidth-utilization counter, which a CPU has not."""
        kv = self._kv_bytes_per_token * sum(len(s) for s in self.scheduler.running)
        return kv / (kv + self._weight_bytes)

    def _finish_reason(self, seq: Sequence, token: int) -> str | None:
        p = seq.params
        if (token in self.eos_token_ids and not p.ignore_eos) or token in p.stop_token_ids:
            return "stop"
        if seq.num_output_tokens >= p.max_tokens:
            return "length"
        return None

    def _output(self, seq: Sequence) -> RequestOutput:
        text = self.tokenizer.decode(seq.output_token_ids, skip_special_tokens=True) if self.tokenizer else None
        return RequestOutput(seq.request_id, seq.token_ids[:seq.num_prompt_tokens], seq.output_token_ids, text,
                             seq.finish_reason, seq.metrics)

    def generate(self, prompts, params: SamplingParams | list[SamplingParams] | None = None,
                 use_tqdm: bool = False) -> list[RequestOutput]:
        """Run prompts (strings, token-id lists, or dicts with prompt/prompt_token_ids and cache_salt) to completion.

        Every prompt is validated before any is queued, so a bad one raises without leaving work behind.
        """
        if isinstance(prompts, (str, dict)) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        params = params if isinstance(params, list) else [params or SamplingParams()] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(params)} SamplingParams")
        seqs = [self.make_sequence(prompt, p) for prompt, p in zip(prompts, params)]
        ids = [self.enqueue(seq) for seq in seqs]
        done: dict[int, RequestOutput] = {}
        pbar = None
        if use_tqdm:
            from tqdm.auto import tqdm
            pbar = tqdm(total=len(ids), desc="generate")
        while len(done) < len(ids):
            for o in self.step():
                done[o.request_id] = o
                if pbar:
                    pbar.update(1)
        if pbar:
            pbar.close()
        return [done[i] for i in ids]

    def stats(self) -> dict:
        s, bm = self.scheduler, self.block_manager
        return {
            "kv_blocks_total": bm.num_blocks,
            "kv_blocks_used": bm.num_used_blocks,
            "kv_cache_bytes": self.runner.kv_cache_bytes,
            "kv_staging_bytes": getattr(self.runner.kv, "staging_bytes", 0),
            "prefix_cache_hit_rate": s.prefix_hit_tokens / s.prefix_query_tokens if s.prefix_query_tokens else 0.0,
            "prefix_cache_hit_tokens": s.prefix_hit_tokens,
            "preemptions": s.num_preemptions,
            "prefill_tokens": self.num_prefill_tokens,
            "decode_tokens": self.num_decode_tokens,
            "steps": self.num_steps,
            "running": len(s.running),
            "waiting": len(s.waiting),
            **({"replays": self.replay.stats.replays, "replayed_tokens": self.replay.stats.recomputed_tokens}
               if self.replay is not None else {}),
            **({"spec_rounds": self.spec.stats.rounds, "spec_drafted": self.spec.stats.drafted,
                "spec_accepted": self.spec.stats.accepted,
                "spec_conditional_acceptance": self.spec.stats.conditional_acceptance,
                "spec_acceptance_by_position": self.spec.stats.acceptance_by_position,
                "spec_mean_accepted_tokens_per_step": self.spec.stats.mean_accepted_tokens_per_step,
                "spec_draft_seconds": self.spec.draft_seconds, "spec_policy_pauses": self.spec.pauses,
                **{f"spec_draft_{k}": v for k, v in self.spec.drafter.stats().items()}}
               if self.spec is not None else {}),
        }
