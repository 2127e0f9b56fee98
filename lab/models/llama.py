"""The Llama-family decoder, written for the lab: RMSNorm, RoPE, grouped-query attention, SwiGLU.

References: Touvron et al., "LLaMA" (2023) and "Llama 2" (2023); Ainslie et al., "GQA" (2023);
Su et al., "RoFormer" (RoPE, 2021); Shazeer, "GLU Variants Improve Transformer" (SwiGLU, 2020).

The model works on a flat batch: `input_ids` and `positions` are 1-D over all tokens of all
sequences in a step (no padding), as in vLLM and nano-vllm. Where the tokens go in attention is not
the model's business: each layer hands its q, k, v to an *attention context* passed to `forward`,
which stores k, v wherever its cache lives (a paged block pool in the engine, a dense tensor in
`lab.models.reference`) and returns the attention output. That is the backend interface.

q/k/v and gate/up are fused into one matrix each at load time: one GEMM instead of three (two)
on the same input, the single largest saving for a small model on a CPU.
"""

from __future__ import annotations

import math
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from .config import ModelConfig


class AttentionContext(Protocol):
    """Where a layer's keys and values go and how its queries read them.

    `attend` gets q [T, n_heads, d] and k, v [T, n_kv_heads, d] of this step's tokens, after RoPE,
    stores k and v in its cache for `layer`, and returns [T, n_heads, d]: each query attending
    causally over its sequence's cached tokens and the new ones up to itself.
    """

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor: ...


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x / rms(x) * weight, computed in float32 whatever the activation dtype.
        return F.rms_norm(x.float(), self.weight.shape, self.weight.float(), self.eps).to(x.dtype)


def rope_inv_freq(config: ModelConfig) -> torch.Tensor:
    """Inverse frequencies theta^(-2i/d), with Llama 3's frequency-dependent scaling if configured."""
    d = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    scaling = config.rope_scaling or {}
    if scaling.get("rope_type", scaling.get("type")) == "llama3":
        # Llama 3.1: keep high frequencies, divide low ones by `factor`, blend in between.
        factor, lo, hi = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
        old_len = scaling["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv_freq
        smooth = ((old_len / wavelen) - lo) / (hi - lo)
        scaled = torch.where(wavelen > old_len / lo, inv_freq / factor, inv_freq)
        mid = (wavelen <= old_len / lo) & (wavelen >= old_len / hi)
        inv_freq = torch.where(mid, (1 - smooth) * inv_freq / factor + smooth * inv_freq, scaled)
    return inv_freq.float()


class RotaryEmbedding(nn.Module):
    """Rotates pairs (i, i + d/2) of each head by position * inv_freq[i] (the Hugging Face layout)."""

    def __init__(self, config: ModelConfig, max_positions: int):
        super().__init__()
        self.config, self.max_positions = config, max_positions
        self.register_buffer("cos", torch.empty(max_positions, config.head_dim // 2), persistent=False)
        self.register_buffer("sin", torch.empty(max_positions, config.head_dim // 2), persistent=False)
        self.reset_tables()

    def reset_tables(self) -> None:
        """(Re)compute the cos/sin tables, e.g. after the model was built on the meta device."""
        if self.cos.is_meta:
            return
        pos = torch.arange(self.max_positions, dtype=torch.float32, device=self.cos.device)
        freqs = torch.outer(pos, rope_inv_freq(self.config).to(pos.device))
        self.cos.copy_(freqs.cos())
        self.sin.copy_(freqs.sin())

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, cos) and (-sin, sin) [T, 1, d] for `positions`, built once per forward for all layers. The bound
        is checked for host positions only: reading device positions back would stall every forward (and a
        compiled graph cannot), so the engine checks max_model_len against the table once, when it starts."""
        if (positions.device.type == "cpu" and not torch.compiler.is_compiling() and positions.numel()
                and int(positions.max()) >= self.max_positions):
            raise ValueError(f"position {int(positions.max())} is beyond the rotary table of {self.max_positions}")
        cos, sin = self.cos[positions].unsqueeze(1), self.sin[positions].unsqueeze(1)
        return torch.cat((cos, cos), -1), torch.cat((-sin, sin), -1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """[x1, x2] -> [x1 cos - x2 sin, x2 cos + x1 sin], as x * cos + [x2, x1] * [-sin, sin]."""
    xf = x.float()
    half = xf.shape[-1] // 2
    return torch.addcmul(xf * cos, torch.cat((xf[..., half:], xf[..., :half]), -1), signed_sin).to(x.dtype)


class Attention(nn.Module):
    def __init__(self, config: ModelConfig, layer: int):
        super().__init__()
        self.layer = layer
        self.n_heads, self.n_kv, self.d = config.num_attention_heads, config.num_key_value_heads, config.head_dim
        self.q_size, self.kv_size = self.n_heads * self.d, self.n_kv * self.d
        self.qkv_proj = nn.Linear(config.hidden_size, self.q_size + 2 * self.kv_size, bias=config.attention_bias)
        self.o_proj = nn.Linear(self.q_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], ctx: AttentionContext) -> torch.Tensor:
        qkv = self.qkv_proj(x)
        # q and k sit side by side in qkv: rotate them in one pass, as heads n_heads + n_kv.
        qk = apply_rope(qkv[:, :self.q_size + self.kv_size].view(-1, self.n_heads + self.n_kv, self.d), *rope)
        q, k = qk.split([self.n_heads, self.n_kv], dim=1)
        out = ctx.attend(self.layer, q, k, qkv[:, self.q_size + self.kv_size:].view(-1, self.n_kv, self.d))
        return self.o_proj(out.reshape(-1, self.q_size))


class MLP(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.gate_up_proj = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate).mul_(up))


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer: int):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config, layer)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config)

    def forward(self, x, rope, ctx):
        x = x + self.self_attn(self.input_layernorm(x), rope, ctx)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(nn.Module):
    def __init__(self, config: ModelConfig, max_positions: int | None = None):
        super().__init__()
        self.config = config
        self.rope = RotaryEmbedding(config, max_positions or config.max_position_embeddings)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.tie_weights()

    def tie_weights(self) -> None:
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
        """Final hidden states [T, hidden] for flat `input_ids` [T] at `positions` [T]."""
        x = self.embed_tokens(input_ids)
        rope = self.rope(positions)
        for layer in self.layers:
            x = layer(x, rope, ctx)
        return self.norm(x)

    def store_weights_transposed(self) -> None:
        """Keep each layer's [out, in] weight as a view of a contiguous [in, out] tensor.

        F.linear then runs x @ W_t on contiguous memory, which MKL does 1.2-1.5x faster than
        x @ W^T for the 32-row matrices of batched decoding on a CPU (measured here). The logical
        shape and the nn.Linear interface are unchanged. The LM head keeps the embedding's layout.
        """
        for module in self.layers.modules():
            if isinstance(module, nn.Linear):
                module.weight = nn.Parameter(module.weight.detach().t().contiguous().t(), requires_grad=False)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits in float32, computed only for the rows asked for (the engine passes last tokens)."""
        return self.lm_head(hidden).float()

    def load_hf_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Load Hugging Face names (q_proj, k_proj, v_proj, gate_proj, up_proj), fusing as we go."""
        tensors, parts = {}, {}
        for name, w in state.items():
            *module, proj, kind = name.removeprefix("model.").split(".")
            if proj in _FUSED_INTO:
                target, i = _FUSED_INTO[proj]
                parts.setdefault(".".join([*module, target, kind]), {})[i] = w
            else:
                tensors[".".join([*module, proj, kind])] = w
        for key, p in parts.items():
            tensors[key] = torch.cat([p[i] for i in sorted(p)])
        if self.config.tie_word_embeddings:
            tensors.pop("lm_head.weight", None)
        missing, unexpected = self.load_state_dict(tensors, strict=False, assign=True)
        self.tie_weights()
        self.store_weights_transposed()
        missing = [m for m in missing if not (m == "lm_head.weight" and self.config.tie_word_embeddings)]
        if missing or unexpected:
            raise ValueError(f"checkpoint does not match the model: missing {missing[:5]}, unexpected {unexpected[:5]}")


# Hugging Face projection name -> (the lab's fused matrix, position of its rows in it).
_FUSED_INTO = {"q_proj": ("qkv_proj", 0), "k_proj": ("qkv_proj", 1), "v_proj": ("qkv_proj", 2),
               "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1)}
