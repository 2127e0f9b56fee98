"""Gemma 2 and 3 beyond the family tests of `test_model_families`: configs as the Hub has them (Gemma 3's from before
`layer_types`), read as transformers reads them, and what the engine refuses for them by name."""

import pytest
from test_model_families import COMMON, hf_config, save_tiny_hf

from lab.engine import LLM
from lab.models import ModelConfig


@pytest.mark.parametrize("legacy", [
    dict(sliding_window_pattern=3, rope_theta=5e5, rope_local_base_freq=2e4,
         rope_scaling={"rope_type": "linear", "factor": 8.0}),  # a Gemma 3 config.json from before layer_types
    dict(rope_theta=1e6),  # the default pattern, one global layer in six
])
def test_legacy_gemma3_configs_read_as_transformers_reads_them(legacy):
    import transformers as tf

    shape = dict(COMMON, num_hidden_layers=7, head_dim=16, sliding_window=24)
    theirs = tf.Gemma3TextConfig(**shape, **legacy)
    ours = ModelConfig.from_hf_dict({"architectures": ["Gemma3ForCausalLM"], **shape, **legacy})
    full, local = theirs.rope_parameters["full_attention"], theirs.rope_parameters["sliding_attention"]
    assert ours.layer_types == theirs.layer_types and "full_attention" in ours.layer_types
    assert (ours.rope_theta, ours.rope_local_base_freq) == (full["rope_theta"], local["rope_theta"])
    assert (ours.rope_scaling or {}).get("factor") == full.get("factor")
    assert [ours.layer_window(i) for i in range(7)] == [24 if t == "sliding_attention" else None
                                                        for t in theirs.layer_types]


@pytest.mark.parametrize("family, options, named", [
    ("gemma3", dict(tensor_parallel_size=2, max_model_len=16), "scales the embeddings|scale the embeddings"),
    ("gemma2", dict(pipeline_parallel_size=3, max_model_len=16), "soft-capped attention"),
    ("gemma3", dict(pipeline_parallel_size=3, max_model_len=64), "sliding windows"),
    ("gemma2", dict(attention_backend="triton", max_model_len=16), "triton.*soft-capped"),
])
def test_engine_refuses_what_cannot_carry_gemma(tmp_path, family, options, named):
    """A parallel group's workers attend without the model's windows and soft cap, the vocabulary-parallel embedding
    does not scale, and the Triton kernels have neither: each refused by name before any worker starts."""
    save_tiny_hf(tmp_path, hf_config(family))
    with pytest.raises(ValueError, match=named):
        LLM(str(tmp_path), device="cpu", dtype="float32", **options)
