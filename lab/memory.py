"""Memory accounting: parameters, weight bytes by format, KV bytes per token, paging waste, capacity.

The accounts every inference argument starts from (the deployment article, `003_...` section 1.1,
and the replay article, `000_...` section 1.1, in ../shared/seeds), done exactly:

- parameters from the shapes of a config.json, with an explicit head_dim, GQA, tied embeddings,
  MoE (total and active) and DeepSeek's multi-head latent attention (MLA);
- weight bytes per storage format, scale and zero-point overhead included (GPTQ/AWQ store zeros
  packed at the weight bit width; GGUF blocks hold their own scales), embeddings and LM head
  optionally left unquantized;
- KV bytes per token: 2 x layers x kv_heads x head_dim x bytes for MHA/GQA, and one latent of
  kv_lora_rank + qk_rope_head_dim per layer for MLA (DeepSeek-V2 paper, section 2.1: no factor 2),
  plus the scales each quantization granularity stores, capped by sliding windows;
- paging waste (Kwon et al., PagedAttention, SOSP 2023: at most one partly filled block per
  sequence) against contiguous preallocation to max_model_len;
- capacity by vLLM's rule: KV blocks = (memory x utilization - weights - activation peak - overhead)
  / block bytes, and the concurrency they hold.

GiB (1024^3 bytes) is used wherever a number is reported in "GB", as the articles' own code does.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

GIB = 1024**3
PRESETS_DIR = Path(__file__).with_name("models") / "presets"


@dataclass
class ModelShape:
    """The shape facts of a decoder-only transformer that memory and FLOPs depend on."""

    name: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    norms_per_layer: int = 2
    # MoE: routed experts, how many a token uses, their width, shared experts, leading dense layers
    num_experts: int = 0
    experts_per_token: int = 0
    moe_intermediate_size: int = 0
    num_shared_experts: int = 0
    first_dense_layers: int = 0
    # MLA (DeepSeek-V2/V3)
    q_lora_rank: int | None = None
    kv_lora_rank: int | None = None
    qk_nope_head_dim: int | None = None
    qk_rope_head_dim: int | None = None
    v_head_dim: int | None = None
    # sliding-window attention: the window and how many layers use it
    sliding_window: int | None = None
    sliding_window_layers: int = 0
    published_params: float | None = field(default=None, repr=False)
    published_active_params: float | None = field(default=None, repr=False)

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank is not None

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @classmethod
    def from_hf_config(cls, d: dict, name: str = "model") -> ModelShape:
        arch = (d.get("architectures") or [d.get("model_type", "")])[0]
        heads = d["num_attention_heads"]
        head_dim = d.get("head_dim") or d["hidden_size"] // heads
        experts = d.get("n_routed_experts") or d.get("num_local_experts") or 0
        window = d.get("sliding_window") if d.get("use_sliding_window", True) else None
        layers = d["num_hidden_layers"]
        gemma2 = arch.startswith("Gemma2")
        return cls(
            name=name, vocab_size=d["vocab_size"], hidden_size=d["hidden_size"],
            intermediate_size=d["intermediate_size"], num_layers=layers, num_heads=heads,
            num_kv_heads=d.get("num_key_value_heads", heads), head_dim=head_dim,
            tie_word_embeddings=d.get("tie_word_embeddings", False),
            qkv_bias=d.get("attention_bias", arch.startswith("Qwen2")),
            norms_per_layer=4 if gemma2 else 2,
            num_experts=experts, experts_per_token=d.get("num_experts_per_tok", 0) if experts else 0,
            moe_intermediate_size=d.get("moe_intermediate_size") or (d["intermediate_size"] if experts else 0),
            num_shared_experts=d.get("n_shared_experts") or 0, first_dense_layers=d.get("first_k_dense_replace", 0),
            q_lora_rank=d.get("q_lora_rank"), kv_lora_rank=d.get("kv_lora_rank"),
            qk_nope_head_dim=d.get("qk_nope_head_dim"), qk_rope_head_dim=d.get("qk_rope_head_dim"),
            v_head_dim=d.get("v_head_dim"),
            # Gemma 2 alternates local (windowed) and global layers; Mistral windows every layer.
            sliding_window=window, sliding_window_layers=(layers // 2 if gemma2 else layers) if window else 0,
            published_params=d.get("_published_params"), published_active_params=d.get("_published_active_params"),
        )

    @classmethod
    def preset(cls, name: str) -> ModelShape:
        path = PRESETS_DIR / f"{name}.json"
        if not path.exists():
            known = ", ".join(sorted(p.stem for p in PRESETS_DIR.glob("*.json")))
            raise ValueError(f"unknown model {name!r}; presets: {known} (or pass a config.json path)")
        return cls.from_hf_config(json.loads(path.read_text()), name)

    @classmethod
    def load(cls, model: str) -> ModelShape:
        """A preset name or a path to a config.json (or a directory holding one)."""
        path = Path(model)
        if path.is_dir():
            path = path / "config.json"
        if path.suffix == ".json" and path.exists():
            return cls.from_hf_config(json.loads(path.read_text()), path.parent.name)
        return cls.preset(model)


# ---- parameters ------------------------------------------------------------------------------
def attention_params(s: ModelShape) -> int:
    if s.is_mla:
        qk_dim = s.qk_nope_head_dim + s.qk_rope_head_dim
        q = (s.hidden_size * s.q_lora_rank + s.q_lora_rank + s.q_lora_rank * s.num_heads * qk_dim
             if s.q_lora_rank else s.hidden_size * s.num_heads * qk_dim)
        kv = (s.hidden_size * (s.kv_lora_rank + s.qk_rope_head_dim) + s.kv_lora_rank
              + s.kv_lora_rank * s.num_heads * (s.qk_nope_head_dim + s.v_head_dim))
        return q + kv + s.num_heads * s.v_head_dim * s.hidden_size
    q, kv = s.num_heads * s.head_dim, s.num_kv_heads * s.head_dim
    bias = (q + 2 * kv) if s.qkv_bias else 0
    return s.hidden_size * (q + 2 * kv) + q * s.hidden_size + bias


def param_counts(s: ModelShape) -> dict[str, int]:
    """Parameters by part; `total` counts tied embeddings once, `active` is what one token uses."""
    dense_mlp = 3 * s.hidden_size * s.intermediate_size  # SwiGLU: gate, up, down
    expert = 3 * s.hidden_size * s.moe_intermediate_size
    moe_layers = s.num_layers - s.first_dense_layers if s.is_moe else 0
    router = s.hidden_size * s.num_experts + (s.num_experts if s.is_mla else 0)  # + DeepSeek's routing bias
    counts = {
        "embedding": s.vocab_size * s.hidden_size,
        "lm_head": 0 if s.tie_word_embeddings else s.vocab_size * s.hidden_size,
        "attention": s.num_layers * attention_params(s),
        "dense_mlp": (s.num_layers - moe_layers) * dense_mlp,
        "experts": moe_layers * (s.num_experts + s.num_shared_experts) * expert,
        "router": moe_layers * router,
        "norms": s.num_layers * s.norms_per_layer * s.hidden_size + s.hidden_size,
    }
    counts["total"] = sum(counts.values())
    counts["active"] = counts["total"] - moe_layers * (s.num_experts - s.experts_per_token) * expert
    return counts


# ---- weights ---------------------------------------------------------------------------------
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
    the embedding and LM head in their own formats (default: `unquantized`, as GPTQ/AWQ leave them).
    Tied embeddings are stored once."""
    fmt = weight_format(fmt) if isinstance(fmt, str) else fmt
    plain = weight_format(unquantized).bits / 8
    c = param_counts(s)
    shapes = linear_shapes(s)
    vocab_matrix = (s.vocab_size, s.hidden_size)
    emb = weight_format(embedding or unquantized).matrix_bytes(*vocab_matrix)
    head = 0.0 if s.tie_word_embeddings else weight_format(lm_head or unquantized).matrix_bytes(*vocab_matrix)
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


# ---- KV cache --------------------------------------------------------------------------------
KV_DTYPE_BITS = {"fp32": 32, "bf16": 16, "fp16": 16, "fp8": 8, "int8": 8, "int4": 4, "int2": 2}
KV_GRANULARITIES = ("per-tensor", "per-token", "per-head", "per-channel", "per-group")
_TORCH_DTYPE_NAMES = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}


def dtype_name(torch_dtype) -> str:
    """This module's name for a torch floating dtype (torch.float32 -> "fp32"), to account for a live model."""
    name = str(torch_dtype).removeprefix("torch.")
    if name not in _TORCH_DTYPE_NAMES:
        raise ValueError(f"no memory account for dtype {torch_dtype}; known: {', '.join(_TORCH_DTYPE_NAMES)}")
    return _TORCH_DTYPE_NAMES[name]


def default_kv_granularity(dtype: str) -> str:
    """fp8 KV with one static scale per tensor (vLLM's k_scale/v_scale); integers with per-token scales."""
    return "per-token" if dtype.startswith("int") else "per-tensor"


def kv_elements_per_token_per_layer(s: ModelShape) -> int:
    """Stored numbers per token per layer: K and V of every KV head, or MLA's one compressed latent."""
    if s.is_mla:
        return s.kv_lora_rank + s.qk_rope_head_dim
    return 2 * s.num_kv_heads * s.head_dim


def kv_bytes_per_token(s: ModelShape, dtype: str = "bf16", granularity: str = "per-tensor", group_size: int = 128,
                       token_group: int = 128, scale_bytes: int = 2, asymmetric: bool = False,
                       seq_len: int | None = None) -> float:
    """KV bytes one token adds, averaged over layers (sliding-window layers stop growing at the window).

    Scale overhead (fp16 scales, doubled with zero points when asymmetric):
    per-tensor and per-head static scales are constants (no per-token bytes); per-token stores one
    scale per token per KV head for K and V; per-group one per `group_size` channels of each head;
    per-channel (KIVI-style keys) one per channel per `token_group` tokens for K, with V per-token.
    """
    if dtype not in KV_DTYPE_BITS:
        raise ValueError(f"unknown KV dtype {dtype!r}; known: {', '.join(KV_DTYPE_BITS)}")
    if granularity not in KV_GRANULARITIES:
        raise ValueError(f"unknown granularity {granularity!r}; known: {', '.join(KV_GRANULARITIES)}")
    elems = kv_elements_per_token_per_layer(s)
    per_layer = elems * KV_DTYPE_BITS[dtype] / 8
    if KV_DTYPE_BITS[dtype] < 16:
        meta = scale_bytes * (2 if asymmetric else 1)
        heads = 1 if s.is_mla else s.num_kv_heads
        width = elems // (1 if s.is_mla else 2 * s.num_kv_heads)  # channels of one head's K (or the latent)
        kv_tensors = 1 if s.is_mla else 2
        if granularity == "per-token":
            per_layer += kv_tensors * heads * meta
        elif granularity == "per-group":
            per_layer += kv_tensors * heads * math.ceil(width / group_size) * meta
        elif granularity == "per-channel":
            per_layer += heads * width * meta / token_group + (heads * meta if not s.is_mla else 0)
    return per_layer * effective_layers(s, seq_len)


def effective_layers(s: ModelShape, seq_len: int | None) -> float:
    """Layers' worth of KV a token adds: windowed layers keep only the last `sliding_window` tokens."""
    if seq_len is None or not s.sliding_window or seq_len <= s.sliding_window:
        return s.num_layers
    kept = s.sliding_window / seq_len
    return (s.num_layers - s.sliding_window_layers) + s.sliding_window_layers * kept


def kv_cache_bytes(s: ModelShape, seq_len: int, concurrency: int = 1, **kw) -> float:
    return kv_bytes_per_token(s, seq_len=seq_len, **kw) * seq_len * concurrency


# ---- paging waste ----------------------------------------------------------------------------
def lognormal_from_percentiles(p50: float, p90: float, p99: float) -> tuple[float, float]:
    """(mu, sigma) of log-length fitted to P50, P90, P99: mu = ln P50, sigma by least squares on z-scores."""
    z90, z99 = 1.2815515655446004, 2.3263478740408408
    mu = math.log(p50)
    sigma = (z90 * (math.log(p90) - mu) + z99 * (math.log(p99) - mu)) / (z90**2 + z99**2)
    return mu, sigma


def lognormal_lengths(p50: float, p90: float, p99: float, n: int = 10_000) -> list[int]:
    """n deterministic lengths at evenly spaced quantiles of the fitted log-normal (no sampling noise)."""
    from statistics import NormalDist

    mu, sigma = lognormal_from_percentiles(p50, p90, p99)
    z = NormalDist()
    return [max(1, round(math.exp(mu + sigma * z.inv_cdf((i + 0.5) / n)))) for i in range(n)]


def paging_waste(lengths: list[int], block_size: int, max_model_len: int) -> dict[str, float]:
    """Mean wasted KV slots per sequence: paged (last block's tail) vs contiguous (up to max_model_len).

    Lengths over max_model_len would be rejected by an engine; they are counted and left out, never clipped.
    """
    kept = [n for n in lengths if n <= max_model_len]
    if not kept:
        raise ValueError(f"every length exceeds max_model_len {max_model_len}")
    paged = sum(-(-n // block_size) * block_size - n for n in kept) / len(kept)
    contiguous = sum(max_model_len - n for n in kept) / len(kept)
    mean_len = sum(kept) / len(kept)
    return {"block_size": block_size, "mean_length": mean_len, "rejected_fraction": 1 - len(kept) / len(lengths),
            "paged_waste_slots": paged, "contiguous_waste_slots": contiguous,
            "paged_waste_fraction": paged / (mean_len + paged),
            "contiguous_waste_fraction": contiguous / max_model_len}


# ---- capacity --------------------------------------------------------------------------------
def activation_peak_bytes(s: ModelShape, max_num_batched_tokens: int, max_num_seqs: int, dtype_bytes: int = 2) -> float:
    """A profile-free estimate of the forward's peak: the widest intermediates of one layer for the
    step's tokens (q/k/v, gate/up) plus float32 logits for the sampled rows. vLLM measures this
    by a profiling run instead; pass a measured number to `capacity` when you have one."""
    width = max(s.intermediate_size, s.moe_intermediate_size) * 2 + (s.num_heads + 2 * s.num_kv_heads) * s.head_dim
    return max_num_batched_tokens * (width + 2 * s.hidden_size) * dtype_bytes + max_num_seqs * s.vocab_size * 4


@dataclass
class Capacity:
    memory_bytes: float
    utilization: float
    weight_bytes: float
    activation_bytes: float
    overhead_bytes: float
    kv_block_bytes: float
    free_bytes: float  # left for the KV cache; negative when weights and activations alone do not fit
    num_blocks: int
    max_model_len: int
    block_size: int
    max_concurrency: float  # sequences of max_model_len the blocks hold
    operating_concurrency: int  # 80% of it, the margin both articles recommend

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def capacity(s: ModelShape, memory_bytes: float, weights: str = "bf16", kv_dtype: str = "bf16",
             max_model_len: int = 8192, block_size: int = 16, utilization: float = 0.9,
             activation_bytes: float | None = None, overhead_bytes: float = 0.0, max_num_batched_tokens: int = 8192,
             max_num_seqs: int = 256, margin: float = 0.8, **kv_kw) -> Capacity:
    """KV blocks and concurrency by vLLM's rule (blocks = free memory / block bytes)."""
    if not 0 < utilization <= 1:
        raise ValueError(f"utilization {utilization} must be in (0, 1]")
    w = weight_bytes(s, weights)["total"]
    act = activation_peak_bytes(s, max_num_batched_tokens, max_num_seqs) if activation_bytes is None else activation_bytes
    block = kv_bytes_per_token(s, kv_dtype, **kv_kw) * block_size
    free = memory_bytes * utilization - w - act - overhead_bytes
    blocks = max(0, int(free // block))
    per_seq = -(-max_model_len // block_size)
    conc = blocks / per_seq
    return Capacity(memory_bytes, utilization, w, act, overhead_bytes, block, free, blocks, max_model_len,
                    block_size, conc, int(conc * margin))


def memory_for_concurrency(s: ModelShape, concurrency: int, weights: str = "bf16", kv_dtype: str = "bf16",
                           max_model_len: int = 8192, block_size: int = 16, utilization: float = 0.9,
                           activation_bytes: float | None = None, overhead_bytes: float = 0.0,
                           max_num_batched_tokens: int = 8192, **kv_kw) -> float:
    """The inverse: device memory needed so `concurrency` sequences of max_model_len fit."""
    w = weight_bytes(s, weights)["total"]
    act = (activation_peak_bytes(s, max_num_batched_tokens, concurrency) if activation_bytes is None
           else activation_bytes)
    block = kv_bytes_per_token(s, kv_dtype, **kv_kw) * block_size
    return (w + act + overhead_bytes + concurrency * -(-max_model_len // block_size) * block) / utilization


# ---- one report ------------------------------------------------------------------------------
def memory_report(model: str | ModelShape, weights: str = "bf16", kv_dtype: str = "bf16", seq_len: int = 8192,
                  concurrency: int = 1, gpu: str | None = None, block_size: int = 16, utilization: float = 0.9,
                  kv_granularity: str | None = None) -> dict:
    """Everything `lab memory` prints: parameters, weight and KV bytes, their total, and the capacity on a GPU."""
    s = model if isinstance(model, ModelShape) else ModelShape.load(model)
    for name, value in (("seq_len", seq_len), ("concurrency", concurrency), ("block_size", block_size)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if kv_dtype not in KV_DTYPE_BITS:
        raise ValueError(f"unknown KV dtype {kv_dtype!r}; known: {', '.join(KV_DTYPE_BITS)}")
    kv_kw = dict(granularity=kv_granularity or default_kv_granularity(kv_dtype))
    w = weight_bytes(s, weights)
    per_token = kv_bytes_per_token(s, kv_dtype, seq_len=seq_len, **kv_kw)
    kv_total = per_token * seq_len * concurrency
    report = {
        "model": s.name, "weights_format": weights, "kv_dtype": kv_dtype, "seq_len": seq_len,
        "concurrency": concurrency, "params": param_counts(s),
        "weight_bytes": w, "kv_bytes_per_token": per_token,
        "kv_bytes_per_token_per_layer": kv_bytes_per_token(s, kv_dtype, **kv_kw) / s.num_layers,
        "kv_bytes_total": kv_total, "total_bytes": w["total"] + kv_total,
    }
    if gpu:
        from .hardware import get_gpu

        hw = get_gpu(gpu)
        cap = capacity(s, hw.memory_bytes, weights, kv_dtype, max_model_len=seq_len, block_size=block_size,
                       utilization=utilization, **kv_kw)
        report["gpu"] = {"name": hw.name, "memory_bytes": hw.memory_bytes, **cap.as_dict()}
    return report


def format_report(r: dict) -> str:
    g = lambda b: f"{b / GIB:10.2f} GiB"  # noqa: E731
    p = r["params"]
    lines = [f"{r['model']}: {p['total'] / 1e9:.3f} B parameters ({p['active'] / 1e9:.3f} B active per token)",
             f"weights ({r['weights_format']}):"]
    lines += [f"  {k:18s}{g(v)}" for k, v in r["weight_bytes"].items()]
    lines += [f"KV cache ({r['kv_dtype']}): {r['kv_bytes_per_token']:,.0f} bytes per token "
              f"({r['kv_bytes_per_token_per_layer']:,.0f} per layer)",
              f"  {r['seq_len']} tokens x {r['concurrency']} sequences{g(r['kv_bytes_total'])}",
              f"weights + KV{g(r['total_bytes'])}"]
    if "gpu" in r and r["gpu"]["free_bytes"] < 0:
        c = r["gpu"]
        lines += [f"on {c['name']} ({c['memory_bytes'] / GIB:.0f} GiB, utilization {c['utilization']}): weights and "
                  f"activations alone exceed the usable memory by {-c['free_bytes'] / GIB:.2f} GiB: no KV blocks"]
    elif "gpu" in r:
        c = r["gpu"]
        lines += [f"on {c['name']} ({c['memory_bytes'] / GIB:.0f} GiB, utilization {c['utilization']}): "
                  f"{c['num_blocks']} KV blocks of {c['block_size']} tokens -> max concurrency "
                  f"{c['max_concurrency']:.2f} at {c['max_model_len']} tokens, operate at {c['operating_concurrency']}"]
    return "\n".join(lines)
