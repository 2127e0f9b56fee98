"""Model shape: the few numbers of a `config.json` that the lab's model needs.

The fields follow Hugging Face's names so a `config.json` maps onto them directly. `head_dim` is
taken from the config when present and only otherwise derived as hidden_size / num_attention_heads
(several models, Gemma and Qwen3 among them, have a head_dim that is not that quotient). What an
architecture changes in the Llama block is its `Family` (`lab.models.families`), read from `FAMILIES`.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .families import FAMILIES, Family

# Architectures the lab's model implements: the Llama block (RMSNorm, RoPE, GQA, SwiGLU) and the variations of
# it that `FAMILIES` states (q/k norms, OLMo 2's post-norm layout, mixtures of experts, Qwen2's q/k/v bias, Gemma's
# sandwich norms, GeGLU and scaled embeddings); per-layer sliding windows and soft caps are config fields here.
SUPPORTED_ARCHITECTURES = tuple(FAMILIES)
SUPPORTED_ROPE_TYPES = ("default", "llama3", "linear")
LAYER_TYPES = ("full_attention", "sliding_attention")
# The fields only a mixture-of-experts config has (`lab.models.moe`); left out of a dense model's config.json.
# Fields only some families have, left out of the others' config.json (None there).
OPTIONAL_FIELDS = ("layer_types", "query_pre_attn_scalar", "attn_logit_softcapping", "final_logit_softcapping",
                   "rope_local_base_freq")
MOE_FIELDS = ("num_experts", "num_experts_per_tok", "moe_intermediate_size", "norm_topk_prob",
              "decoder_sparse_step", "mlp_only_layers")


@dataclass
class ModelConfig:
    architecture: str = "LlamaForCausalLM"
    vocab_size: int = 49152
    hidden_size: int = 576
    intermediate_size: int = 1536
    num_hidden_layers: int = 30
    num_attention_heads: int = 9
    num_key_value_heads: int = 3
    head_dim: int | None = None
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    sliding_window: int | None = None  # the window of the layers `layer_types` names sliding (all, if it names none)
    layer_types: list[str] | None = None  # per layer: "full_attention" or "sliding_attention" (Gemma's alternation)
    hidden_act: str = "silu"
    # Gemma: attention scale 1/sqrt(query_pre_attn_scalar), tanh soft caps on attention and final logits, and the
    # RoPE base of the sliding layers (Gemma 3; the global layers use rope_theta and rope_scaling)
    query_pre_attn_scalar: float | None = None
    attn_logit_softcapping: float | None = None
    final_logit_softcapping: float | None = None
    rope_local_base_freq: float | None = None
    partial_rotary_factor: float = 1.0  # RoPE turns only the first fraction of each head (Phi-4-mini: 0.75)
    # mixture of experts (Mixtral calls num_experts num_local_experts; its experts are intermediate_size wide)
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int | None = None
    norm_topk_prob: bool = False
    decoder_sparse_step: int = 1
    mlp_only_layers: list[int] = field(default_factory=list)
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    extra: dict = field(default_factory=dict, repr=False)

    def __post_init__(self):
        if self.architecture not in SUPPORTED_ARCHITECTURES:
            raise ValueError(
                f"unsupported architecture {self.architecture!r}; the lab's model implements "
                f"{', '.join(SUPPORTED_ARCHITECTURES)}"
            )
        if self.head_dim is None:
            if self.hidden_size % self.num_attention_heads:
                raise ValueError(
                    f"hidden_size {self.hidden_size} is not divisible by num_attention_heads "
                    f"{self.num_attention_heads} and the config gives no head_dim"
                )
            self.head_dim = self.hidden_size // self.num_attention_heads
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads {self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads {self.num_key_value_heads}"
            )
        rope_type = (self.rope_scaling or {}).get("rope_type", (self.rope_scaling or {}).get("type", "default"))
        if rope_type not in SUPPORTED_ROPE_TYPES:
            raise ValueError(f"unsupported rope_scaling type {rope_type!r}; supported: {SUPPORTED_ROPE_TYPES}")
        if self.hidden_act != self.family.activation:  # the gate's activation: SiLU (SwiGLU), Gemma's tanh GELU
            raise ValueError(f"unsupported hidden_act {self.hidden_act!r} for {self.architecture}; its gated MLP "
                             f"uses {self.family.activation!r}")
        self._check_windows()
        if not 0 < self.partial_rotary_factor <= 1 or self.rotary_dim < 2 or self.rotary_dim % 2:
            raise ValueError(f"partial_rotary_factor {self.partial_rotary_factor} must be in (0, 1] and turn an "
                             f"even number of each head's {self.head_dim} features (it turns {self.rotary_dim})")
        if self.family.mlp == "moe":
            self._check_experts()

    def _check_windows(self) -> None:
        if self.layer_types is None and self.sliding_window is not None and self.family.window_every:
            every = self.family.window_every  # Gemma's pattern: every k-th layer (1-based) global, the rest local
            self.layer_types = [LAYER_TYPES[bool((i + 1) % every)] for i in range(self.num_hidden_layers)]
        if self.layer_types is not None:
            self.layer_types = list(self.layer_types)
            # at least: a pipeline stage's config keeps the whole model's list (its layers index it, as they do
            # mlp_only_layers)
            if len(self.layer_types) < self.num_hidden_layers or not set(self.layer_types) <= set(LAYER_TYPES):
                raise ValueError(f"layer_types must name one of {LAYER_TYPES} for each of the "
                                 f"{self.num_hidden_layers} layers, got {self.layer_types}")
        if self.sliding_window is not None and self.sliding_window < 1:
            raise ValueError(f"sliding_window {self.sliding_window} must be >= 1")

    def _check_experts(self) -> None:
        self.mlp_only_layers = list(self.mlp_only_layers or [])
        if self.moe_intermediate_size is None:  # Mixtral's experts are as wide as a dense MLP
            self.moe_intermediate_size = self.intermediate_size
        if self.num_experts < 1:
            raise ValueError(f"{self.architecture} needs num_experts >= 1, got {self.num_experts}")
        if not 1 <= self.num_experts_per_tok <= self.num_experts:
            raise ValueError(f"num_experts_per_tok {self.num_experts_per_tok} must be in [1, num_experts "
                             f"{self.num_experts}]")
        if self.decoder_sparse_step < 1:
            raise ValueError(f"decoder_sparse_step {self.decoder_sparse_step} must be >= 1 (every k-th layer is "
                             f"sparse)")

    @property
    def family(self) -> Family:
        return FAMILIES[self.architecture]

    @property
    def rotary_dim(self) -> int:
        """Features of each head that RoPE turns: the first `partial_rotary_factor` of them (as transformers
        rounds it: int(head_dim * factor)); the rest pass through unrotated."""
        return int(self.head_dim * self.partial_rotary_factor)

    def layer_window(self, layer: int) -> int | None:
        """The sliding window of decoder layer `layer` (its index in the whole model), None for global attention:
        every layer has the config's window unless `layer_types` names it "full_attention"."""
        if self.sliding_window is None or (self.layer_types and self.layer_types[layer] == "full_attention"):
            return None
        return self.sliding_window

    def is_moe_layer(self, layer: int) -> bool:
        """Whether decoder layer `layer` has a mixture of experts rather than a dense MLP: every
        `decoder_sparse_step`-th layer (1-based) outside `mlp_only_layers`, as Qwen3-MoE's config says."""
        return (self.family.mlp == "moe" and layer not in self.mlp_only_layers
                and (layer + 1) % self.decoder_sparse_step == 0)

    @property
    def num_queries_per_kv(self) -> int:
        return self.num_attention_heads // self.num_key_value_heads

    @property
    def eos_token_ids(self) -> list[int]:
        if self.eos_token_id is None:
            return []
        return list(self.eos_token_id) if isinstance(self.eos_token_id, list) else [self.eos_token_id]

    @classmethod
    def from_hf_dict(cls, d: dict) -> ModelConfig:
        # A config without `architectures` (transformers' config classes leave it unset) is named by its model_type.
        by_type = {f.model_type: arch for arch, f in FAMILIES.items()}
        archs = d.get("architectures") or [by_type.get(d.get("model_type"), d.get("model_type", "?"))]
        known = {f for f in cls.__dataclass_fields__ if f not in ("architecture", "extra")}
        kwargs = {k: d[k] for k in known if k in d}
        # transformers 5 moves rope_theta (and the partial rotary factor) into `rope_parameters`; accept both.
        rope_params = d.get("rope_parameters") or {}
        if "full_attention" in rope_params or "sliding_attention" in rope_params:
            rope_params = _split_rope_by_layer_type(rope_params, kwargs)  # Gemma 3: one RoPE per kind of layer
        if d.get("use_bidirectional_attention"):  # EmbeddingGemma's encoder, in a Gemma 3 text config
            raise ValueError("use_bidirectional_attention: the lab's model is a causal decoder")
        if "hidden_activation" in d:  # Gemma's name for the MLP's activation (what transformers' Gemma MLP reads)
            kwargs["hidden_act"] = d["hidden_activation"]
        if "layer_types" not in kwargs and "sliding_window_pattern" in d and d.get("sliding_window"):
            every = d["sliding_window_pattern"]  # Gemma 3 configs before layer_types: every k-th layer global
            kwargs["layer_types"] = [LAYER_TYPES[bool((i + 1) % every)] for i in range(d["num_hidden_layers"])]
        for name in ("rope_theta", "partial_rotary_factor"):
            if name not in kwargs and name in rope_params:
                kwargs[name] = rope_params[name]
        if kwargs.get("rope_scaling") is None and rope_params.get("rope_type", "default") != "default":
            kwargs["rope_scaling"] = rope_params
        if not d.get("use_sliding_window", True):
            kwargs["sliding_window"] = None
        if "num_experts" not in kwargs and "num_local_experts" in d:  # Mixtral's name (and transformers 5's)
            kwargs["num_experts"] = d["num_local_experts"]
        defaults = FAMILIES[archs[0]].config_defaults if archs[0] in FAMILIES else {}
        for name, value in defaults.items():
            kwargs.setdefault(name, value)  # what the family's config.json leaves implicit
        return cls(architecture=archs[0], extra={k: v for k, v in d.items() if k not in known}, **kwargs)

    @classmethod
    def from_json(cls, path: str | Path) -> ModelConfig:
        """A `config.json`; a `generation_config.json` beside it adds its EOS ids, which is where chat models list
        the end-of-turn tokens (Llama 3 Instruct: config.json names 128001, generation_config.json 128001, 128008
        and 128009); transformers' `generate` stops at those, and so does the engine."""
        path = Path(path)
        d = json.loads(path.read_text())
        generation = path.with_name("generation_config.json")
        if generation.exists():
            extra = json.loads(generation.read_text()).get("eos_token_id")
            if extra is not None:
                ids = [*_as_list(d.get("eos_token_id")), *_as_list(extra)]
                d["eos_token_id"] = list(dict.fromkeys(ids))  # both, in order, once each
        return cls.from_hf_dict(d)

    def to_hf_dict(self) -> dict:
        d = {k: v for k, v in asdict(self).items() if k not in ("architecture", "extra")}
        d["architectures"] = [self.architecture]
        d["model_type"] = self.family.model_type
        rope = {"rope_type": "default", "rope_theta": self.rope_theta, **(self.rope_scaling or {})}
        if self.partial_rotary_factor == 1.0:
            del d["partial_rotary_factor"]
        else:
            rope["partial_rotary_factor"] = self.partial_rotary_factor
        d["rope_parameters"] = rope
        for name in OPTIONAL_FIELDS:  # only the families that have them write them
            if d[name] is None:
                del d[name]
        if self.family.mlp == "moe":
            d["num_local_experts"] = self.num_experts  # the name transformers 5 and lab.memory read
        else:
            for name in MOE_FIELDS:
                del d[name]
        return d


def _split_rope_by_layer_type(rope_params: dict, kwargs: dict) -> dict:
    """Gemma 3's `rope_parameters` hold one RoPE per kind of layer: the global layers' (returned, read as any
    family's) and the sliding layers' base (`rope_local_base_freq`), which must be unscaled, as Gemma 3's is."""
    local = rope_params.get("sliding_attention") or {}
    if local.get("rope_type", "default") != "default":
        raise ValueError(f"unsupported rope_type {local['rope_type']!r} on the sliding layers; the lab scales only "
                         f"the global layers' RoPE")
    if "rope_theta" in local:
        kwargs.setdefault("rope_local_base_freq", local["rope_theta"])
    return rope_params.get("full_attention") or {}


def _as_list(ids) -> list:
    return [] if ids is None else list(ids) if isinstance(ids, (list, tuple)) else [ids]
