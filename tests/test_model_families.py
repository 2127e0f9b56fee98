"""The model families beyond Llama (Qwen3, OLMo 2, Phi-3, Qwen3-MoE, Mixtral, Gemma 2, Gemma 3) against transformers,
each on a tiny random-weight model built from transformers' own config class (no download), in float32. The Gemma
models have a sliding window (24) that the longer prompts outgrow on their local layers, low soft caps (Gemma 2)
and a linearly scaled global RoPE beside an unscaled local one (Gemma 3), so each of these changes the logits.

Per family: the lab's logits equal transformers' (1e-4), and the engine's greedy tokens equal transformers'
`generate` through plain prefill and paged decode, chunked prefill, a prefix-cache hit and preemption. Then the
mixture-of-experts routing on its own against transformers' layers, the configs the lab refuses by name, and the
other parts a family touches: tensor parallelism (per-head q/k norms shard; OLMo 2 and MoE are refused), pipeline
stages, quantization's walks, HCache replay and bf16 prepacking.
"""

import dataclasses
import threading

import pytest
import torch

from lab.engine import LLM, SamplingParams
from lab.models import SUPPORTED_ARCHITECTURES, ModelConfig, load_model
from lab.models.llama import MLP
from lab.models.moe import SparseMoE, route
from lab.models.reference import ContiguousKVCache, forward_logits

N_NEW = 12
GREEDY = SamplingParams(temperature=0.0, max_tokens=N_NEW, ignore_eos=True)
COMMON = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=256, bos_token_id=None, eos_token_id=None)


def hf_config(family: str):
    import transformers as tf

    if family == "qwen3":  # an explicit head_dim that is not hidden / heads
        return tf.Qwen3Config(**COMMON, head_dim=24)
    if family == "olmo2":
        return tf.Olmo2Config(**COMMON, pad_token_id=None)
    if family == "phi3":  # only the first half of each head turns (Phi-4-mini's partial rotary, at 0.5)
        return tf.Phi3Config(**COMMON, pad_token_id=None, rope_parameters={
            "rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5})
    if family == "qwen3_moe":  # layer 1 dense (mlp_only_layers), 0 and 2 sparse; weights not renormalised
        return tf.Qwen3MoeConfig(**COMMON, head_dim=16, num_experts=6, num_experts_per_tok=2,
                                 moe_intermediate_size=32, norm_topk_prob=False, mlp_only_layers=[1])
    if family == "gemma2":  # caps low enough to change the logits; a window the prompts outgrow (every other layer)
        return tf.Gemma2Config(**COMMON, head_dim=16, query_pre_attn_scalar=24, attn_logit_softcapping=2.0,
                               final_logit_softcapping=5.0, sliding_window=24, pad_token_id=None)
    if family == "gemma3":  # local, global, local; the global layers' RoPE linearly scaled, the local ones' not
        return tf.Gemma3TextConfig(**COMMON, head_dim=16, query_pre_attn_scalar=24, sliding_window=24,
                                   pad_token_id=None, layer_types=["sliding_attention", "full_attention",
                                                                   "sliding_attention"],
                                   rope_parameters={"full_attention": {"rope_type": "linear", "factor": 4.0,
                                                                       "rope_theta": 1e6},
                                                    "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}})
    assert family == "mixtral"
    return tf.MixtralConfig(**COMMON, num_local_experts=4, num_experts_per_tok=2)


FAMILIES = ["qwen3", "olmo2", "phi3", "qwen3_moe", "mixtral", "gemma2", "gemma3"]


def save_tiny_hf(path, config):
    """transformers' model of `config` with weights large enough that a wrong layout shows: matrices ~ N(0, 0.1),
    norms ~ 1 + N(0, 0.2) (norms near 0 would flatten attention and hide RoPE and q/k-norm errors)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.normal_(0, 0.1) if p.dim() > 1 else p.normal_(1, 0.2)
    hf.save_pretrained(path)
    return hf


def prompts() -> list[list[int]]:
    """Four prompts of 21-45 tokens, the last three sharing a 20-token prefix (more than a block of 16)."""
    g = torch.Generator().manual_seed(1)
    shared = torch.randint(3, 128, (20,), generator=g).tolist()
    return [torch.randint(3, 128, (21,), generator=g).tolist()] + [
        shared + torch.randint(3, 128, (n,), generator=g).tolist() for n in (14, 20, 25)]


class Tiny:
    def __init__(self, path, family):
        self.family, self.hf = family, save_tiny_hf(path, hf_config(family))
        self.model, tok = load_model(path, device="cpu", dtype=torch.float32)
        assert tok is None
        self.prompts = prompts()
        with torch.inference_mode():
            self.expected = [self.hf.generate(torch.tensor([p]), max_new_tokens=N_NEW, do_sample=False,
                                              eos_token_id=None, pad_token_id=0)[0, len(p):].tolist()
                             for p in self.prompts]

    def engine(self, **kw):
        return LLM(self.model, tokenizer=None, max_model_len=128, **{"num_kv_blocks": 64, **kw})


@pytest.fixture(scope="module", params=FAMILIES)
def tiny(request, tmp_path_factory, one_thread):
    return Tiny(tmp_path_factory.mktemp(request.param), request.param)


def tokens(outputs):
    return [o.token_ids for o in outputs]


def test_logits_match_transformers(tiny):
    ids = tiny.prompts[3]
    with torch.inference_mode():
        theirs = tiny.hf(torch.tensor([ids])).logits[0]
    assert (forward_logits(tiny.model, ids) - theirs).abs().max().item() <= 1e-4
    assert len({t for seq in tiny.expected for t in seq}) > 4, "a degenerate model would compare nothing"


def test_paged_engine_matches_transformers_generate(tiny):
    assert tokens(tiny.engine().generate(tiny.prompts, GREEDY)) == tiny.expected


def test_chunked_prefill_matches(tiny):
    llm = tiny.engine(max_num_batched_tokens=7, enable_prefix_caching=False)
    assert tokens(llm.generate(tiny.prompts, GREEDY)) == tiny.expected


def test_prefix_cache_hit_matches(tiny):
    llm = tiny.engine(enable_prefix_caching=True)
    first = llm.generate(tiny.prompts, GREEDY)
    second = llm.generate(tiny.prompts, GREEDY)
    assert all(o.metrics.num_cached_tokens >= 16 for o in second)
    assert tokens(first) == tokens(second) == tiny.expected


def test_preemption_matches(tiny):
    llm = tiny.engine(num_kv_blocks=6, enable_prefix_caching=False)  # 4 x 3-4 blocks cannot all fit
    outs = llm.generate(tiny.prompts, GREEDY)
    assert llm.stats()["preemptions"] > 0
    assert tokens(outs) == tiny.expected


def test_config_round_trips_and_names_its_model_type(tiny):
    c = tiny.model.config
    d = c.to_hf_dict()
    assert d["model_type"] == tiny.hf.config.model_type and d["architectures"] == [c.architecture]
    again = ModelConfig.from_hf_dict(d)
    assert dataclasses.replace(again, extra={}) == dataclasses.replace(c, extra={})


def test_pipeline_stages_match_the_whole_model(tiny):
    """Three stages of one layer each, run in turn: the middle stage's layer is dense in Qwen3-MoE (mlp_only_layers)
    and global in Gemma (layer_types) though its index in the stage is 0, so a stage must count sparse and windowed
    layers by the whole model's index."""
    from lab.parallel.pipeline import run_stage, stage_model

    ids = tiny.prompts[3]
    stages = [stage_model(tiny.model, r, 3) for r in range(3)]
    x, pos = torch.tensor(ids), torch.arange(len(ids))
    with torch.inference_mode():
        for r, stage in enumerate(stages):
            x = run_stage(stage, x, pos, ContiguousKVCache(1, stage.attention_layout), first=r == 0, last=r == 2)
        logits = stages[-1].compute_logits(x)
    assert (logits - forward_logits(tiny.model, ids)).abs().max().item() <= 1e-5


# ---- mixture-of-experts routing against transformers' layers ------------------------------------------------


def _moe_from_hf(block, renormalize: bool) -> SparseMoE:
    """The lab's SparseMoE holding the weights of transformers' sparse MoE block (experts as [E, ...] tensors)."""
    gate_up, down, router = block.experts.gate_up_proj, block.experts.down_proj, block.gate.weight
    experts = [MLP(gate_up.shape[2], down.shape[2]) for _ in range(gate_up.shape[0])]
    moe = SparseMoE(gate_up.shape[2], experts, block.gate.top_k, renormalize)
    with torch.no_grad():
        moe.gate.weight.copy_(router)
        for e, expert in enumerate(experts):
            expert.gate_up_proj.weight.copy_(gate_up[e])
            expert.down_proj.weight.copy_(down[e])
    return moe


@pytest.mark.parametrize("kind", ["qwen3_moe", "qwen3_moe_renormalised", "mixtral"])
def test_moe_routing_matches_transformers_layer(kind):
    import transformers as tf
    from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

    torch.manual_seed(0)
    small = dict(hidden_size=32, num_experts_per_tok=3)
    if kind == "mixtral":
        block, renormalize = MixtralSparseMoeBlock(tf.MixtralConfig(**small, intermediate_size=24,
                                                                   num_local_experts=5)), True
    else:
        renormalize = kind.endswith("renormalised")
        block = Qwen3MoeSparseMoeBlock(tf.Qwen3MoeConfig(**small, moe_intermediate_size=24, num_experts=5,
                                                         norm_topk_prob=renormalize))
    with torch.no_grad():
        for p in block.parameters():
            p.normal_(0, 0.3)
    moe, x = _moe_from_hf(block, renormalize), torch.randn(40, 32)
    with torch.inference_mode():
        _, their_weights, their_experts = block.gate(x)
        weights, experts = route(moe.gate(x), moe.top_k, renormalize)
        assert torch.equal(experts, their_experts) and torch.allclose(weights, their_weights.float(), atol=1e-6)
        sums = weights.sum(-1)
        assert torch.allclose(sums, torch.ones(40)) if renormalize else bool((sums < 1).all())
        assert len(experts.unique()) == 5  # every expert used by some token: the loop's gathers are exercised
        assert (moe(x) - block(x[None])[0]).abs().max().item() <= 1e-5


def test_sparse_layers_follow_decoder_sparse_step_and_mlp_only_layers():
    import transformers as tf
    from transformers import AutoModelForCausalLM

    from lab.models.llama import LlamaModel

    hf_cfg = tf.Qwen3MoeConfig(**{**COMMON, "num_hidden_layers": 5}, head_dim=16, num_experts=4, num_experts_per_tok=2,
                               moe_intermediate_size=16, decoder_sparse_step=2, mlp_only_layers=[3])
    theirs = [type(layer.mlp).__name__.endswith("SparseMoeBlock")
              for layer in AutoModelForCausalLM.from_config(hf_cfg).model.layers]
    with torch.device("meta"):
        ours = LlamaModel(ModelConfig.from_hf_dict(hf_cfg.to_dict()))
    assert [isinstance(layer.mlp, SparseMoE) for layer in ours.layers] == theirs == [False, True, False, False, False]


# ---- configs refused by name ------------------------------------------------------------------------------------


def _phi3(**over) -> dict:
    return {"architectures": ["Phi3ForCausalLM"], "hidden_size": 64, "num_attention_heads": 4,
            "num_key_value_heads": 4, **over}


@pytest.mark.parametrize("over, named", [
    ({"rope_scaling": {"type": "longrope", "short_factor": [1.0], "long_factor": [4.0]}}, "longrope"),
    ({"rope_parameters": {"rope_type": "longrope", "rope_theta": 1e4}}, "longrope"),  # transformers 5's spelling
    ({"partial_rotary_factor": 0.05}, "partial_rotary_factor 0.05"),
    ({"partial_rotary_factor": 1.5}, "partial_rotary_factor 1.5"),
    ({"hidden_act": "gelu_pytorch_tanh"}, "gelu_pytorch_tanh"),
    ({"architectures": ["Qwen3MoeForCausalLM"], "num_experts": 4, "num_experts_per_tok": 5}, "num_experts_per_tok 5"),
    ({"architectures": ["Qwen3MoeForCausalLM"], "num_experts": 0, "num_experts_per_tok": 1}, "num_experts >= 1"),
    ({"architectures": ["MixtralForCausalLM"], "num_local_experts": 4, "num_experts_per_tok": 2,
      "decoder_sparse_step": 0}, "decoder_sparse_step 0"),
    # the refusal lists the supported ones (Gemma 3's multimodal model is not its text model)
    ({"architectures": ["Gemma3ForConditionalGeneration"]}, "Qwen3MoeForCausalLM, .*Gemma3ForCausalLM"),
    ({"architectures": ["Gemma3ForCausalLM"], "rope_parameters": {
        "full_attention": {"rope_type": "yarn", "factor": 8.0}, "sliding_attention": {"rope_type": "default"}}}, "yarn"),
    ({"architectures": ["Gemma3ForCausalLM"], "rope_parameters": {
        "full_attention": {"rope_type": "default"}, "sliding_attention": {"rope_type": "linear", "factor": 2.0}}},
     "'linear' on the sliding layers"),
    ({"architectures": ["Gemma2ForCausalLM"], "hidden_activation": "silu"}, "'silu' for Gemma2ForCausalLM"),
    ({"architectures": ["Gemma3ForCausalLM"], "use_bidirectional_attention": True}, "use_bidirectional_attention"),
    ({"architectures": ["Gemma2ForCausalLM"], "num_hidden_layers": 3, "sliding_window": 8,
      "layer_types": ["sliding_attention", "chunked_attention", "full_attention"]}, "chunked_attention"),
])
def test_bad_configs_are_refused_by_name(over, named):
    with pytest.raises(ValueError, match=named):
        ModelConfig.from_hf_dict(_phi3(**over))


def test_supported_architectures_are_the_families():
    assert set(SUPPORTED_ARCHITECTURES) >= {"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM",
                                            "Qwen3ForCausalLM", "Olmo2ForCausalLM", "Phi3ForCausalLM",
                                            "Qwen3MoeForCausalLM", "MixtralForCausalLM"}
    mixtral = ModelConfig.from_hf_dict(_phi3(architectures=["MixtralForCausalLM"], num_local_experts=8,
                                             num_experts_per_tok=2, intermediate_size=96))
    assert (mixtral.num_experts, mixtral.moe_intermediate_size, mixtral.norm_topk_prob) == (8, 96, True)


# ---- the parts a family touches: tensor parallelism, quantization, replay, prepacking ---------------------------


def _tiny_model(tmp_path, family: str):
    save_tiny_hf(tmp_path, hf_config(family))
    return load_model(tmp_path, device="cpu", dtype=torch.float32)[0]


class ThreadComm:
    """`lab.parallel.collectives`' two calls that a shard's forward makes, between threads of this process: each
    rank posts its tensor and waits at a barrier for the others'."""

    def __init__(self, world: int):
        self.barrier, self.posted = threading.Barrier(world, timeout=30), [None] * world

    def rank(self, r: int):
        comm = self

        class Rank:
            def exchange(self, x):
                comm.posted[r] = x.clone()
                comm.barrier.wait()
                got = list(comm.posted)
                comm.barrier.wait()  # nobody posts the next collective's tensor before all have read this one's
                return got

            def all_reduce(self, x):
                return x.copy_(sum(self.exchange(x)))

            def gather_columns(self, x, total):
                return torch.cat(self.exchange(x), 1)

        return Rank()


@pytest.mark.parametrize("family", ["qwen3", "phi3"])
def test_tensor_parallel_shards_match_the_whole_model(tmp_path, family, one_thread):
    """Per-head q/k norms (Qwen3) are replicated with the other norms; Phi-3's partial RoPE acts within each head."""
    from lab.parallel.sharding import plan_shards, shard_model

    model, ids = _tiny_model(tmp_path, family), prompts()[3]
    comm = ThreadComm(2)
    shards = [shard_model(model, s, comm.rank(r)) for r, s in enumerate(plan_shards(model.config, 2))]
    out = [None, None]

    def run(r):
        out[r] = forward_logits(shards[r], ids)

    threads = [threading.Thread(target=run, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert (out[0] - forward_logits(model, ids)).abs().max().item() <= 1e-5


@pytest.mark.parametrize("family, why", [("olmo2", "span all heads"), ("qwen3_moe", "mixture of experts"),
                                         ("mixtral", "mixture of experts")])
def test_tensor_parallel_refuses_what_it_cannot_split(family, why):
    from lab.parallel.sharding import plan_shards

    config = ModelConfig.from_hf_dict(hf_config(family).to_dict())
    with pytest.raises(ValueError, match=f"{config.architecture}: .*{why}.* it shards .*Qwen3ForCausalLM"):
        plan_shards(config, 2)


def test_quantization_walks_refuse_experts_and_post_norm(tmp_path):
    from lab.quant.layerwise import CalibrationPass
    from lab.quant.pipeline import decoder_linears

    with pytest.raises(ValueError, match="Qwen3MoeForCausalLM has a mixture of experts"):
        decoder_linears(_tiny_model(tmp_path / "moe", "qwen3_moe"))
    olmo2 = _tiny_model(tmp_path / "olmo2", "olmo2")
    assert len(decoder_linears(olmo2)) == 4 * 3  # RTN needs only the linears, which OLMo 2 has
    with pytest.raises(ValueError, match="Olmo2ForCausalLM is post-norm"):
        CalibrationPass(olmo2, [[1, 2, 3]])


def test_calibration_walk_of_a_qk_norm_layer_is_the_layer(tmp_path):
    """GPTQ's and AWQ's linear-by-linear walk recomputes the layer; with Qwen3's q/k norms inside attention it
    must still end where the layer's own forward does."""
    from lab.quant.layerwise import CalibrationPass

    model = _tiny_model(tmp_path, "qwen3")
    cal = CalibrationPass(model, prompts()[:2])
    with torch.inference_mode():
        expected = cal.run(model.layers[0])
        for _ in cal.sequential(model.layers[0]):
            pass
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(cal.hidden, expected))


@pytest.mark.parametrize("family, named", [("qwen3", "k_norm"), ("phi3", "partial RoPE")])
def test_hidden_state_replay_refuses_keys_it_cannot_rebuild(tmp_path, family, named):
    from lab.replay import ReplayConfig

    model = _tiny_model(tmp_path, family)
    with pytest.raises(ValueError, match=named):
        LLM(model, max_model_len=128, num_kv_blocks=16, replay=ReplayConfig(source="hidden"))


def test_prepacked_bf16_moe_matches_plain_bf16(tmp_path, one_thread):
    from lab.models import prepack

    if not prepack.available("cpu"):
        pytest.skip("this torch has no oneDNN linear operators")
    save_tiny_hf(tmp_path, hf_config("qwen3_moe"))
    plain, _ = load_model(tmp_path, device="cpu", dtype=torch.bfloat16)
    packed, _ = load_model(tmp_path, device="cpu", dtype=torch.bfloat16, prepack_weights=True)
    linears = sum(isinstance(m, torch.nn.Linear) for m in plain.modules())
    assert prepack.count(packed) == linears > 6 * 2 * 2  # the experts' linears and the routers too
    ids = prompts()[3]
    assert (forward_logits(packed, ids) - forward_logits(plain, ids)).abs().max().item() <= 0.05
