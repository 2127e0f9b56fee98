"""What each supported architecture changes in the one Llama block, stated as data: a `Family` per architecture.

The lab has one decoder (`lab.models.llama`): RMSNorm, RoPE, grouped-query attention, a SwiGLU MLP, residual
connections. The families it runs differ from it in a handful of places, each a field here, so that a new family
is a row of this table and a small branch in the block rather than a copy of the model:

- `qk_norm`: an RMSNorm on the queries and keys before RoPE, which keeps attention logits from growing during
  training. Qwen3 normalises each head's vector over head_dim ("per_head"; Qwen Team, "Qwen3 Technical Report",
  2025, arXiv:2505.09388); OLMo 2 normalises the whole projection, all heads at once ("full"; Team OLMo,
  "2 OLMo 2 Furious", 2024, arXiv:2501.00656), after Dehghani et al., "Scaling Vision Transformers to 22 Billion
  Parameters" (2023).
- `norm_layout`: "pre" is Llama's x + f(norm(x)); "post" is OLMo 2's x + norm(f(x)), the norm on each block's
  output inside the residual branch, and no norm on its input.
- `mlp`: "dense" (one SwiGLU MLP) or "moe" (a routed mixture of SwiGLU experts, `lab.models.moe`): Mixtral
  (Jiang et al., 2024, arXiv:2401.04088) and Qwen3-MoE.
- `checkpoint_names`: module names of the checkpoint that the lab calls otherwise (Mixtral's block_sparse_moe and
  w1/w3/w2 are the lab's mlp and gate/up/down). Checkpoints that already hold fused q/k/v and gate/up matrices
  (Phi-3's qkv_proj, gate_up_proj) need nothing: those are the lab's own names and load as they are.
- `config_defaults`: what a family's config.json leaves implicit (Qwen2 always has q/k/v biases; Mixtral always
  renormalises its top-k routing weights).
- Gemma (Gemma Team, "Gemma 2: Improving Open Language Models at a Practical Size", 2024, arXiv:2408.00118, and
  "Gemma 3 Technical Report", 2025, arXiv:2503.19786; facts checked against transformers' modeling_gemma2 and
  modeling_gemma3): `norm_layout` "sandwich" (a norm before and after both attention and MLP: x + norm(f(norm(x)))),
  `norm_offset` 1 (each RMSNorm scales by 1 + weight, its weights stored centred on 0), `embed_scale` (embeddings
  times sqrt(hidden_size), rounded to the model's dtype as transformers does), `activation` "gelu_pytorch_tanh"
  (GeGLU: GELU's tanh approximation on the gate), and `window_every` (without `layer_types` in the config, every
  k-th layer is global and the others slide: Gemma 2 alternates, Gemma 3 keeps one global in six). What the config
  states numerically (query_pre_attn_scalar, the soft caps, Gemma 3's local RoPE base) is `ModelConfig`'s.

Sliding windows (Mistral every layer, Gemma the local ones) restrict a layer's queries to its last `sliding_window`
keys; the paged cache frees the blocks outside every window when every layer has one
(`lab.engine.block_manager.BlockManager`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

QK_NORMS = ("none", "per_head", "full")
NORM_LAYOUTS = ("pre", "post", "sandwich")
ACTIVATIONS = ("silu", "gelu_pytorch_tanh")
MLPS = ("dense", "moe")


@dataclass(frozen=True)
class Family:
    """One architecture's differences from the Llama block (the defaults are Llama's)."""

    model_type: str  # config.json's model_type for this architecture
    qk_norm: str = "none"
    norm_layout: str = "pre"
    mlp: str = "dense"
    checkpoint_names: dict[str, str] = field(default_factory=dict)  # a checkpoint's name part -> the lab's
    config_defaults: dict[str, object] = field(default_factory=dict)
    activation: str = "silu"  # the gate's activation in the gated MLP
    norm_offset: float = 0.0  # RMSNorm scales by norm_offset + weight
    embed_scale: bool = False  # embeddings times sqrt(hidden_size)
    window_every: int | None = None  # without layer_types: every k-th layer global, the others sliding

    def __post_init__(self):
        for name, value, allowed in (("qk_norm", self.qk_norm, QK_NORMS), ("norm_layout", self.norm_layout,
                                                                            NORM_LAYOUTS),
                                     ("mlp", self.mlp, MLPS), ("activation", self.activation, ACTIVATIONS)):
            if value not in allowed:
                raise ValueError(f"{name}={value!r} is not one of {allowed}")


# What transformers' Gemma configs default to and a config.json may leave out.
_GEMMA = dict(hidden_act="gelu_pytorch_tanh", query_pre_attn_scalar=256, tie_word_embeddings=True)

FAMILIES = {
    "LlamaForCausalLM": Family("llama"),
    "MistralForCausalLM": Family("mistral"),
    "Qwen2ForCausalLM": Family("qwen2", config_defaults={"attention_bias": True}),
    "Qwen3ForCausalLM": Family("qwen3", qk_norm="per_head"),
    "Olmo2ForCausalLM": Family("olmo2", qk_norm="full", norm_layout="post"),
    "Phi3ForCausalLM": Family("phi3"),
    "Qwen3MoeForCausalLM": Family("qwen3_moe", qk_norm="per_head", mlp="moe"),
    "MixtralForCausalLM": Family("mixtral", mlp="moe", config_defaults={"norm_topk_prob": True},
                                 checkpoint_names={"block_sparse_moe": "mlp", "w1": "gate_proj", "w3": "up_proj",
                                                   "w2": "down_proj"}),
    "Gemma2ForCausalLM": Family("gemma2", norm_layout="sandwich", activation="gelu_pytorch_tanh", norm_offset=1.0,
                                embed_scale=True, window_every=2, config_defaults=dict(
                                    _GEMMA, attn_logit_softcapping=50.0, final_logit_softcapping=30.0)),
    "Gemma3ForCausalLM": Family("gemma3_text", qk_norm="per_head", norm_layout="sandwich",
                                activation="gelu_pytorch_tanh", norm_offset=1.0, embed_scale=True, window_every=6,
                                config_defaults=dict(_GEMMA, rope_theta=1_000_000.0, rope_local_base_freq=10_000.0)),
}
