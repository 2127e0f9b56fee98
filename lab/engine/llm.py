"""`LLM`: the offline engine. `add_request` / `step` / `generate`, in the shape of vLLM and nano-vllm.

A request's path: `generate` -> `add_request` (checked and tokenized at the door, `lab.engine.intake`, queued as
a `Sequence`) -> `step`: the extensions' intents applied (`Propose` drafts, `Rewind` a window: `_apply`) ->
`Scheduler.schedule` picks (sequence, tokens) pairs under the budgets, `BlockManager` gives them blocks ->
`ModelRunner.execute` builds the flat batch and runs `LlamaModel`, whose layers call
`TorchPagedAttention.attend` (`lab.models.attention`, reading and writing the pool of `lab.kv`), or with
attention_backend="triton" `TritonPagedAttention.attend` (`lab.engine.triton_attention` ->
`lab.kernels.paged_attention`) -> `Sampler` (`lab.engine.sampler`) turns the step's logits into each
sequence's tokens and their logprobs -> progress moves through `BlockManager.update`, the one writer of a
sequence's `num_computed_tokens` (the step's tokens, less the drafts verification rejected) -> the tokens are
appended, full blocks hashed for the prefix cache, finished sequences free their blocks -> each changed
request's `RequestDelta` (`lab.engine.output`), which is all a caller sees. `step` reads intents -> schedule ->
execute -> sample -> append -> deltas.

Features plug in through `lab.engine.extension` (speculative decoding, replay, structured output): `step` calls
their hooks and has no branch of its own for any of them.
"""

from __future__ import annotations

import logging
import time
from itertools import repeat

import torch

from lab.models import LlamaModel
from lab.parallel.group import RankFailure

from .block_manager import BlockManager
from .chat import render
from .config import EngineConfig
from .extension import EngineExtension, Propose, Rewind, StepView, step_hooks
from .fanout import FanOut
from .intake import make_sequence
from .model_runner import build_runner
from .output import OutputProcessor, RequestDelta
from .probe import forward_probe, recompute
from .request import RequestOutput, SamplingParams, Sequence, Status
from .sampler import Sampled, Sampler, token_logprobs
from .scheduler import Scheduler
from .view import EngineView

log = logging.getLogger(__name__)


class LLM:
    def __init__(self, model: str | LlamaModel = "smollm2-135m", **options):
        """`model` is a name or path for `lab.models.load_model`, or an already loaded `LlamaModel` (pass its
        `tokenizer=`). Every option is a field of `lab.engine.config.EngineConfig` (vLLM's names: `dtype`,
        `block_size`, `max_model_len`, `max_num_seqs`, `max_num_batched_tokens`, `kv_cache_dtype`, ...).

        `speculative=lab.speculative.SpeculativeConfig(...)`: requests (whose SamplingParams.speculate) decode k drafted
        tokens a round, verified losslessly. `replay=lab.replay.ReplayConfig(...)`: sequences about to decode may
        drop the KV of their last tokens and recompute it. Both are engine extensions (`extensions`).
        `tensor_parallel_size=N` or `pipeline_parallel_size=N`: the model split over this process and N - 1
        workers (`lab.parallel`)."""
        self.config = c = EngineConfig(model=model, **options)
        self.model, self.tokenizer, self.runner, num_blocks, runner_extensions = build_runner(c)
        self.device = self.model.embed_tokens.weight.device
        # With a sliding window on every layer, blocks wholly before it go back to the pool (`BlockManager`).
        self.block_manager = BlockManager(num_blocks, c.block_size, c.enable_prefix_caching,
                                          sliding_window=self.runner.free_window)
        self.scheduler = Scheduler(self.block_manager, c.max_num_seqs, c.max_num_batched_tokens,
                                   c.enable_chunked_prefill)
        self.eos_token_ids = set(self.model.config.eos_token_ids)
        self.sequences: dict[int, Sequence] = {}
        self.num_prefill_tokens = self.num_decode_tokens = self.num_steps = 0
        self.last_schedule = None
        self.extensions: dict[str, EngineExtension] = {}
        self.hooks = step_hooks(())  # the step hooks to call, per hook (lab.engine.extension.step_hooks)
        self.sampler = Sampler(self.eos_token_ids)
        self.output_processor = OutputProcessor()  # each step's deltas (lab.engine.output)
        self._drafting: list[Sequence] = []  # sequences given drafts (`Propose`) since the last schedule
        self.step_view = StepView(self)  # what extensions' step hooks see (lab.engine.extension)
        for ext in runner_extensions:  # a parallel group's stats and close
            self._add_extension(ext)
        for ext_config in c.extension_configs:
            self._add_extension(ext_config.build(self))

    def _add_extension(self, ext: EngineExtension) -> None:
        if ext.name in self.extensions:
            raise ValueError(f"two engine extensions are named {ext.name!r}")
        rewinding = [e.name for e in self.extensions.values() if e.rewinds]
        if ext.rewinds and rewinding:
            raise ValueError(f"{ext.name} and {rewinding[0]} both rewind num_computed_tokens and cannot be combined "
                             f"in one engine")
        # A new dict, not an update: a server adds `FanOut` while its engine thread may be iterating the old one.
        extensions = {**self.extensions, ext.name: ext}
        self.hooks = step_hooks(extensions.values())
        self.extensions = extensions

    # ---- requests -----------------------------------------------------------------------------
    def add_request(self, prompt, params: SamplingParams | None = None, cache_salt: str | None = None) -> int:
        """Validate and queue one request; returns its id. Raises ValueError, leaving other requests untouched."""
        return self.enqueue(self.make_sequence(prompt, params, cache_salt))

    def enqueue(self, seq: Sequence) -> int:
        """Queue a sequence from `make_sequence` (a server validates in one thread and queues in another)."""
        self.sequences[seq.request_id] = seq
        self.scheduler.add(seq)
        return seq.request_id

    def make_sequence(self, prompt, params: SamplingParams | None, cache_salt: str | None = None) -> Sequence:
        """Tokenize and validate one request (ValueError names the value and the limit) without queueing it
        (`lab.engine.intake`)."""
        return make_sequence(self, prompt, params, cache_salt)

    def add_samples(self, seqs: list[Sequence]) -> None:
        """Queue one request's samples from `make_sequence` (its `n`: `SamplingParams.samples`) the one way `generate`
        and the server share: the first at once, the others held (`FanOut`) until it has computed the prompt,
        whose blocks they then share."""
        first, *siblings = seqs
        self.enqueue(first)
        if siblings:
            if "fanout" not in self.extensions:
                self._add_extension(FanOut())
            self.extensions["fanout"].hold(first, siblings)

    def abort(self, request_id: int) -> RequestDelta | None:
        """End a request: queued or running, its blocks go back and its last delta is returned (the tokens not yet
        sent, finish reason "abort", its whole output), for a caller that still has someone to tell (a server
        draining at shutdown); a sample still held (`add_samples`) never runs, and gets none."""
        seq = self.sequences.pop(request_id, None)
        if seq is not None and seq.status != Status.FINISHED:
            self._finish(seq, "abort")
            return self.output_processor.delta(seq, True)  # the last one: its record goes
        self.output_processor.forget(request_id)
        if seq is None and "fanout" in self.extensions:
            self.extensions["fanout"].drop(request_id)
        return None

    def health(self) -> str | None:
        """Why the engine cannot compute another step, or None: an extension's cause (`EngineExtension.health`: a
        parallel rank that died or is stopped). Cheap and safe to call from another thread while a step runs (a
        server's watchdog polls it)."""
        for ext in list(self.extensions.values()):
            if (check := getattr(ext, "health", None)) and (cause := check()):
                return cause
        return None

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    # ---- stepping -----------------------------------------------------------------------------
    def step(self) -> list[RequestDelta]:
        """One scheduler step and one model forward; returns what it added to each request it changed, as
        `lab.engine.output.RequestDelta`s (a "final" request's one delta comes when it ends, with its `output`).
        Extension hooks run in the order `lab.engine.extension` documents. If the step raises, its requests are
        retried one at a time and only those that fail alone are finished, with finish_reason "error"
        (`_isolate`)."""
        hooks = self.hooks
        for hook in hooks["before_schedule"]:
            self._apply(hook(self.step_view) or ())
        out = self.scheduler.schedule()
        extra_rows = self._keep_drafts(out.scheduled)
        for hook in hooks["after_schedule"]:
            hook(self.step_view, out.scheduled)
        self.last_schedule = out  # for tracing: what this step ran (see lab.engine.trace)
        if not out.scheduled:
            return []
        self.num_steps += 1
        before = [(seq.num_computed_tokens, list(seq.draft_token_ids)) for seq, _ in out.scheduled]
        counts = (self.num_prefill_tokens, self.num_decode_tokens)
        try:
            emitted = self._execute(out.scheduled, extra_rows)
            failed = []
        except RankFailure:  # a parallel rank is gone: every retry would fail too, and the caller must know
            raise
        except Exception:  # noqa: BLE001  one request's failure must not fail the others (see _isolate)
            for (seq, _), (n, drafts) in zip(out.scheduled, before):  # as before the step: it is run again
                seq.draft_token_ids = drafts
                self.block_manager.update(seq, n)
            self.num_prefill_tokens, self.num_decode_tokens = counts
            emitted, failed = self._isolate(out.scheduled, extra_rows)
        deltas = [d for seq, _ in out.scheduled if seq.status is not Status.FINISHED
                  and (d := self.output_processor.delta(seq, self._append(seq, emitted.get(seq.request_id))))]
        for hook in hooks["after_step"]:
            hook(self.step_view)
        return deltas + failed

    def _apply(self, intents) -> None:
        """Apply what an extension reported before the step (`lab.engine.extension`): a window's KV dropped to be
        recomputed (`Rewind`), drafts to verify (`Propose`)."""
        for intent in intents:
            seq = intent.seq
            if isinstance(intent, Rewind):
                self.block_manager.update(seq, intent.to)
                seq.max_chunk = intent.max_chunk
            elif isinstance(intent, Propose):
                seq.draft_token_ids = list(intent.tokens)
                self._drafting.append(seq)
            else:
                raise TypeError(f"an engine extension reported {intent!r}, which is neither Rewind nor Propose")

    def _keep_drafts(self, scheduled: list[tuple[Sequence, int]]) -> dict[int, int]:
        """A sequence given n tokens keeps n - 1 drafts (none if it was not scheduled or was preempted); returns
        request id -> drafts kept: the extra logit rows its verification needs."""
        if not self._drafting:
            return {}
        given = {seq.request_id: n for seq, n in scheduled}
        rows = {}
        drafting, self._drafting = self._drafting, []
        for seq in drafting:
            if seq.draft_token_ids:
                keep = min(len(seq.draft_token_ids), max(given.get(seq.request_id, 0) - 1, 0))
                del seq.draft_token_ids[keep:]
                if keep:
                    rows[seq.request_id] = keep
        return rows

    def _execute(self, scheduled: list[tuple[Sequence, int]], extra_rows: dict) -> dict[int, Sampled]:
        """Execute -> sample: one forward, each sequence advanced by its scheduled tokens, then what each sequence
        that reached its end emits (`Sampler`), and the drafts its verification rejected dropped."""
        output = self.runner.execute(scheduled, extra_rows)
        emitting = []
        for (seq, n), rows, prompt_rows in zip(scheduled, output.rows, output.prompt_rows or repeat(None)):
            if prompt_rows is not None:
                self._prompt_logprobs(seq, output.logits[prompt_rows])
            if seq.num_computed_tokens < seq.num_prompt_tokens:
                self.num_prefill_tokens += n
            else:
                self.num_decode_tokens += n
            self.block_manager.update(seq, seq.num_computed_tokens + n)
            if rows is not None:
                emitting.append((seq, rows))
        sampled = self.sampler(output.logits, emitting)
        for seq, _ in emitting:
            if seq.draft_token_ids:  # verified: d drafts, accepted ones + 1 emitted, the rest hold no valid KV
                rejected = len(seq.draft_token_ids) + 1 - len(sampled[seq.request_id].tokens)
                self.block_manager.update(seq, seq.num_computed_tokens - rejected)
                seq.draft_token_ids = []  # the accepted ones are appended as tokens next (`_append`)
        return sampled

    def _isolate(self, scheduled: list[tuple[Sequence, int]], extra_rows: dict) -> tuple[dict, list[RequestDelta]]:
        """The step raised: run each of its sequences alone, so that only a request whose own rows fail is failed
        (its blocks freed, the error logged with its traceback and returned as its output); the rest advance as
        they would have. Re-running is safe: nothing advanced, and a forward rewrites the same KV slots."""
        log.exception("an engine step of %d requests failed; retrying them one at a time", len(scheduled))
        emitted, failed = {}, []
        for seq, n in scheduled:
            one, computed = [(seq, n)], seq.num_computed_tokens
            try:
                rows = {seq.request_id: extra_rows[seq.request_id]} if seq.request_id in extra_rows else {}
                emitted.update(self._execute(one, rows))
            except Exception as error:  # noqa: BLE001
                log.exception("request %d failed in an engine step", seq.request_id)
                seq.draft_token_ids = []
                self.block_manager.update(seq, computed)
                self._finish(seq, "error")
                self.sequences.pop(seq.request_id)
                failed.append(self.output_processor.delta(seq, True, f"{type(error).__name__}: {error}"))
        return emitted, failed

    def _prompt_logprobs(self, seq: Sequence, logits: torch.Tensor) -> None:
        """Record the logprobs of the prompt tokens this chunk's rows predict (a recomputed prompt, after a
        preemption, adds nothing twice)."""
        start = seq.num_computed_tokens  # row j predicts prompt token start + 1 + j
        targets = seq.token_ids[start + 1:start + 1 + logits.shape[0]]
        have = len(seq.prompt_logprobs)
        for j, entry in enumerate(token_logprobs(logits, targets, seq.params.prompt_logprobs)):
            if start + 1 + j == have:
                seq.prompt_logprobs.append(entry)
                have += 1

    def _append(self, seq: Sequence, sampled: Sampled | None) -> bool:
        """Append a sequence's sampled tokens and those an extension forces after them (`forced_token`), up to the
        first that finishes it; hash its full blocks (over the tokens it holds) and finish it if it stopped
        (True)."""
        now, reason = time.perf_counter(), None
        tokens, logprobs = (list(sampled.tokens), sampled.logprobs) if sampled else ([], None)
        if sampled:  # a rewound window (`Rewind`) is recomputed once the sequence samples again: chunks end
            seq.max_chunk = None
        for j, token in enumerate(tokens):  # a forced token appended to `tokens` is appended to `seq` in turn
            seq.token_ids.append(token)
            if logprobs is not None:
                seq.logprobs.append(logprobs[j])
            m = seq.metrics
            m.token_times.append(now)
            if m.first_token_time is None:
                m.first_token_time = now
            if reason := self._finish_reason(seq, token):
                m.finish_time = now
                break
            if j == len(tokens) - 1 and seq.logprobs is None:  # logprobs come from a forward: never forced
                tokens += [t for ext in seq.extensions if (t := ext.forced_token(seq)) is not None][:1]
        self.block_manager.cache_full_blocks(seq)
        if reason is None:
            return False
        self._finish(seq, reason)
        self.sequences.pop(seq.request_id)
        return True

    def _finish(self, seq: Sequence, reason: str) -> None:
        """The one place a request ends (finished or aborted): its blocks go back, every extension hears it."""
        seq.draft_token_ids = []  # aborted between proposal and verification: its drafts go with it
        self.scheduler.finish(seq, reason)
        for ext in seq.extensions:
            ext.on_finish(seq)

    def _finish_reason(self, seq: Sequence, token: int) -> str | None:
        p, ended = seq.params, [r for ext in seq.extensions if (r := ext.on_token(seq, token))]
        if ended:
            return ended[0]
        if (token in self.eos_token_ids and not p.ignore_eos) or token in p.stop_token_ids:
            return "stop"
        if p.stop and seq.detokenizer.update(seq.output_token_ids):  # checked after every token
            return "stop"
        if seq.num_output_tokens >= p.max_tokens:
            return "length"
        return None

    def generate(self, prompts, params: SamplingParams | list[SamplingParams] | None = None,
                 use_tqdm: bool = False) -> list[RequestOutput]:
        """Run prompts (strings, token-id lists, or dicts with prompt/prompt_token_ids and cache_salt) to completion.

        Every prompt is validated before any is queued, so a bad one raises without leaving work behind. A request
        that fails inside a step comes back with finish_reason "error" and the message in `error` (logged with its
        traceback); the others complete.
        """
        if isinstance(prompts, (str, dict)) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        params = params if isinstance(params, list) else [params or SamplingParams()] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(params)} SamplingParams")
        if not prompts:
            raise ValueError("no prompts: pass at least one (an empty list is neither a prompt nor a batch)")
        groups = []  # per prompt: its first sample, then the n - 1 others (lab.engine.fanout)
        for i, (prompt, p) in enumerate(zip(prompts, params)):
            try:
                groups.append([self.make_sequence(prompt, q) for q in p.samples()])
            except ValueError as e:
                raise ValueError(f"prompts[{i}]: {e}") from None
        for group in groups:
            self.add_samples(group)
        done: dict[int, RequestOutput] = {}
        total = sum(map(len, groups))
        pbar = None
        if use_tqdm:
            from tqdm.auto import tqdm
            pbar = tqdm(total=total, desc="generate")
        while len(done) < total:
            for delta in self.step():
                if delta.finished:
                    done[delta.request_id] = delta.output
                    if pbar:
                        pbar.update(1)
        if pbar:
            pbar.close()
        outs = [done[g[0].request_id] for g in groups]
        for out, (_, *siblings) in zip(outs, groups):
            out.siblings = [done[s.request_id] for s in siblings]
        return outs

    def chat(self, messages, params: SamplingParams | list[SamplingParams] | None = None,
             use_tqdm: bool = False) -> list[RequestOutput]:
        """vLLM's `LLM.chat`: one conversation (a list of {"role", "content"} messages) or a list of them, each
        rendered with the tokenizer's chat template (`lab.engine.chat`) and generated as `generate` does."""
        one = isinstance(messages, list) and bool(messages) and isinstance(messages[0], dict)
        conversations = [messages] if one else messages
        if not isinstance(conversations, list) or not conversations:
            raise ValueError(f"messages must be a conversation or a non-empty list of them, got {messages!r}")
        prompts = [render(self.tokenizer, c, "messages" if one else f"messages[{i}]")
                   for i, c in enumerate(conversations)]
        return self.generate(prompts, params, use_tqdm)

    # ---- what studies, benchmarks and the server may read or do; the rest is the engine's own ------------------
    def reset_prefix_cache(self) -> None:
        """Forget every cached block no live request holds (vLLM's `LLM.reset_prefix_cache`): between timed runs."""
        self.block_manager.reset_prefix_cache()

    @property
    def kv_bytes_per_token(self) -> float:
        """Bytes one cached token's KV takes in the pool, over every layer (K and V, with their scales)."""
        return self.runner.kv.bytes_per_token

    @property
    def num_kv_blocks(self) -> int:
        return self.block_manager.num_blocks

    @property
    def kv_store(self):
        """The KV pool's store (its format's write, gather and sizes), for a study that reads the format."""
        return self.runner.kv

    def is_running(self, request_id: int) -> bool:
        """The request is admitted and computing (not queued, held or ended)."""
        seq = self.sequences.get(request_id)
        return seq is not None and seq.status is Status.RUNNING

    def view(self) -> EngineView:
        """A read-only snapshot: the running and waiting requests (progress, block tables) and the last step's
        schedule, for tours, traces and studies that watch the engine work."""
        return EngineView.of(self.scheduler, self.last_schedule)

    def forward_probe(self, context: int, n: int):
        """A forward of n tokens after `context` cached ones with n logit rows, to time (`lab.engine.probe`)."""
        return forward_probe(self.runner, self.block_manager, context, n)

    def recompute(self, request_id: int, start: int, n: int) -> None:
        """Recompute the KV of positions [start, start + n) of a live request (`lab.engine.probe.recompute`)."""
        recompute(self.runner, self.block_manager, self.sequences[request_id], start, n)

    def stats(self) -> dict:
        s, bm = self.scheduler, self.block_manager
        stats = {
            "kv_blocks_total": bm.num_blocks,
            "kv_blocks_used": bm.num_used_blocks,
            "kv_cache_bytes": self.runner.kv_cache_bytes,
            "kv_staging_bytes": self.runner.kv.staging_bytes,
            "prefix_cache_hit_rate": s.prefix_hit_tokens / s.prefix_query_tokens if s.prefix_query_tokens else 0.0,
            "prefix_cache_hit_tokens": s.prefix_hit_tokens,
            "preemptions": s.num_preemptions,
            "prefill_tokens": self.num_prefill_tokens,
            "decode_tokens": self.num_decode_tokens,
            "steps": self.num_steps,
            "running": len(s.running),
            "waiting": len(s.waiting),
            "compile_seconds": getattr(self.runner.step, "compile_seconds", 0.0),
        }
        for ext in self.extensions.values():
            stats.update(ext.stats())
        return stats

    def close(self) -> None:
        """Abort what is still queued or running and close every extension (hooks removed, pools released)."""
        for rid in list(self.sequences):
            self.abort(rid)
        for ext in self.extensions.values():
            ext.close()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
