"""A small random-weight 16-bit checkpoint, in Hugging Face's format and with a real tokenizer: a stand-in for "your
model" that needs no download (issue 51).

The embedded SmolLM2-135M's weights are a dequantized Q4_1 GGUF, already on a 4-bit grid, so nothing measured on it
says what quantizing a 16-bit model costs. A checkpoint written here is what a user's own model looks like to the
workbench: config.json and safetensors in bfloat16 (or float16), built by transformers from its own config class
(`transformers.LlamaConfig`, `Qwen3Config`, ...), beside the embedded model's tokenizer and chat template, so every
notebook, the text ones too, runs on it through `lab run all --model DIR`. Its weights are random (matrices
~ N(0, 0.02) as Llama's initialisation, norms at 1): what it measures is the workbench's path, not a model's
quality.
"""

from __future__ import annotations

import shutil
from pathlib import Path

# transformers' config class of each family, and what the family adds to the shared shape
FAMILIES = {"llama": ("LlamaConfig", {}), "qwen3": ("Qwen3Config", {"head_dim": 32}),
            "qwen2": ("Qwen2Config", {}), "mistral": ("MistralConfig", {"sliding_window": None})}
DTYPES = ("bfloat16", "float16")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def write_random_checkpoint(out_dir: str | Path, family: str = "llama", dtype: str = "bfloat16",
                            hidden_size: int = 64, num_layers: int = 4, num_heads: int = 4, num_kv_heads: int = 2,
                            intermediate_size: int = 128, max_positions: int = 8192, seed: int = 0) -> Path:
    """Write a random-weight `family` model of this shape, stored in `dtype`, with the embedded model's tokenizer
    (its vocabulary sets the model's) into `out_dir`, and return the directory. Sizes default to a model of about
    3.4M parameters (the 49,152-token embedding, tied, is most of it) that every notebook runs at smoke in seconds."""
    import torch
    import transformers

    from lab.models.loader import resolve_model_dir

    if family not in FAMILIES:
        raise ValueError(f"family {family!r} is not one of {sorted(FAMILIES)}")
    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r} is not one of {list(DTYPES)}: a 16-bit checkpoint")
    source = resolve_model_dir("smollm2-135m")  # the tokenizer's home; its config gives the special tokens
    embedded = transformers.AutoConfig.from_pretrained(source, local_files_only=True)
    name, extra = FAMILIES[family]
    config = getattr(transformers, name)(
        vocab_size=embedded.vocab_size, hidden_size=hidden_size, intermediate_size=intermediate_size,
        num_hidden_layers=num_layers, num_attention_heads=num_heads, num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_positions, tie_word_embeddings=True, bos_token_id=embedded.bos_token_id,
        eos_token_id=embedded.eos_token_id, pad_token_id=None, **extra)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        for p in model.parameters():
            torch.nn.init.normal_(p, std=0.02) if p.dim() > 1 else torch.nn.init.ones_(p)
    out = Path(out_dir)
    model.to(getattr(torch, dtype)).save_pretrained(out)
    for f in TOKENIZER_FILES:
        if (source / f).exists():
            shutil.copy(source / f, out / f)
    return out
