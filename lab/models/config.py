"""Model shape: the few numbers of a Llama-family `config.json` that the lab's model needs.

The fields follow Hugging Face's names so a `config.json` maps onto them directly. `head_dim` is
taken from the config when present and only otherwise derived as hidden_size / num_attention_heads
(several models, Gemma and Qwen3 among them, have a head_dim that is not that quotient).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

# Architectures the lab's model implements: the Llama block (RMSNorm, RoPE, GQA, SwiGLU), with
# Qwen2's bias on the q/k/v projections and Mistral's sliding window only where it never binds.
SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM")
SUPPORTED_ROPE_TYPES = ("default", "llama3")


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
    sliding_window: int | None = None
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
        archs = d.get("architectures") or [d.get("model_type", "?")]
        known = {f for f in cls.__dataclass_fields__ if f not in ("architecture", "extra")}
        kwargs = {k: d[k] for k in known if k in d}
        # transformers 5 moves rope_theta into `rope_parameters`; accept both spellings.
        rope_params = d.get("rope_parameters") or {}
        if "rope_theta" not in kwargs and "rope_theta" in rope_params:
            kwargs["rope_theta"] = rope_params["rope_theta"]
        if kwargs.get("rope_scaling") is None and rope_params.get("rope_type", "default") != "default":
            kwargs["rope_scaling"] = rope_params
        if not d.get("use_sliding_window", True):
            kwargs["sliding_window"] = None
        if archs[0] == "Qwen2ForCausalLM":  # Qwen2 always has q/k/v biases; its config does not say so
            kwargs.setdefault("attention_bias", True)
        return cls(architecture=archs[0], extra={k: v for k, v in d.items() if k not in known}, **kwargs)

    @classmethod
    def from_json(cls, path: str | Path) -> ModelConfig:
        return cls.from_hf_dict(json.loads(Path(path).read_text()))

    def to_hf_dict(self) -> dict:
        d = {k: v for k, v in asdict(self).items() if k not in ("architecture", "extra")}
        d["architectures"] = [self.architecture]
        d["model_type"] = {"LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral",
                           "Qwen2ForCausalLM": "qwen2"}[self.architecture]
        d["rope_parameters"] = {"rope_type": "default", "rope_theta": self.rope_theta, **(self.rope_scaling or {})}
        return d
