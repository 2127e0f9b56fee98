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

The other families the lab runs (Qwen3, OLMo 2, Phi-3, Mixtral, Qwen3-MoE, Gemma 2 and 3) are this block with
the differences their `Family` states (`lab.models.families`): q/k norms in `Attention`, the norm layout in
`DecoderLayer`, a mixture of experts (`lab.models.moe`) in place of the MLP, checkpoint names in
`load_hf_state_dict`, Gemma's (1 + weight) norms, scaled embeddings, GeGLU, attention scale and soft caps.

What a layer's attention is beyond softmax(q k^T / sqrt(d)) v over its causal context — a sliding window, a soft
cap on the logits — is stated by the model (`LlamaModel.attention_layout`) for the attention context to apply:
where the keys live decides how a window is cut (the paged cache frees blocks outside it). A query scale other than
1/sqrt(d) (Gemma's query_pre_attn_scalar) is folded into q, so every backend computes it unchanged.
"""

from __future__ import annotations

import math
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from .attention import AttentionLayout
from .config import ModelConfig
from .moe import SparseMoE


class AttentionContext(Protocol):
    """Where a layer's keys and values go and how its queries read them.

    `attend` gets q [T, n_heads, d] and k, v [T, n_kv_heads, d] of this step's tokens, after RoPE,
    stores k and v in its cache for `layer`, and returns [T, n_heads, d]: each query attending
    causally over its sequence's cached tokens and the new ones up to itself.
    """

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor: ...


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, offset: float = 0.0):
        super().__init__()
        self.eps, self.offset = eps, offset
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x / rms(x) * (offset + weight), computed in float32 whatever the activation dtype; Gemma's offset of 1
        # is added in float32 too, then the product rounds once (transformers' Gemma2RMSNorm order).
        w = self.weight.float() + self.offset if self.offset else self.weight.float()
        return F.rms_norm(x.float(), self.weight.shape, w, self.eps).to(x.dtype)


def rms_norm(config: ModelConfig, dim: int) -> RMSNorm:
    return RMSNorm(dim, config.rms_norm_eps, config.family.norm_offset)


def rope_inv_freq(config: ModelConfig, local: bool = False) -> torch.Tensor:
    """Inverse frequencies theta^(-2i/d) over the d = `rotary_dim` features RoPE turns, with Llama 3's
    frequency-dependent scaling or linear position interpolation (positions / factor; Gemma 3's global layers) if
    configured. `local`: Gemma 3's sliding layers, with their own base and no scaling."""
    d = config.rotary_dim
    theta = config.rope_local_base_freq if local else config.rope_theta
    inv_freq = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    scaling = {} if local else config.rope_scaling or {}
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind == "linear":
        inv_freq = inv_freq / scaling["factor"]
    if kind == "llama3":
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
    """Rotates pairs (i, i + d/2) of each head's first d = `rotary_dim` features by position * inv_freq[i] (the
    Hugging Face layout); with a partial rotary factor (Phi-4-mini) the features after d pass unrotated. Gemma 3's
    sliding layers turn by another base: a second table, whose (cos, sin) follow the global one's in `forward`."""

    def __init__(self, config: ModelConfig, max_positions: int):
        super().__init__()
        self.config, self.max_positions = config, max_positions
        self.tables = ("",) if config.rope_local_base_freq is None else ("", "_local")
        for t in self.tables:
            self.register_buffer("cos" + t, torch.empty(max_positions, config.rotary_dim // 2), persistent=False)
            self.register_buffer("sin" + t, torch.empty(max_positions, config.rotary_dim // 2), persistent=False)
        self.reset_tables()

    def reset_tables(self) -> None:
        """(Re)compute the cos/sin tables, e.g. after the model was built on the meta device."""
        if self.cos.is_meta:
            return
        pos = torch.arange(self.max_positions, dtype=torch.float32, device=self.cos.device)
        for t in self.tables:
            freqs = torch.outer(pos, rope_inv_freq(self.config, local=bool(t)).to(pos.device))
            getattr(self, "cos" + t).copy_(freqs.cos())
            getattr(self, "sin" + t).copy_(freqs.sin())

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, cos) and (-sin, sin) [T, 1, d] for `positions`, built once per forward for all layers. The bound
        is checked for host positions only: reading device positions back would stall every forward (and a
        compiled graph cannot), so the engine checks max_model_len against the table once, when it starts."""
        if (positions.device.type == "cpu" and not torch.compiler.is_compiling() and positions.numel()
                and int(positions.max()) >= self.max_positions):
            raise ValueError(f"position {int(positions.max())} is beyond the rotary table of {self.max_positions}")
        out = ()
        for t in self.tables:
            cos, sin = getattr(self, "cos" + t)[positions].unsqueeze(1), getattr(self, "sin" + t)[positions].unsqueeze(1)
            out += (torch.cat((cos, cos), -1), torch.cat((-sin, sin), -1))
        return out


def apply_rope(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """[x1, x2] -> [x1 cos - x2 sin, x2 cos + x1 sin], as x * cos + [x2, x1] * [-sin, sin], over the first
    cos.shape[-1] features of each head; any after them (a partial rotary factor) pass through."""
    rot = cos.shape[-1]
    if rot < x.shape[-1]:
        return torch.cat((apply_rope(x[..., :rot], cos, signed_sin), x[..., rot:]), -1)
    xf = x.float()
    half = xf.shape[-1] // 2
    return torch.addcmul(xf * cos, torch.cat((xf[..., half:], xf[..., :half]), -1), signed_sin).to(x.dtype)


class Attention(nn.Module):
    """`layer`: the index of the KV pool it writes; `model_layer`: its index in the whole model (its window)."""

    def __init__(self, config: ModelConfig, layer: int, model_layer: int | None = None):
        super().__init__()
        self.layer = layer
        self.window = config.layer_window(layer if model_layer is None else model_layer)
        self.local_rope = self.window is not None and config.rope_local_base_freq is not None
        # Gemma scales scores by 1/sqrt(query_pre_attn_scalar): q times sqrt(d / scalar), and 1/sqrt(d) as usual.
        scalar = config.query_pre_attn_scalar
        self.q_scale = 1.0 if scalar is None or scalar == config.head_dim else (config.head_dim / scalar) ** 0.5
        self.n_heads, self.n_kv, self.d = config.num_attention_heads, config.num_key_value_heads, config.head_dim
        self.q_size, self.kv_size = self.n_heads * self.d, self.n_kv * self.d
        self.qkv_proj = nn.Linear(config.hidden_size, self.q_size + 2 * self.kv_size, bias=config.attention_bias)
        self.o_proj = nn.Linear(self.q_size, config.hidden_size, bias=False)
        # q/k norms before RoPE: over each head's d features (Qwen3), or over all heads' at once (OLMo 2).
        self.qk_norm = config.family.qk_norm
        if self.qk_norm != "none":
            per_head = self.qk_norm == "per_head"
            self.q_norm = rms_norm(config, self.d if per_head else self.q_size)
            self.k_norm = rms_norm(config, self.d if per_head else self.kv_size)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], ctx: AttentionContext) -> torch.Tensor:
        qkv = self.qkv_proj(x)
        qk = qkv[:, :self.q_size + self.kv_size]
        if self.qk_norm == "full":
            qk = torch.cat((self.q_norm(qk[:, :self.q_size]), self.k_norm(qk[:, self.q_size:])), -1)
        qk = qk.view(-1, self.n_heads + self.n_kv, self.d)
        if self.qk_norm == "per_head":
            qk = torch.cat((self.q_norm(qk[:, :self.n_heads]), self.k_norm(qk[:, self.n_heads:])), 1)
        # q and k sit side by side in qkv: rotate them in one pass, as heads n_heads + n_kv.
        q, k = apply_rope(qk, *(rope[2:] if self.local_rope else rope[:2])).split([self.n_heads, self.n_kv], dim=1)
        if self.q_scale != 1.0:
            q = q * self.q_scale
        out = ctx.attend(self.layer, q, k, qkv[:, self.q_size + self.kv_size:].view(-1, self.n_kv, self.d))
        return self.o_proj(out.reshape(-1, self.q_size))


class MLP(nn.Module):
    """down(act(gate(x)) * up(x)): SwiGLU with SiLU, GeGLU with GELU's tanh approximation (Gemma)."""

    def __init__(self, hidden_size: int, intermediate_size: int, activation: str = "silu"):
        super().__init__()
        self.gate_up_proj = nn.Linear(hidden_size, 2 * intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)
        self.gelu = activation == "gelu_pytorch_tanh"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj((F.gelu(gate, approximate="tanh") if self.gelu else F.silu(gate)).mul_(up))


def feed_forward(config: ModelConfig, layer: int) -> nn.Module:
    """Layer `layer`'s MLP: a mixture of SwiGLU experts where the config makes the layer sparse, else one."""
    if not config.is_moe_layer(layer):
        return MLP(config.hidden_size, config.intermediate_size, config.hidden_act)
    experts = [MLP(config.hidden_size, config.moe_intermediate_size) for _ in range(config.num_experts)]
    return SparseMoE(config.hidden_size, experts, config.num_experts_per_tok, config.norm_topk_prob)


class DecoderLayer(nn.Module):
    """Pre-norm (Llama): x + attn(norm(x)), then + mlp(norm(.)). Post-norm (OLMo 2): x + norm(attn(x)), then
    + norm(mlp(.)), with no norm on the block's input. Sandwich (Gemma 2 and 3): both, x + norm(attn(norm(x))),
    then + norm(mlp(norm(.))). The module names are the checkpoints'. `layer` is the layer's index in the whole
    model (whether its MLP is sparse, its window), `kv_layer` its index in the KV pool it writes (another for a
    pipeline stage, whose pool holds its own layers only)."""

    def __init__(self, config: ModelConfig, layer: int, kv_layer: int | None = None):
        super().__init__()
        layout, h = config.family.norm_layout, config.hidden_size
        self.pre, self.post = layout != "post", layout != "pre"
        if self.pre:
            self.input_layernorm = rms_norm(config, h)
        self.self_attn = Attention(config, layer if kv_layer is None else kv_layer, layer)
        self.post_attention_layernorm = rms_norm(config, h)  # Llama's name for the MLP's input norm
        if layout == "sandwich":
            self.pre_feedforward_layernorm = rms_norm(config, h)
        if self.post:
            self.post_feedforward_layernorm = rms_norm(config, h)
        self.mlp = feed_forward(config, layer)

    def forward(self, x, rope, ctx):
        if not self.post:
            x = x + self.self_attn(self.input_layernorm(x), rope, ctx)
            return x + self.mlp(self.post_attention_layernorm(x))
        x = x + self.post_attention_layernorm(self.self_attn(self.input_layernorm(x) if self.pre else x, rope, ctx))
        return x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x) if self.pre else x))


class LlamaModel(nn.Module):
    def __init__(self, config: ModelConfig, max_positions: int | None = None, first_layer: int = 0):
        """`config.num_hidden_layers` layers; `first_layer`: the whole model's index of the first (a pipeline
        stage holds layers first_layer ..), which decides which of them are sparse."""
        super().__init__()
        self.config = config
        self.rope = RotaryEmbedding(config, max_positions or config.max_position_embeddings)
        self.embed_tokens = (ScaledEmbedding if config.family.embed_scale else Embedding)(config.vocab_size,
                                                                                          config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, first_layer + i, kv_layer=i)
                                    for i in range(config.num_hidden_layers))
        self.norm = rms_norm(config, config.hidden_size)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.tie_weights()

    @classmethod
    def empty(cls, config: ModelConfig, device: torch.device | str, max_positions: int | None = None,
              first_layer: int = 0) -> "LlamaModel":
        """A model whose parameters are uninitialised storage on `device`, to be filled by `load_state_dict(...,
        assign=True)` or `load_hf_state_dict`; the rotary tables are computed. Built on the meta device, so no
        initialisation runs, and materialised with `torch.empty` by shape: `Module.to_empty`'s `empty_like` of a
        meta tensor runs a Python reference that imports torch.fx's symbolic shapes (0.6 s of a fresh process)."""
        with torch.device("meta"):
            net = cls(config, max_positions, first_layer)
        net = net._apply(lambda t: torch.empty(t.shape, dtype=t.dtype, device=device))
        net.rope.reset_tables()
        return net

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

    @property
    def attention_layout(self) -> AttentionLayout:
        """What each layer's attention adds to plain causal attention (windows, a soft cap), for the contexts."""
        return AttentionLayout(tuple(layer.self_attn.window for layer in self.layers),
                               self.config.attn_logit_softcapping)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits in float32, computed only for the rows asked for (the engine passes last tokens); Gemma 2 caps
        them softly, cap * tanh(logits / cap)."""
        logits = self.lm_head(hidden).float()
        cap = self.config.final_logit_softcapping
        return logits if cap is None else torch.tanh(logits / cap) * cap

    def load_hf_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Load Hugging Face names (q_proj, k_proj, v_proj, gate_proj, up_proj), fusing as we go; the family's
        `checkpoint_names` first rename what it calls otherwise. Already fused matrices (Phi-3's qkv_proj and
        gate_up_proj) carry the lab's own names and load as they are."""
        tensors, parts = {}, {}
        renames = self.config.family.checkpoint_names
        for name, w in state.items():
            *module, proj, kind = (renames.get(p, p) for p in name.removeprefix("model.").split("."))
            if proj in FUSED_INTO:
                target, i = FUSED_INTO[proj]
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


class Embedding(nn.Embedding):
    """`nn.Embedding` that leaves a weight on the meta device uninitialised (it has no values to set): on meta,
    `nn.Embedding`'s `normal_` runs a Python reference that imports torch._dynamo, 1.7 s of every fresh process
    that builds a model there (`LlamaModel.empty`) and never compiles."""

    def reset_parameters(self) -> None:
        if not self.weight.is_meta:
            super().reset_parameters()


class ScaledEmbedding(Embedding):
    """Embeddings times sqrt(hidden_size) (Gemma), the factor rounded to the weights' dtype first, as transformers'
    Gemma2TextScaledWordEmbedding does (sqrt(3072) = 55.43 becomes 55.5 in bfloat16)."""

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = super().forward(input_ids)
        return x * torch.tensor(self.embedding_dim ** 0.5, dtype=x.dtype, device=x.device)


# Hugging Face projection name -> (the lab's fused matrix, position of its rows in it).
FUSED_INTO = {"q_proj": ("qkv_proj", 0), "k_proj": ("qkv_proj", 1), "v_proj": ("qkv_proj", 2),
               "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1)}
