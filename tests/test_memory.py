"""The memory account: published parameter counts, the articles' worked examples (recomputed, and
corrected where they are wrong), exact bytes of a real GGUF file and of the engine's allocations."""

import json
import math
import subprocess
import sys

import pytest
import torch

from claims_shape import assert_one_shape

from lab.memory import (GIB, ModelShape, capacity, kv_bytes_per_token, kv_cache_bytes,
                        kv_elements_per_token_per_layer, lognormal_from_percentiles, lognormal_lengths,
                        memory_for_concurrency, memory_report, param_counts, paging_waste, weight_bytes,
                        weight_bytes_for_params, weight_format)

PRESETS = ["smollm2-135m", "llama-2-7b", "llama-3-8b", "llama-3-70b", "qwen2.5-7b", "qwen2.5-72b", "mistral-7b",
           "mixtral-8x7b", "deepseek-v3", "gemma-2-9b"]


@pytest.mark.parametrize("name", PRESETS)
def test_parameter_count_matches_published_total_within_1_percent(name):
    s = ModelShape.preset(name)
    assert s.published_params, f"{name} preset has no published total to check against"
    assert abs(param_counts(s)["total"] / s.published_params - 1) < 0.01


def test_moe_active_parameters():
    s = ModelShape.preset("mixtral-8x7b")
    c = param_counts(s)
    assert abs(c["active"] / s.published_active_params - 1) < 0.01  # 12.9 B of 46.7 B
    assert c["active"] < c["total"] / 3


def test_head_dim_is_taken_from_the_config_not_derived():
    s = ModelShape.preset("gemma-2-9b")  # 16 heads x 256 = 4096 != hidden 3584
    assert s.head_dim == 256 and s.num_heads * s.head_dim != s.hidden_size


def test_deployment_article_worked_example():
    """003 section 6.2: 70e9 parameters at 0.55 B/param, 32 layers, 8 KV heads, head_dim 128, fp16 KV,
    8192 tokens x 32 requests, 3 (GiB) overhead -> 35.9, 32.0, 70.9 (its prose rounds weights to 35.8)."""
    shape = ModelShape("article", vocab_size=1, hidden_size=1, intermediate_size=1, num_layers=32, num_heads=8,
                       num_kv_heads=8, head_dim=128)
    per_token = kv_bytes_per_token(shape, "fp16")
    weights = weight_bytes_for_params(70e9, 0.55) / GIB
    kv = kv_cache_bytes(shape, 8192, 32, dtype="fp16") / GIB
    assert per_token == 131072  # 128 KB per token, as the article says
    assert (round(weights, 1), round(kv, 1), round(weights + kv + 3.0, 1)) == (35.9, 32.0, 70.9)


def test_replay_article_account_corrected():
    """000 sections 1.1 and 2.2: 80 layers, 8 KV heads, head_dim 128, fp16."""
    shape = ModelShape("replay", vocab_size=1, hidden_size=1, intermediate_size=1, num_layers=80, num_heads=64,
                       num_kv_heads=8, head_dim=128)
    per_layer = kv_bytes_per_token(shape, "fp16") / 80
    assert per_layer == 4096  # the article says 8 KB: it is 8 x 128 x 2 x 2 = 4 KB
    context = kv_cache_bytes(shape, 131072, 1, dtype="fp16")
    assert context / GIB == 40.0  # not "about 1 GB"
    article_read = 80 * 131072 * (2 * 128 * 2)  # its 5.4 GB leaves out the 8 KV heads
    assert round(article_read / 1e9, 1) == 5.4 and context / article_read == 8


def test_mla_stores_one_latent_per_layer():
    s = ModelShape.preset("deepseek-v3")
    assert kv_elements_per_token_per_layer(s) == 576  # kv_lora_rank 512 + rope 64, no factor 2
    assert kv_elements_per_token_per_layer(s) != 2 * s.num_heads * s.head_dim
    assert kv_bytes_per_token(s, "bf16") == 61 * 576 * 2


def test_weight_bytes_of_the_real_gguf_file_are_exact():
    gguf = pytest.importorskip("gguf")
    from lab.models.loader import embedded_gguf_path

    reader = gguf.GGUFReader(embedded_gguf_path("smollm2-135m"))
    actual = sum(int(t.n_bytes) for t in reader.tensors)
    predicted = weight_bytes(ModelShape.preset("smollm2-135m"), "gguf-q4_1", unquantized="fp32",
                             embedding="gguf-q8_0")["total"]
    assert predicted == actual


def test_engine_allocations_match_the_account(smollm):
    from lab.engine import LLM

    model, tok = smollm
    llm = LLM(model, tokenizer=tok, num_kv_blocks=37, block_size=16, max_model_len=256)
    s = ModelShape.preset("smollm2-135m")
    params = {p.data_ptr(): p for p in llm.model.parameters()}  # tied weights counted once
    measured_weights = sum(p.numel() * p.element_size() for p in params.values())
    assert abs(measured_weights / weight_bytes(s, "fp32", unquantized="fp32")["total"] - 1) < 0.01
    assert abs(llm.stats()["kv_cache_bytes"] / (37 * 16 * kv_bytes_per_token(s, "fp32")) - 1) < 0.01


def test_group_quantization_overheads():
    # int4, group 128, fp16 scales: 0.5 + 2/128 bytes per weight; asymmetric adds a packed 4-bit zero
    fmt, asym = weight_format("int4-g128"), weight_format("int4-g128-asym")
    assert fmt.matrix_bytes(256, 1024) == 256 * 1024 / 2 + 256 * 8 * 2
    assert asym.matrix_bytes(256, 1024) == fmt.matrix_bytes(256, 1024) + 256 * 8 * 0.5
    # SmolLM2's 576 is not a multiple of 128: the ragged last group still has its scale
    assert fmt.matrix_bytes(1, 576) == 576 / 2 + 5 * 2
    assert weight_format("gguf-q4_0").matrix_bytes(1, 32) == 18 and weight_format("gguf-q8_0").matrix_bytes(1, 32) == 34
    with pytest.raises(ValueError, match="group size"):
        weight_format("int4-g100")
    with pytest.raises(ValueError, match="unknown weight format"):
        weight_format("int5")


def test_kv_scale_overheads_by_granularity():
    s = ModelShape.preset("llama-3-8b")  # 32 layers, 8 KV heads, head_dim 128
    base = 32 * 2 * 8 * 128
    assert kv_bytes_per_token(s, "int8", "per-tensor") == base
    assert kv_bytes_per_token(s, "int8", "per-token") == base + 32 * 2 * 8 * 2
    assert kv_bytes_per_token(s, "int4", "per-group", group_size=32, asymmetric=True) == \
        base / 2 + 32 * 2 * 8 * (128 // 32) * 4
    # KIVI-style: keys per channel over 128-token groups, values per token
    assert kv_bytes_per_token(s, "int2", "per-channel", token_group=128) == base / 4 + 32 * (8 * 128 * 2 / 128 + 8 * 2)


def test_sliding_window_caps_the_cache():
    s = ModelShape.preset("mistral-7b")
    full = kv_cache_bytes(s, 4096, dtype="bf16")
    assert kv_cache_bytes(s, 32768, dtype="bf16") == full  # every layer keeps only the last 4096 tokens
    g = ModelShape.preset("gemma-2-9b")  # half its layers are windowed
    assert kv_cache_bytes(g, 16384, dtype="bf16") == pytest.approx(
        kv_bytes_per_token(g, "bf16") / 42 * (21 * 16384 + 21 * 4096))


def test_paging_waste_and_lognormal_fit():
    r = paging_waste([1, 16, 17, 5000], block_size=16, max_model_len=4096)
    assert r["paged_waste_slots"] == 10 and r["rejected_fraction"] == 0.25
    assert r["contiguous_waste_slots"] == (4095 + 4080 + 4079) / 3
    mu, sigma = lognormal_from_percentiles(500, 1500, 4000)
    assert math.exp(mu) == pytest.approx(500)
    lengths = sorted(lognormal_lengths(500, 1500, 4000, n=20_000))
    assert lengths[10_000] == pytest.approx(500, rel=0.01)
    assert lengths[18_000] == pytest.approx(1500, rel=0.15) and lengths[19_800] == pytest.approx(4000, rel=0.15)
    with pytest.raises(ValueError, match="max_model_len"):
        paging_waste([5000], 16, 4096)


def test_capacity_by_the_vllm_rule_and_its_inverse():
    s = ModelShape.preset("llama-3-8b")
    cap = capacity(s, 80 * GIB, "bf16", "bf16", max_model_len=8192, activation_bytes=2 * GIB, utilization=0.9)
    block = kv_bytes_per_token(s, "bf16") * 16
    expected_blocks = int((80 * GIB * 0.9 - weight_bytes(s, "bf16")["total"] - 2 * GIB) // block)
    assert cap.num_blocks == expected_blocks
    assert cap.max_concurrency == expected_blocks / 512 and cap.operating_concurrency == int(0.8 * cap.max_concurrency)
    need = memory_for_concurrency(s, 20, "bf16", "bf16", max_model_len=8192, activation_bytes=2 * GIB)
    assert capacity(s, need, "bf16", "bf16", max_model_len=8192, activation_bytes=2 * GIB).max_concurrency >= 20
    assert capacity(s, need * 0.95, "bf16", "bf16", max_model_len=8192, activation_bytes=2 * GIB).max_concurrency < 20


def test_fp8_kv_doubles_concurrency_roughly():
    s = ModelShape.preset("llama-3-70b")
    bf16 = capacity(s, 141 * GIB, "int4-g128", "bf16", max_model_len=32768, activation_bytes=4 * GIB)
    fp8 = capacity(s, 141 * GIB, "int4-g128", "fp8", max_model_len=32768, activation_bytes=4 * GIB)
    assert fp8.num_blocks == pytest.approx(2 * bf16.num_blocks, abs=1)


def test_unknown_model_and_bad_values_are_clear_errors():
    with pytest.raises(ValueError, match="llama-3-70b"):
        ModelShape.preset("llama-9")
    with pytest.raises(ValueError, match="seq_len"):
        memory_report("llama-3-8b", seq_len=0)
    with pytest.raises(ValueError, match="KV dtype"):
        kv_bytes_per_token(ModelShape.preset("llama-3-8b"), "int3")


def test_lab_memory_cli_json():
    out = subprocess.run([sys.executable, "-m", "lab.cli", "memory", "llama-3-70b", "--seq-len", "131072",
                          "--concurrency", "16", "--gpu", "h200", "--json"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout)
    assert r["kv_bytes_per_token_per_layer"] == 4096
    assert r["kv_bytes_total"] == 80 * 4096 * 131072 * 16
    assert r["gpu"]["free_bytes"] < 0  # 131 GiB of bf16 weights leave no room for a KV cache on 141 GiB x 0.9


def test_claims_table_has_the_one_shape_and_flags_exactly_the_wrong_claims():
    from lab.studies.memory_accounting.measure import claims_table

    from lab.claims.arithmetic import Paging, rows

    t = claims_table()
    assert_one_shape(t)
    # the notebook's own rows; the articles' arithmetic rows (lab.claims.arithmetic) are tested per seed
    # (tests/test_arithmetic_*_article.py)
    recomputed = {r["claim"] for r in rows(Paging(600, 2000, 6000, 8192))}
    assert recomputed <= set(t["claim"])
    t = t[~t["claim"].isin(recomputed)]
    wrong = t[t["verdict"] == "wrong"]
    assert set(wrong["claim"].str.split(":").str[0]) == {"000 §1.1", "000 §2.2"}
    assert len(wrong) == 3 and (t["verdict"] == "holds").sum() == len(t) - 4
    # 35.86 printed as "35.8": the rules' "wrong by rounding", and the note says only the last digit is off
    slip = t[t["claim"].str.contains("0.55 bytes/param")].iloc[0]
    assert slip["verdict"] == "wrong by rounding" and "last printed digit: 35.86 prints as 35.9" in slip["note"]
    # printed to the claim's precision, so the ledger reads back the verdict the table wrote
    assert t[t["claim"].str.contains("KV per token, 32 layers")].iloc[0]["measured here"] == "131072 B"


def test_torch_dtypes_have_their_account_names():
    from lab.memory import dtype_name

    assert [dtype_name(d) for d in (torch.float32, torch.float16, torch.bfloat16)] == ["fp32", "fp16", "bf16"]
    with pytest.raises(ValueError, match="int8"):
        dtype_name(torch.int8)


def test_a_qwen3_moe_config_counts_its_experts_and_its_dense_layers():
    """Hub Qwen3-MoE configs name the experts `num_experts` and keep some layers dense (`mlp_only_layers`,
    `decoder_sparse_step`); the account read neither, so it counted no experts at all."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen3MoeConfig

    config = Qwen3MoeConfig(vocab_size=256, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
                            num_hidden_layers=5, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                            num_experts=6, num_experts_per_tok=2, decoder_sparse_step=2, mlp_only_layers=[3])
    with torch.device("meta"):
        hf = AutoModelForCausalLM.from_config(config)
    s = ModelShape.from_hf_config(config.to_dict() | {"architectures": ["Qwen3MoeForCausalLM"]})
    assert (s.num_experts, s.experts_per_token, s.first_dense_layers) == (6, 2, 4)  # layer 1 alone is sparse
    total = sum(p.numel() for p in hf.parameters())
    # the account leaves out Qwen3's per-head q/k norms (2 x head_dim a layer): 160 of ~80K parameters
    assert abs(param_counts(s)["total"] - total) <= 2 * 16 * 5
