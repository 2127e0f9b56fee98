"""Roofline bounds of the engine's workloads: the least time this machine's ceilings allow for the steps the
engine runs.

A step that reads B bytes and does F FLOPs takes at least max(B / bandwidth, F / rate) (`lab.machine.roofline`). The
engine runs a workload of prompts p_1..p_n and m new tokens each as prefill steps (every prompt token through
the model, at most `max_num_batched_tokens` a step, the LM head on one row per prompt) and m - 1 decode steps
(one token per request, each attending over its context p_i + j). Per step the weights are read once (every
parameter and buffer but the rotary tables: the tied LM head reads the embedding matrix) and the KV of every
context token once; FLOPs are 2 per matmul parameter per token (LM head: per logit row) plus attention's
`lab.machine.roofline.attention_flops_per_context_token` per (query, key) pair. Activations and the embedding lookup
are left out, so these are lower bounds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from lab.machine.hardware import Hardware
from lab.machine.roofline import attention_flops_per_context_token


@dataclass(frozen=True)
class ModelBytes:
    weight_bytes: float  # read by every forward
    layer_params: float  # matmul parameters of the decoder layers (logical, whatever their storage)
    head_params: float  # the LM head's (vocab x hidden)
    attn_flops_per_pair: float  # FLOPs of one query token against one context token
    kv_bytes_per_token: float  # all layers, K and V, as the engine's pool stores them

    @classmethod
    def of(cls, model, kv_bytes_per_token: float) -> ModelBytes:
        c = model.config
        q, kv = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
        per_layer = c.hidden_size * (q + 2 * kv) + q * c.hidden_size + 3 * c.hidden_size * c.intermediate_size
        tensors = {t.data_ptr(): t.nbytes for name, t in [*model.named_parameters(), *model.named_buffers()]
                   if not name.startswith("rope.")}
        return cls(float(sum(tensors.values())), float(per_layer * c.num_hidden_layers),
                   float(c.vocab_size * c.hidden_size),
                   float(attention_flops_per_context_token(c.num_hidden_layers, c.num_attention_heads, c.head_dim)),
                   kv_bytes_per_token)


def step_seconds(hw: Hardware, size: ModelBytes, tokens: int, logit_rows: int, pairs: float,
                 kv_tokens_read: float) -> float:
    """The bound on one step of `tokens` tokens, `pairs` (query, key) pairs in attention."""
    flops = 2 * size.layer_params * tokens + 2 * size.head_params * logit_rows + size.attn_flops_per_pair * pairs
    read = size.weight_bytes + size.kv_bytes_per_token * (kv_tokens_read + tokens)
    return max(read / hw.mem_bandwidth, flops / hw.peak_flops)


def workload_bound(hw: Hardware, size: ModelBytes, prompt_lens: list[int], max_tokens: int,
                   max_num_batched_tokens: int = 2048) -> dict:
    """Seconds the prefill and the decode steps of the workload need at least, and their sum."""
    total = sum(prompt_lens)
    steps = math.ceil(total / max_num_batched_tokens)
    prefill = max(steps * step_seconds(hw, size, 0, 0, 0, 0),  # the weights, read once a step
                  step_seconds(hw, size, total, len(prompt_lens), sum(p * (p + 1) / 2 for p in prompt_lens), 0))
    decode = sum(step_seconds(hw, size, len(prompt_lens), len(prompt_lens), sum(p + j for p in prompt_lens),
                              sum(p + j - 1 for p in prompt_lens)) for j in range(1, max_tokens))
    return {"prefill_bound_s": prefill, "decode_bound_s": decode, "bound_s": prefill + decode,
            "decode_step_bound_ms": 1e3 * decode / (max_tokens - 1) if max_tokens > 1 else None}
