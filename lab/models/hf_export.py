"""The lab's model as `transformers` holds it: the same weights under Hugging Face's names, in transformers' own
model class, so `transformers` can run a model that exists only in the lab (random weights of a preset shape).

The inverse of `LlamaModel.load_hf_state_dict`: the fused `qkv_proj` splits back into q, k and v (rows
n_heads * d, n_kv * d, n_kv * d) and `gate_up_proj` into gate and up, and the lab's module names get the
`model.` prefix. `lab bench engine` uses it to time `transformers` on a `random:` model beside the engine on
identical weights, with no checkpoint to carry (the GPU run; issue 38).
"""

from __future__ import annotations

import torch

from .llama import FUSED_INTO

# The architectures whose Hugging Face checkpoint is the Llama layout with q/k/v and gate/up apart.
EXPORTABLE = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM")
# The loader's table read backwards: each fused matrix -> the Hugging Face projections it holds, in row order.
UNFUSED: dict[str, list[str]] = {}
for _name, (_target, _row) in sorted(FUSED_INTO.items(), key=lambda item: item[1]):
    UNFUSED.setdefault(_target, []).append(_name)


def hf_state_dict(net) -> dict[str, torch.Tensor]:
    """`net`'s weights under Hugging Face's names (contiguous copies; the rotary tables left out)."""
    c = net.config
    q, kv = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
    out = {}
    for name, t in net.state_dict().items():
        if name.startswith("rope."):
            continue
        module, _, kind = name.rpartition(".")
        parent, _, leaf = module.rpartition(".")
        prefix = "" if name.startswith("lm_head.") else "model."
        sizes = {"qkv_proj": [q, kv, kv], "gate_up_proj": [t.shape[0] // 2] * 2}.get(leaf)
        parts = dict(zip(UNFUSED[leaf], t.split(sizes))) if sizes else {leaf: t}
        for leaf_name, part in parts.items():
            key = ".".join(p for p in (parent, leaf_name, kind) if p)
            out[prefix + key] = part.contiguous()
    if c.tie_word_embeddings:
        out.pop("lm_head.weight", None)
    return out


def to_transformers(net):
    """transformers' causal LM of `net`'s architecture holding `net`'s weights, on its device and in its dtype."""
    from transformers import AutoConfig, AutoModelForCausalLM

    c = net.config
    if c.architecture not in EXPORTABLE:
        raise ValueError(f"cannot hand a {c.architecture} to transformers yet; exportable: {', '.join(EXPORTABLE)}")
    d = c.to_hf_dict()
    config = AutoConfig.for_model(d.pop("model_type"), **d)
    weight = net.embed_tokens.weight
    with torch.device(weight.device):  # built where the weights are: an 8B model's init is quick on a GPU only
        hf = AutoModelForCausalLM.from_config(config, dtype=weight.dtype)
    missing, unexpected = hf.load_state_dict(hf_state_dict(net), strict=False)
    missing = [m for m in missing if not (m == "lm_head.weight" and c.tie_word_embeddings)]
    if missing or unexpected:
        raise ValueError(f"the exported weights do not fit transformers' model: missing {missing[:5]}, "
                         f"unexpected {unexpected[:5]}")
    return hf.eval()
