"""Roofline bounds and the hardware table: the worked examples recomputed through the API, and the
decode curve's shape (bound switching at the derived crossover, throughput never falling with batch)."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lab.machine.hardware import GPUS, GiB, Hardware, get_gpu, probe
from lab.machine.roofline import (ModelCost, RooflinePoint, attainable_flops, attention_flops_per_context_token,
                          crossover_batch, decode_flops, decode_step_time, decode_table, plot_roofline,
                          prefill_bytes, prefill_flops, prefill_time_lower_bound, ridge_point)

H100 = get_gpu("h100-sxm")

# Llama-2-70B's shape: 80 layers, 64 query heads, 8 KV heads of dimension 128 (grouped-query attention).
LLAMA70_KV_BYTES_BF16 = 80 * 8 * 128 * 2 * 2  # layers * kv heads * head dim * (K and V) * 2 bytes
LLAMA70_BF16 = ModelCost(weight_bytes=2 * 70e9, active_params=70e9, kv_bytes_per_token=LLAMA70_KV_BYTES_BF16,
                         attn_flops_per_ctx_token=attention_flops_per_context_token(80, 64, 128))


def test_ridge_point_of_h100_is_peak_over_bandwidth():
    assert ridge_point(H100) == pytest.approx(H100.peak_flops / H100.mem_bandwidth)
    assert attainable_flops(H100, ridge_point(H100) / 2) == pytest.approx(H100.peak_flops / 2)
    assert attainable_flops(H100, ridge_point(H100) * 2) == H100.peak_flops


def test_table_holds_dense_rates_with_named_sources():
    for key, hw in GPUS.items():
        # The 2:4-sparse figures NVIDIA prints first are twice these; the fastest dense BF16 in the
        # table (Hopper, 989 TFLOP/s) stays below 1 PFLOP/s, a sparse one would not.
        assert 1e14 < hw.peak_flops < 1e15, key
        assert 5e11 < hw.mem_bandwidth < 1e13, key
        assert hw.memory_bytes % GiB == 0 and hw.source, key
    assert get_gpu("H200").mem_bandwidth > get_gpu("h100-sxm").mem_bandwidth


def test_get_gpu_error_names_the_known_gpus():
    with pytest.raises(ValueError) as error:
        get_gpu("h100")  # ambiguous: SXM or PCIe
    for name in GPUS:
        assert name in str(error.value)


def test_decode_at_batch_1_of_40_gb_weights_on_2_tb_per_s_is_20_ms():
    # The deployment article's example (70B parameters at ~4.5 bits): 40 GB / 2 TB/s = 20 ms, 50 tokens/s.
    # Its arithmetic leaves the KV cache out, and so does this model.
    device = Hardware("2 TB/s device", 80 * GiB, 989.4e12, 2e12, "test")
    model = ModelCost(weight_bytes=40e9, active_params=70e9, kv_bytes_per_token=0.0)
    step = decode_step_time(device, model.weight_bytes, 0.0, decode_flops(model, 1, 1024))
    assert step.bound == "memory"
    assert step.seconds == pytest.approx(40e9 / 2e12) == pytest.approx(0.020)
    (row,) = decode_table(device, model, context_len=1024, batch_sizes=[1])
    assert row.tpot_s == pytest.approx(0.020) and row.tokens_per_s == pytest.approx(50.0)
    assert row.intensity == pytest.approx(2 * 70e9 / 40e9)


def test_prefill_of_4096_tokens_of_70b_is_573_tflops_and_compute_bound_on_h100():
    model = ModelCost(weight_bytes=2 * 70e9, active_params=70e9, kv_bytes_per_token=LLAMA70_KV_BYTES_BF16)
    flops = prefill_flops(model, 4096)
    assert flops == pytest.approx(2 * 70e9 * 4096) and round(flops / 1e12) == 573
    bound = prefill_time_lower_bound(H100, flops, prefill_bytes(model, 4096))
    assert bound.bound == "compute"
    assert bound.seconds == pytest.approx(flops / H100.peak_flops)


def test_attention_flops_per_context_token_match_torch_flop_counter():
    from torch.utils.flop_counter import FlopCounterMode

    heads, head_dim, context = 4, 16, 96
    q = torch.randn(heads, 1, head_dim)
    k, v = torch.randn(heads, context, head_dim), torch.randn(heads, context, head_dim)
    with FlopCounterMode(display=False) as counter:
        torch.softmax(q @ k.transpose(1, 2), dim=-1) @ v
    assert counter.get_total_flops() == attention_flops_per_context_token(1, heads, head_dim) * context


def test_prefill_flops_equal_the_sum_of_one_token_steps():
    # Causal attention: the i-th prompt token attends to i tokens, exactly as decode at context i would.
    tokens = 37
    assert prefill_flops(LLAMA70_BF16, tokens) == pytest.approx(
        sum(decode_flops(LLAMA70_BF16, 1, i) for i in range(1, tokens + 1)))


def test_without_kv_traffic_the_crossover_batch_is_the_ridge_point_for_2_byte_weights():
    model = ModelCost(weight_bytes=2 * 8e9, active_params=8e9, kv_bytes_per_token=0.0)
    crossover = crossover_batch(H100, model, context_len=2048)
    assert crossover == pytest.approx(ridge_point(H100))
    rows = decode_table(H100, model, context_len=2048, batch_sizes=range(1, 1025))
    assert {r.bound for r in rows if r.batch < crossover} == {"memory"}
    assert {r.bound for r in rows if r.batch > crossover} == {"compute"}
    # Halving the achieved FLOP/s halves the batch it takes to hit the (lower) compute ceiling.
    assert crossover_batch(H100, model, 2048, compute_efficiency=0.5) == pytest.approx(crossover / 2)


def test_kv_reads_below_the_ridge_keep_decode_memory_bound_at_any_batch():
    # Attention does 2 FLOPs per KV element for each query head sharing it: 8 query heads per KV head
    # and 2-byte elements give 8 FLOP/byte, so a long-context sequence's own intensity stays far below
    # any ridge and adding sequences adds KV reads as fast as arithmetic.
    context = 131072
    per_seq_intensity = decode_flops(LLAMA70_BF16, 1, context) / (context * LLAMA70_BF16.kv_bytes_per_token)
    assert per_seq_intensity < ridge_point(H100)
    assert crossover_batch(H100, LLAMA70_BF16, context) == math.inf
    rows = decode_table(H100, LLAMA70_BF16, context)
    assert {r.bound for r in rows} == {"memory"}
    assert not rows[0].fits_in_memory  # 140 GB of weights alone exceed 80 GiB


@settings(max_examples=60, deadline=None)
@given(gpu=st.sampled_from(sorted(GPUS)),
       params=st.floats(1e8, 4e11), bytes_per_param=st.floats(0.5, 4.0),
       kv_bytes_per_token=st.floats(0.0, 2e6), attn_flops=st.floats(0.0, 1e8),
       context_len=st.integers(1, 131072),
       efficiency=st.floats(0.05, 1.0))
def test_decode_curve_switches_bound_at_the_crossover_and_throughput_never_falls(
        gpu, params, bytes_per_param, kv_bytes_per_token, attn_flops, context_len, efficiency):
    hw = GPUS[gpu]
    model = ModelCost(params * bytes_per_param, params, kv_bytes_per_token, attn_flops)
    crossover = crossover_batch(hw, model, context_len, compute_efficiency=efficiency)
    rows = decode_table(hw, model, context_len, batch_sizes=range(1, 2049, 7), compute_efficiency=efficiency)
    for row in rows:
        if row.batch < crossover * (1 - 1e-9):
            assert row.bound == "memory"
        elif row.batch > crossover * (1 + 1e-9):
            assert row.bound == "compute"
    throughputs = [r.tokens_per_s for r in rows]
    assert all(b >= a * (1 - 1e-12) for a, b in zip(throughputs, throughputs[1:]))
    for row in rows:
        assert row.tpot_s == max(row.memory_s, row.compute_s)
        if row.bound == "compute":  # the plateau: achieved FLOP/s over one sequence's FLOPs per token
            assert row.tokens_per_s == pytest.approx(
                hw.peak_flops * efficiency / decode_flops(model, 1, context_len))
    if math.isfinite(crossover):
        step = decode_step_time(hw, model.weight_bytes, crossover * context_len * kv_bytes_per_token,
                                decode_flops(model, crossover, context_len), compute_efficiency=efficiency)
        assert step.memory_s == pytest.approx(step.compute_s)


def test_efficiency_arguments_scale_the_ceilings_and_reject_non_fractions():
    full = prefill_time_lower_bound(H100, 1e15, 1e12)
    derated = prefill_time_lower_bound(H100, 1e15, 1e12, compute_efficiency=0.5, memory_efficiency=0.25)
    assert derated.compute_s == pytest.approx(2 * full.compute_s)
    assert derated.memory_s == pytest.approx(4 * full.memory_s)
    for bad in (0.0, -0.1, 1.5):
        with pytest.raises(ValueError):
            ridge_point(H100, memory_efficiency=bad)
    with pytest.raises(ValueError):
        Hardware("broken", 1, 1e12, 0.0, "test")


def test_probe_measures_positive_plausible_numbers():
    hw = probe(seconds_budget=1.0)
    for value in (hw.memory_bytes, hw.peak_flops, hw.mem_bandwidth):
        assert math.isfinite(value) and value > 0
    assert 1e8 <= hw.mem_bandwidth <= 1e13
    assert hw.name.startswith("this machine (") and hw.source.startswith("measured by lab.machine.hardware.probe on ")


def test_plot_roofline_puts_labelled_points_on_the_roof(tmp_path):
    rows = decode_table(H100, LLAMA70_BF16, 2048, batch_sizes=[1, 64])
    points = [RooflinePoint("prefill 2048 tokens",
                            prefill_flops(LLAMA70_BF16, 2048) / prefill_bytes(LLAMA70_BF16, 2048))]
    points += [RooflinePoint(f"decode B={r.batch}", r.intensity) for r in rows]
    points.append(RooflinePoint("measured", 10.0, flops_per_s=1e13))
    fig = plot_roofline(H100, points)
    path = tmp_path / "roofline.png"
    fig.savefig(path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    (ax,) = fig.axes
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert all(any(t.startswith(p.label + " (") for t in legend) for p in points)  # each point named once
    from lab.figures.check import problems

    assert problems(fig) == []
    markers = [line for line in ax.lines if line.get_marker() == "o"]
    for point, marker in zip(points, markers):
        expected = point.flops_per_s or attainable_flops(H100, point.intensity)
        assert marker.get_ydata()[0] == pytest.approx(expected)
