"""The shape of a decoder-only transformer, and its parameters by part.

`ModelShape` holds the shape facts memory and FLOPs depend on, read from a config.json (or a preset of
`lab/models/presets`): an explicit head_dim, GQA, tied embeddings, MoE (total and active) and DeepSeek's
multi-head latent attention (MLA). `param_counts` counts the parameters of each part from those shapes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

PRESETS_DIR = Path(__file__).resolve().parents[1] / "models" / "presets"


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
        # DeepSeek's, Mixtral's and the Qwen MoE models' names for the routed experts
        experts = d.get("n_routed_experts") or d.get("num_local_experts") or d.get("num_experts") or 0
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
            num_shared_experts=d.get("n_shared_experts") or 0, first_dense_layers=_dense_layers(d, experts),
            q_lora_rank=d.get("q_lora_rank"), kv_lora_rank=d.get("kv_lora_rank"),
            qk_nope_head_dim=d.get("qk_nope_head_dim"), qk_rope_head_dim=d.get("qk_rope_head_dim"),
            v_head_dim=d.get("v_head_dim"),
            sliding_window=window, sliding_window_layers=_window_layers(d, arch, layers) if window else 0,
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
        """A preset name (the embedded model's name is one), `random:<preset>` (random weights of its shape), or a
        path to a config.json (or a checkpoint directory holding one): whatever a study's MODEL may be."""
        model = str(model)
        if model.startswith("random:"):
            return cls.preset(model.removeprefix("random:"))
        path = Path(model)
        if path.is_dir():
            path = path / "config.json"
        if path.suffix == ".json" and path.exists():
            return cls.from_hf_config(json.loads(path.read_text()), path.parent.name)
        return cls.preset(model)


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


def _window_layers(d: dict, arch: str, layers: int) -> int:
    """How many layers attend in a sliding window: those `layer_types` names so, or without it every layer but
    each k-th (1-based) of Gemma's pattern (Gemma 2 alternates, k = 2; Gemma 3 keeps one global layer in
    `sliding_window_pattern`, default 6); Mistral windows every layer."""
    if d.get("layer_types"):
        return sum(t == "sliding_attention" for t in d["layer_types"])
    every = d.get("sliding_window_pattern") or {"gemma2": 2, "gemma3": 6}.get(arch[:6].lower())
    return layers if not every else sum(1 for i in range(layers) if (i + 1) % every)


def _dense_layers(d: dict, experts: int) -> int:
    """How many layers of an MoE model keep a dense MLP: DeepSeek's first `first_k_dense_replace`, or Qwen's
    `mlp_only_layers` plus the layers `decoder_sparse_step` skips (layer i is sparse when (i + 1) % step == 0)."""
    if not experts:
        return 0
    if "first_k_dense_replace" in d:
        return d["first_k_dense_replace"] or 0
    step, dense = d.get("decoder_sparse_step") or 1, set(d.get("mlp_only_layers") or ())
    return sum(1 for i in range(d["num_hidden_layers"]) if i in dense or (i + 1) % step)
