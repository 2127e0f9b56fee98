"""A request at the engine's door: tokenized, and checked against every limit it could break inside a step (the
vocabulary, `max_model_len`, the whole KV pool, what an extension cannot serve), so that a bad request is refused
alone, by a ValueError naming the value and the limit, before anything is queued, and never fails a step beside
others. `LLM.add_request`, `LLM.generate` and the server all come through `make_sequence`."""

from __future__ import annotations

import numbers

from .request import SamplingParams, Sequence
from .sampler import processed
from .text import Detokenizer, check_text


def tokenize(engine, prompt) -> tuple[list[int], str | None]:
    salt = None
    if isinstance(prompt, dict):
        keys = [k for k in ("prompt_token_ids", "prompt") if k in prompt]
        if len(keys) != 1 or set(prompt) - {"prompt_token_ids", "prompt", "cache_salt"}:
            raise ValueError(f"a prompt dict has one of 'prompt' or 'prompt_token_ids' and optionally "
                             f"'cache_salt'; got the keys {sorted(prompt)}")
        salt, prompt = prompt.get("cache_salt"), prompt[keys[0]]
    if isinstance(prompt, str):
        if engine.tokenizer is None:
            raise ValueError("this model has no tokenizer (a random:<preset> model?); pass token ids")
        check_text(prompt, "prompt")  # else the tokenizer's TypeError, naming neither request nor field
        return engine.tokenizer.encode(prompt, add_special_tokens=False), salt
    if hasattr(prompt, "tolist") and not isinstance(prompt, (list, tuple)):  # a torch or numpy vector
        prompt = prompt.tolist()
    if not isinstance(prompt, (list, tuple)):
        raise ValueError(f"a prompt is a string, a list of token ids or a dict; got {type(prompt).__name__}")
    wrong = [t for t in prompt if isinstance(t, bool) or not isinstance(t, numbers.Integral)]
    if wrong:
        raise ValueError(f"token ids must be integers; got {wrong[0]!r}")
    ids = [int(t) for t in prompt]
    bad = [t for t in ids if not 0 <= t < engine.model.config.vocab_size]
    if bad:
        raise ValueError(f"token id {bad[0]} is outside the vocabulary [0, {engine.model.config.vocab_size})")
    return ids, salt


def make_sequence(engine, prompt, params: SamplingParams | None, cache_salt: str | None = None) -> Sequence:
    """Tokenize and validate one request (ValueError names the value and the limit) without queueing it."""
    params = params or SamplingParams()
    ids, salt = tokenize(engine, prompt)
    salt = cache_salt if cache_salt is not None else salt
    if salt is not None:
        if not isinstance(salt, str):
            raise ValueError(f"cache_salt must be a string, got {type(salt).__name__}")
        check_text(salt, "cache_salt")  # it is hashed as UTF-8 when the request's blocks are
    c = engine.config
    if not ids:
        raise ValueError("the prompt is empty: at least one token is needed")
    if processed(params) and params.speculate and "speculative" in engine.extensions:
        raise ValueError("penalties, min_tokens and logit_bias change the logits before sampling, which "
                         "speculative verification does not do yet: send this request with speculate=False")
    if params.logit_bias and max(params.logit_bias) >= engine.model.config.vocab_size:
        raise ValueError(f"logit_bias names token id {max(params.logit_bias)}, outside the vocabulary "
                         f"[0, {engine.model.config.vocab_size})")
    if params.stop and engine.tokenizer is None:
        raise ValueError("stop strings need a tokenizer to match text; this model has none (use stop_token_ids)")
    if len(ids) + params.max_tokens > c.max_model_len:
        raise ValueError(f"prompt of {len(ids)} tokens + max_tokens {params.max_tokens} = "
                         f"{len(ids) + params.max_tokens} exceeds max_model_len {c.max_model_len}")
    need = engine.block_manager.blocks_for(len(ids) + params.max_tokens)
    if need > engine.block_manager.num_blocks:
        raise ValueError(f"the request needs {need} KV blocks ({len(ids)} + {params.max_tokens} tokens) but the "
                         f"whole pool has {engine.block_manager.num_blocks} blocks of {c.block_size} tokens")
    seq = Sequence(ids, params, salt)
    if engine.tokenizer is not None:
        seq.detokenizer = Detokenizer(engine.tokenizer, params.stop, params.include_stop_str_in_output)
    # The extensions whose per-request hooks run for it: those that take every request, and those it asks for
    # by setting their SamplingParams field (lab.engine.extension, "Who hears what").
    seq.extensions = [e for e in engine.extensions.values()
                      if e.requested_by is None or getattr(params, e.requested_by) is not None]
    for ext in seq.extensions:
        ext.check_request(seq)  # a grammar is compiled here, so a bad one is refused at the door
    return seq
