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

Sliding windows (Mistral, Phi-3, Qwen's optional ones) are not implemented: `lab.engine.config` refuses a
max_model_len beyond the window, so that the window never binds.
"""

from __future__ import annotations

from dataclasses import dataclass, field

QK_NORMS = ("none", "per_head", "full")
NORM_LAYOUTS = ("pre", "post")
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

    def __post_init__(self):
        for name, value, allowed in (("qk_norm", self.qk_norm, QK_NORMS),
                                     ("norm_layout", self.norm_layout, NORM_LAYOUTS), ("mlp", self.mlp, MLPS)):
            if value not in allowed:
                raise ValueError(f"{name}={value!r} is not one of {allowed}")


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
}
