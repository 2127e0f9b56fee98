"""Weight bytes by storage format, scale and zero-point overhead included.

GPTQ/AWQ store zeros packed at the weight bit width; GGUF blocks hold their own scales; embeddings and LM head
are optionally left unquantized. Quantization groups run along a matrix's input features, so every linear is
accounted as its own (out, in) shape (`linear_shapes`), a ragged last group keeping its scale.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .shape import ModelShape, param_counts


@dataclass(frozen=True)
class WeightFormat:
    """How a quantized matrix is stored: bits per weight plus per-group (or per-block) metadata bytes."""

    name: str
    bits: float
    group_size: int | None = None  # weights sharing one scale (None: per output channel or per tensor)
    scale_bytes: float = 0.0  # per group
    zero_bytes: float = 0.0  # per group (asymmetric formats)
    per_channel: bool = False  # one scale per output row (int8 per-channel)
    per_tensor_bytes: int = 0  # one scale per matrix (fp8)

    def matrix_bytes(self, rows: int, cols: int) -> float:
        n = rows * cols
        total = n * self.bits / 8 + self.per_tensor_bytes
        if self.per_channel:
            total += rows * (self.scale_bytes + self.zero_bytes)
        if self.group_size:
            groups = rows * math.ceil(cols / self.group_size)  # a ragged last group still has a scale
            total += groups * (self.scale_bytes + self.zero_bytes)
        return total


def weight_format(name: str) -> WeightFormat:
    """fp32, bf16, fp16, fp8, int8 (per channel), int4/int3[-g32|-g64|-g128][-asym], gguf-q4_0/q4_1/q8_0."""
    simple = {"fp32": WeightFormat("fp32", 32), "bf16": WeightFormat("bf16", 16), "fp16": WeightFormat("fp16", 16),
              "fp8": WeightFormat("fp8", 8, per_tensor_bytes=4),
              "int8": WeightFormat("int8", 8, per_channel=True, scale_bytes=2),
              # GGUF blocks of 32 (ggml-common.h): Q4_0 = fp16 d + 16 B; Q4_1 = fp16 d, m + 16 B; Q8_0 = fp16 d + 32 B
              "gguf-q4_0": WeightFormat("gguf-q4_0", 4, 32, scale_bytes=2),
              "gguf-q4_1": WeightFormat("gguf-q4_1", 4, 32, scale_bytes=2, zero_bytes=2),
              "gguf-q8_0": WeightFormat("gguf-q8_0", 8, 32, scale_bytes=2)}
    if name in simple:
        return simple[name]
    parts = name.split("-")
    if parts[0] in ("int2", "int3", "int4") and len(parts) >= 2 and parts[1].startswith("g"):
        bits, group = int(parts[0][3:]), int(parts[1][1:])
        asym = parts[2:] == ["asym"]
        if group not in (32, 64, 128) or parts[2:] not in ([], ["asym"]):
            raise ValueError(f"weight format {name!r}: group size must be 32, 64 or 128, optionally '-asym'")
        # fp16 scale per group; asymmetric zero points packed at the weight bit width (GPTQ/AWQ qzeros)
        return WeightFormat(name, bits, group, scale_bytes=2, zero_bytes=bits / 8 if asym else 0)
    raise ValueError(f"unknown weight format {name!r}; known: {', '.join(simple)}, int4-g128, int3-g64-asym, ...")


def linear_shapes(s: ModelShape) -> dict[str, list[tuple[int, int, int]]]:
    """Every linear matrix as (how many, out features, in features), by part. Quantization groups run
    along the input features, so a hidden size a group does not divide leaves a ragged last group."""
    h = s.hidden_size
    if s.is_mla:
        qk = s.qk_nope_head_dim + s.qk_rope_head_dim
        q = ([(1, s.q_lora_rank, h), (1, s.num_heads * qk, s.q_lora_rank)] if s.q_lora_rank
             else [(1, s.num_heads * qk, h)])
        attn = q + [(1, s.kv_lora_rank + s.qk_rope_head_dim, h),
                    (1, s.num_heads * (s.qk_nope_head_dim + s.v_head_dim), s.kv_lora_rank),
                    (1, h, s.num_heads * s.v_head_dim)]
    else:
        qkv = (s.num_heads + 2 * s.num_kv_heads) * s.head_dim
        attn = [(1, qkv, h), (1, h, s.num_heads * s.head_dim)]
    moe_layers = s.num_layers - s.first_dense_layers if s.is_moe else 0
    dense = [(s.num_layers - moe_layers, 2 * s.intermediate_size, h), (s.num_layers - moe_layers, h, s.intermediate_size)]
    n_exp = moe_layers * (s.num_experts + s.num_shared_experts)
    experts = [(n_exp, 2 * s.moe_intermediate_size, h), (n_exp, h, s.moe_intermediate_size)] if n_exp else []
    return {"attention": [(s.num_layers * n, o, i) for n, o, i in attn], "mlp": dense + experts}


def weight_bytes(s: ModelShape, fmt: str | WeightFormat, unquantized: str = "bf16", embedding: str | None = None,
                 lm_head: str | None = None) -> dict[str, float]:
    """Bytes of every part: linear layers in `fmt`; norms, biases and routers in `unquantized`;
    the embedding and LM head in their own formats (default: `unquantized`, as GPTQ/AWQ leave them; a tied
    head defaults to the embedding's). Tied embeddings are stored once, unless the two are given different
    formats."""
    fmt = weight_format(fmt) if isinstance(fmt, str) else fmt
    plain = weight_format(unquantized).bits / 8
    c = param_counts(s)
    shapes = linear_shapes(s)
    vocab_matrix = (s.vocab_size, s.hidden_size)
    emb_fmt = weight_format(embedding or unquantized)
    head_fmt = weight_format(lm_head) if lm_head else emb_fmt if s.tie_word_embeddings else weight_format(unquantized)
    emb = emb_fmt.matrix_bytes(*vocab_matrix)
    # A tied head shares the embedding's storage only while both keep one format: quantizing one of them
    # unties it, and the head becomes a second copy (the engine holds both; notebook 09 measures it).
    shared = s.tie_word_embeddings and emb_fmt == head_fmt
    head = 0.0 if shared else head_fmt.matrix_bytes(*vocab_matrix)
    # Small vectors inside attention: q/k/v biases (Qwen2) and MLA's two low-rank norms.
    small = (s.num_layers * (s.num_heads + 2 * s.num_kv_heads) * s.head_dim if s.qkv_bias and not s.is_mla else 0)
    small += s.num_layers * ((s.q_lora_rank or 0) + s.kv_lora_rank) if s.is_mla else 0
    parts = {
        "embedding": emb, "lm_head": head,
        "attention": sum(n * fmt.matrix_bytes(o, i) for n, o, i in shapes["attention"]) + small * plain,
        "mlp": sum(n * fmt.matrix_bytes(o, i) for n, o, i in shapes["mlp"]),
        "router_and_norms": (c["router"] + c["norms"]) * plain,
    }
    parts["total"] = sum(parts.values())
    return parts


def weight_bytes_for_params(num_params: float, bytes_per_param: float) -> float:
    """The back-of-the-envelope account: parameters x bytes per parameter (the articles' method)."""
    return num_params * bytes_per_param
