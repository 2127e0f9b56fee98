"""The engine's optimised paths against its reference path (issue 18), on the real model's weights:

- `dtype="auto"` is the serving dtype: bfloat16 where the CPU has bfloat16 matrix instructions, else float32;
- weights prepacked for oneDNN (a bfloat16 model the engine loads) give the plain model's greedy tokens, up to
  bfloat16's near ties;
- compiled steps (`enforce_eager=False`), with plain or prepacked linears, give eager's greedy tokens in float32,
  and report their compile time;
- the batched decode attention (two matmuls) equals SDPA's;
- `lab bench engine` runs end to end at toy sizes and reports bounds, fractions and targets (on random weights of
  a toy shape: what it checks is the benchmark's plumbing, which the real model's 30 layers only made slower, 82 s
  against 17 s; `make run` runs the benchmark on the real model).
"""

import copy
import json

import pytest
import torch
import torch.nn.functional as F

from lab.engine import LLM, EngineConfig, SamplingParams
from lab.models import loader, prepack
from lab.speculative.drafters import layer_skip_model

from greedy_helpers import BF16_NEAR_TIE_NATS, parted_only_at_near_ties


def test_auto_dtype_is_the_serving_dtype(monkeypatch):
    monkeypatch.setattr(loader, "cpu_has_bf16_matmul", lambda: True)
    assert loader.default_dtype("cpu") == torch.bfloat16
    monkeypatch.setattr(loader, "cpu_has_bf16_matmul", lambda: False)
    assert loader.default_dtype("cpu") == torch.float32
    assert loader.default_dtype("cuda") == torch.bfloat16
    assert EngineConfig(dtype="auto").torch_dtype is None and EngineConfig(dtype="bfloat16").torch_dtype == torch.bfloat16
    assert EngineConfig(dtype=torch.float32).torch_dtype == torch.float32


def test_an_engine_that_loads_its_model_serves_auto_and_prepacks_reduced_precision():
    llm = LLM("smollm2-135m", max_model_len=256, num_kv_blocks=32)
    assert llm.model.embed_tokens.weight.dtype == loader.default_dtype("cpu")
    packed = isinstance(llm.model.layers[0].mlp.down_proj, prepack.PrepackedLinear)
    assert packed == (llm.model.embed_tokens.weight.dtype != torch.float32 and prepack.available("cpu"))
    plain = LLM("smollm2-135m", dtype="float32", max_model_len=256, num_kv_blocks=32)
    assert not isinstance(plain.model.layers[0].mlp.down_proj, prepack.PrepackedLinear)


@pytest.fixture(scope="module")
def bf16_model(smollm):

    model, tok = smollm
    return copy.deepcopy(model).to(torch.bfloat16), tok


@pytest.mark.skipif(not prepack.available("cpu"), reason="this torch has no oneDNN")
def test_load_model_prepacks_on_request_where_it_pays_and_unprepack_undoes_it(bf16_model):
    model, _ = bf16_model
    assert prepack.wanted(model) and not prepack.wanted(copy.deepcopy(model).float())
    packed = prepack.prepack(copy.deepcopy(model))
    lin = packed.layers[0].self_attn.qkv_proj
    plain = prepack.unprepack(packed)
    back = plain.layers[0].self_attn.qkv_proj
    assert type(back) is torch.nn.Linear and back.weight is lin.weight  # the same tensor, not a copy
    assert not any(isinstance(m, prepack.PrepackedLinear) for m in plain.modules())
    x = torch.randn(3, model.config.hidden_size, dtype=torch.bfloat16)
    assert torch.equal(back(x), F.linear(x, back.weight))
    fp32, _ = loader.load_model("smollm2-135m", dtype="float32", prepack_weights=True)
    assert not any(isinstance(m, prepack.PrepackedLinear) for m in fp32.modules())  # float32: nothing to gain


def test_a_quantized_drafter_runs_packed_from_a_prepacked_target(bf16_model):

    from lab.quant.packed import PackedLinear
    from lab.speculative.drafters import quantized_copy

    model, tok = bf16_model
    target = prepack.prepack(copy.deepcopy(model)) if prepack.available("cpu") else copy.deepcopy(model)
    packed = quantized_copy(target, tok, "rtn", bits=4)
    dequantized = quantized_copy(target, tok, "rtn", bits=4, packed=False)
    assert isinstance(packed.layers[0].mlp.down_proj, PackedLinear) and isinstance(packed.lm_head, PackedLinear)
    assert type(dequantized.layers[0].mlp.down_proj) is torch.nn.Linear  # a blocked copy would go stale
    from lab.models.reference import ContiguousKVCache

    ids = torch.tensor([1, 504, 3458, 314, 2910, 28])
    with torch.inference_mode():
        hp, hd = (m(ids, torch.arange(len(ids)), ContiguousKVCache(len(m.layers))).float()
                  for m in (packed, dequantized))
    # the same codes, so the decoders agree up to the kernel's bf16 rounding (heads differ: the packed one is 4-bit)
    assert F.cosine_similarity(hp, hd, dim=-1).min() > 0.99


@pytest.mark.skipif(not prepack.available("cpu"), reason="this torch has no oneDNN")
def test_prepacked_weights_give_the_plain_models_greedy_tokens(smollm, bf16_model, chat_prompt_ids):
    """The same greedy tokens up to bfloat16's near ties. Token for token held while oneDNN ran one kernel for
    both; on a CPU with AMX the blocked and the plain weight take different kernels from 64 rows on (a prefill),
    whose outputs differ in the last bit, and the bf16 model ties (its logits 0.125 apart at 25) where the
    float32 model ranks two tokens 0.08 nats apart. So where the runs part, the float32 model must rank the two
    within BF16_NEAR_TIE_NATS; a misplaced or stale blocked weight parts them by whole nats."""
    model, tok = bf16_model
    packed = prepack.prepack(copy.deepcopy(model))
    x = torch.randn(5, model.config.hidden_size, dtype=torch.bfloat16)
    lin = packed.layers[3].mlp.gate_up_proj
    with torch.inference_mode():  # with autograd on, the layer serves F.linear (the blocked copy has no backward)
        out, ref = lin(x), F.linear(x, lin.weight)
    assert (out.float() - ref.float()).abs().max() <= 0.02 * ref.float().abs().max()  # bf16 outputs: 2^-8
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    runs = [[o.token_ids for o in LLM(m, tokenizer=tok, num_kv_blocks=64, max_model_len=256).generate(
        chat_prompt_ids, params)] for m in (model, packed)]
    assert parted_only_at_near_ties(smollm[0], chat_prompt_ids, *runs, BF16_NEAR_TIE_NATS) == []


@pytest.mark.parametrize("weights", ["plain", pytest.param("prepacked", marks=pytest.mark.skipif(
    not prepack.available("cpu"), reason="this torch has no oneDNN"))])
def test_compiled_steps_give_eager_greedy_tokens_in_float32(smollm, chat_prompt_ids, weights, tmp_path):
    """The real model's first 4 layers (its own weights; the whole model compiles for minutes on 2 cores), compiled
    with plain linears (float32 as the engine loads it) and with prepacked ones (as it loads bfloat16: the
    prepacked linear is one opaque operator in the graph, `lab.models.prepack.prepacked_linear`), against the
    plain eager reference."""
    model, tok = smollm
    short = layer_skip_model(model, 4)
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    eager = LLM(short, tokenizer=tok, num_kv_blocks=64, max_model_len=256)
    subject = prepack.prepack(copy.deepcopy(short)) if weights == "prepacked" else short
    compiled = LLM(subject, tokenizer=tok, num_kv_blocks=64, max_model_len=256, enforce_eager=False)
    prompts = chat_prompt_ids[:3]
    want = [o.token_ids for o in eager.generate(prompts, params)]
    assert [o.token_ids for o in compiled.generate(prompts, params)] == want  # batched, then
    assert [o.token_ids for o in compiled.generate(prompts[:1], params)] == want[:1]  # batch 1 (its own graph)
    assert compiled.stats()["compile_seconds"] > 0 and eager.stats()["compile_seconds"] == 0
    assert prepack.count(compiled.model) == (17 if weights == "prepacked" else 0)  # 4 layers x 4 (qkv and gate-up fused) + the LM head
    # each graph traced once: with every size dynamic, dynamo made the RMSNorms' float attributes symbolic, then
    # discarded its first trace and restarted (22 s of an 80-s compile of the whole model)
    from torch._dynamo.utils import get_compilation_metrics

    ours = [m for m in get_compilation_metrics() if (m.co_filename or "").endswith("lab/engine/compiled.py")]
    assert ours and not [m.restart_reasons for m in ours if m.restart_reasons]
    # --profile's compile breakdown: the whole compile and its phases, from this process's compiles
    import pandas as pd

    from lab.bench.profile import write_compile_times

    phases = pd.read_csv(write_compile_times(tmp_path, "compile")["csv"]).set_index("phase")["seconds"]
    # Phases nest in wall time, but each is summed over the threads that ran it: the C++ compiles (`compile_file`)
    # run on several compile threads at once and may sum to more than the whole, so they are left out of the bound.
    assert phases["_compile.compile_inner"] > 0 and (phases >= 0).all()
    assert list(phases) == sorted(phases, reverse=True)  # largest first
    assert phases.drop(["_compile.compile_inner", "compile_file"], errors="ignore").max() <= \
        phases["_compile.compile_inner"]


def test_two_compiled_engines_in_one_process_each_run_their_own_graph(smollm, chat_prompt_ids):
    """The compiled step keeps no guards on the model's modules (`lab.engine.compiled._guards_kept`), only on its own
    attention operator: without that one, the engine built second would compile a graph that matches the first
    engine's calls too, and the first would then run it with the other engine's (empty) step context."""
    model, tok = smollm
    short = layer_skip_model(model, 4)
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    eager = LLM(short, tokenizer=tok, num_kv_blocks=64, max_model_len=256)
    batches = [chat_prompt_ids[:1], chat_prompt_ids[:2]]  # batch 1 and batched: each shape its own graph
    want = [[o.token_ids for o in eager.generate(b, params)] for b in batches]
    first, second = (LLM(m, tokenizer=tok, num_kv_blocks=64, max_model_len=256, enforce_eager=False)
                     for m in (short, copy.deepcopy(short)))
    for llm in (first, second, first, second):
        outs = [llm.generate(b, params) for b in batches]
        assert [o.error for out in outs for o in out] == [None] * 3
        assert [[o.token_ids for o in out] for out in outs] == want


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_batched_decode_attention_equals_sdpa(dtype):
    from lab.models.attention import _decode_attention

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(s, generator=g).to(dtype) for s in ((4, 3, 3, 64), (4, 3, 40, 64), (4, 3, 40, 64)))
    bias = torch.zeros(4, 1, 1, 40, dtype=dtype)
    bias[1, ..., 17:] = float("-inf")  # a shorter sequence
    want = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=bias.float())
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(_decode_attention(q, k, v, bias).float(), want, atol=tol, rtol=tol)


def test_the_benchmark_pool_holds_its_largest_workload_not_every_request_at_the_longest_length():
    """The reference benchmark's engines held KV for 32 requests of 2K tokens (max_num_seqs x the longest
    workload): 4,160 blocks, 3.1 GB in float32 for SmolLM2, so its seven contenders did not fit in 23 GB together
    and were timed one after another. The workloads run one at a time; the largest holds 32 x 15 blocks."""
    from lab.bench.engine import VERIFY_DRAFTS, kv_blocks_needed, workload_lengths
    from lab.bench.workloads import WORKLOADS

    lengths = workload_lengths(list(WORKLOADS.values()))
    assert dict(zip(WORKLOADS, lengths)) == {"decode-1": (1, 96 + 256), "offline-32x128": (32, 96 + 128),
                                             "prefill-2k": (1, 2048 + 1)}
    assert kv_blocks_needed(lengths, 256 + VERIFY_DRAFTS + 1) == 32 * 15
    assert kv_blocks_needed([(1, 2048 + 1)]) == 129  # one request: 2,050 tokens with its spare one
    with pytest.raises(ValueError):
        kv_blocks_needed([])  # nothing to size for is a caller's mistake, not a pool of 0 blocks


def test_engine_bench_at_toy_sizes_reports_bounds_fractions_and_targets(tmp_path):
    import pandas as pd

    from lab.bench.engine import run_engine_bench
    from lab.bench.workloads import Workload
    from lab.bench.engine_report import format_result, targets

    workloads = [Workload("decode-1", 1, 6, metric="step_ms"), Workload("offline-32x128", 3, 4),
                 Workload("prefill-2k", 1, 1, prompt_tokens=64, metric="seconds")]
    result = run_engine_bench(model="random:tiny", variants=("eager-float32", "int4-auto"), workloads=workloads,
                              transformers_dtypes=("float32",), profile_dir=tmp_path / "profile", rounds=2)
    # --profile: every engine workload's per-operator breakdown, the matmuls among its operators
    for e in result["engines"]:
        for name, w in e["workloads"].items():
            table = pd.read_csv(w["profile"]["csv"])
            assert (tmp_path / "profile" / f"{e['variant']}__{name}.txt").stat().st_size > 0
            assert table["self_cpu_ms"].is_monotonic_decreasing and (table["calls"] > 0).all()
            assert table["operator"].str.contains("mm|linear|matmul|int4").any(), table["operator"].head(10).tolist()
            # the same workload under cProfile: whose Python the host time is, the engine's step and the model's
            # forward apart, and the operators among the C functions
            py = pd.read_csv(w["profile"]["python"]["csv"])
            assert py["self_ms"].is_monotonic_decreasing and (py["calls"] > 0).all()
            assert {"the engine's step", "the model's forward"} <= set(py["kind"])
            assert "lab/engine/scheduler.py" in set(py["source"]) and "lab/models/llama.py" in set(py["source"])
            assert py["source"].str.contains("linear|mm|int4").any()
            assert 0 < sum(w["profile"]["python"]["share_by_kind"].values()) <= 1.5
        # the verification forward beside the one-row step it is measured against, each profiled
        for rows in ("1row", "5rows"):
            table = pd.read_csv(e["verify_profile"][rows]["csv"])
            assert table["operator"].str.contains("mm|linear|matmul|int4").any()
            assert (tmp_path / "profile" / f"{e['variant']}__verify__{rows}.txt").stat().st_size > 0
    for e in result["engines"]:
        assert e["ceilings"]["read_GBps"] > 0 and e["ceilings"]["gemm_GFLOPs"] > 0 and e["ceilings"]["probe_s"] == 3
        for w in e["workloads"].values():
            assert w["bound_s"] > 0 and 0 < w["fraction_of_roofline"]
            assert w["preemptions"] == 0  # the pool sized for one workload at a time holds each of them whole
        # 3 requests of (a chat prompt under 96 tokens + 4 out), 7 blocks each: the largest of the three workloads
        assert e["kv_blocks"] == 21 and e["kv_cache_MB"] > 0
    # packed 4-bit weights: 0.22x the float32 model's bytes at this shape; unpacked bfloat16 would be 0.5x
    assert result["engines"][1]["weight_MB"] < 0.3 * result["engines"][0]["weight_MB"]
    assert set(result["peers"][0]["workloads"]) == {w.name for w in workloads}
    # the peer on the engine's device (on a GPU the ratio compared a GPU engine with a CPU peer)
    assert {e["device"] for e in result["engines"]} == {p["device"] for p in result["peers"]} == {"cpu"}
    names = [t["target"] for t in targets(result)]
    assert any("engine / transformers" in n for n in names) and any("4-bit" in n for n in names)
    assert "of roofline" in format_result(result)


def test_engine_bench_times_the_triton_backend_beside_the_torch_one(tmp_path, capsys):
    """`lab bench engine --backend torch,triton` (issue 38 item 4): each variant on both attention backends, the
    Triton one in the interpreter here (toy sizes: the path, not a timing); a backend it lacks is refused."""
    from lab.bench.caselog import read_cases
    from lab.cli import main

    out = tmp_path / "bench.json"
    assert main(["bench", "engine", "--model", "random:tiny", "--variants", "eager-float32", "--backend",
                 "torch,triton", "--workloads", "decode-1,prefill-2k", "--transformers", "", "--scale", "0.02",
                 "--max-tokens", "3", "--json", str(out)]) == 0
    engines = json.loads(out.read_text())["result"]["engines"]
    assert [(e["variant"], e["attention_backend"]) for e in engines] == [
        ("eager-float32", "torch"), ("eager-float32+triton", "triton")]
    assert all(w["value"] > 0 and w["bound_s"] > 0 for e in engines for w in e["workloads"].values())
    # the verification's 256 cached tokens shrink with --scale, to 16 at the least (the interpreter's step)
    assert [e["verify_context"] for e in engines] == [16, 16]
    assert [e["verify_repeats"] for e in engines] == [1, 1]  # and its repeats, 5 at full size
    assert [e["ceilings"]["probe_s"] for e in engines] == [0.5, 0.5]  # the ceilings probe shrinks too
    assert {c["variant"] for c in read_cases(out.with_suffix(".jsonl"))} == {"eager-float32", "eager-float32+triton"}
    capsys.readouterr()
    assert main(["bench", "engine", "--model", "random:tiny", "--variants", "eager-float32", "--backend",
                 "torch,cuda", "--transformers", ""]) == 2
    assert "attention backend 'cuda' is not one of ('torch', 'triton')" in capsys.readouterr().err


@pytest.mark.parametrize("T, S, sampled", [(64, 64, False), (16, 64, False), (16, 64, True)])
def test_prefill_attention_takes_sdpas_fused_kernel(T, S, sampled):
    """A defect found by `lab bench engine`: 3-D inputs sent SDPA to its math path on the CPU (a 2048-token
    prefill's attention 7.5x slower); the reference attention must reach the fused kernel, as 4-D inputs do.
    Sampled: the queries sit at every 4th position (`q_positions`, the KV study's attention error)."""
    from torch.profiler import profile

    from lab.models.attention import causal_attention

    q, k, v = torch.randn(T, 9, 64), torch.randn(S, 3, 64), torch.randn(S, 3, 64)
    positions = torch.arange(3, S, 4) if sampled else torch.arange(S - T, S)
    with profile() as prof:
        out = causal_attention(q, k, v, q_positions=positions if sampled else None)
    kernels = {e.key for e in prof.key_averages()}
    assert "aten::_scaled_dot_product_flash_attention_for_cpu" in kernels
    assert "aten::_scaled_dot_product_attention_math" not in kernels
    reps = [x.repeat_interleave(3, 1).transpose(0, 1) for x in (k, v)]
    scores = torch.einsum("thd,hsd->hts", q, reps[0]) / 8
    scores = scores.masked_fill(torch.arange(S)[None, :] > positions[:, None], float("-inf"))
    torch.testing.assert_close(out, torch.einsum("hts,hsd->thd", scores.softmax(-1), reps[1]), atol=1e-5, rtol=1e-5)
