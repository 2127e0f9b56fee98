"""Speculative decoding in the engine (lab.speculative.speculator) on the real model: greedy speculative output equals
plain greedy token for token, beside requests that do not speculate, under a tight token budget that withdraws
drafts, and with the prefix cache (no rejected draft is ever hashed into it); the same for model drafters (the
first layers, a quantized copy, a separate model), sampled outputs distributed as the target's (chi-square on
the real model), the acceptance-threshold policy, and bad settings refused."""

import pytest
import torch

from lab.engine import LLM, SamplingParams
from lab.engine.extension import EngineExtension
from lab.speculative.drafters import NgramDrafter, layer_skip_model, quantized_copy
from lab.speculative.speculator import SpeculativeConfig

QUESTIONS = ["Repeat this sentence three times: the quick brown fox jumps over the lazy dog.",
             "Write a Python function that adds two numbers, then the same function with type hints.",
             "What is the capital of France?"]
MAX_NEW = 32


@pytest.fixture(scope="module")
def prompts(smollm):
    _, tok = smollm
    return [tok.encode(tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                               tokenize=False), add_special_tokens=False) for q in QUESTIONS]


@pytest.fixture(scope="module")
def plain(smollm, prompts):
    model, tok = smollm
    llm = LLM(model, tokenizer=tok, num_kv_blocks=64, max_model_len=512)
    return [o.token_ids for o in llm.generate(prompts, SamplingParams(max_tokens=MAX_NEW, temperature=0))]


def test_greedy_speculative_equals_plain_greedy(smollm, prompts, plain):
    model, tok = smollm
    llm = LLM(model, tokenizer=tok, num_kv_blocks=64, max_model_len=512, speculative=SpeculativeConfig(k=4))
    got = [o.token_ids for o in llm.generate(prompts, SamplingParams(max_tokens=MAX_NEW, temperature=0))]
    assert got == plain
    s = llm.stats()
    assert s["spec_rounds"] > 0 and 0 < s["spec_accepted"] <= s["spec_drafted"]
    assert s["spec_accepted"] / s["spec_drafted"] <= s["spec_conditional_acceptance"] <= 1
    assert s["spec_mean_accepted_tokens_per_step"] == pytest.approx(s["spec_accepted"] / s["spec_rounds"] + 1)
    assert s["kv_blocks_used"] == 0


def test_speculative_and_plain_requests_share_the_engine_and_a_tight_budget(smollm, prompts, plain):
    model, tok = smollm
    llm = LLM(model, tokenizer=tok, num_kv_blocks=64, max_model_len=512, max_num_batched_tokens=6,
              speculative=SpeculativeConfig(k=6))
    params = [SamplingParams(max_tokens=MAX_NEW, temperature=0, speculate=i != 1) for i in range(3)]
    assert [o.token_ids for o in llm.generate(prompts, params)] == plain
    assert llm.stats()["spec_rounds"] > 0


class _DraftWatcher(EngineExtension):
    """Sees every verification step's logits: the drafts are in their own field, never among the tokens."""

    name = "draft_watcher"

    def __init__(self):
        self.rounds, self.outputs = 0, {}

    def mask_logits(self, seq, logits):
        if logits.shape[0] > 1:
            self.rounds += 1
            assert len(seq.draft_token_ids) == logits.shape[0] - 1
        self.outputs.setdefault(seq.request_id, []).append(list(seq.output_token_ids))

    def on_finish(self, seq):
        assert seq.draft_token_ids == []


class _DraftWatcherConfig:
    def build(self, engine):
        return _DraftWatcher()


def test_drafts_live_in_their_own_field_and_never_among_the_tokens(smollm, prompts, plain):
    """What a step shows of a sequence's tokens is only what it emitted: at every step the output seen is a prefix of
    the final (plain greedy) output, drafts included or not."""
    model, tok = smollm
    llm = LLM(model, tokenizer=tok, num_kv_blocks=64, max_model_len=512, speculative=SpeculativeConfig(k=4),
              extensions=[_DraftWatcherConfig()])
    outs = llm.generate(prompts, SamplingParams(max_tokens=MAX_NEW, temperature=0))
    watcher = llm.extensions["draft_watcher"]
    assert watcher.rounds > 0
    for out, final in zip(outs, plain):
        assert out.token_ids == final
        assert all(seen == final[:len(seen)] for seen in watcher.outputs[out.request_id])


def test_prefix_cache_holds_no_rejected_draft(smollm, prompts, plain):
    """Run, then ask again with each prompt extended by its own output: the hits must give the same tokens as
    a fresh engine would."""
    model, tok = smollm
    llm = LLM(model, tokenizer=tok, num_kv_blocks=128, max_model_len=512, speculative=SpeculativeConfig(k=4))
    params = SamplingParams(max_tokens=MAX_NEW, temperature=0)
    llm.generate(prompts, params)
    extended = [p + out[:16] for p, out in zip(prompts, plain)]
    again = [o.token_ids for o in llm.generate(extended, SamplingParams(max_tokens=8, temperature=0))]
    fresh = LLM(model, tokenizer=tok, num_kv_blocks=128, max_model_len=512)
    assert llm.stats()["prefix_cache_hit_tokens"] > 0
    assert again == [o.token_ids for o in fresh.generate(extended, SamplingParams(max_tokens=8, temperature=0))]


def test_acceptance_metrics_by_position():
    from lab.speculative.speculator import SpecStats

    s = SpecStats()
    for drafted, accepted in ((4, 4), (4, 1), (4, 0), (2, 2)):
        s.record(drafted, accepted)
    # position 1: verified 4 times, accepted 3; position 2: verified 3 (after an acceptance), accepted 2; ...
    assert s.reached == [4, 3, 1, 1] and s.accepted_at == [3, 2, 1, 1]
    assert s.conditional_acceptance == pytest.approx(7 / 9)
    assert s.mean_accepted_tokens_per_step == pytest.approx(7 / 4 + 1)
    assert s.accepted / s.drafted == pytest.approx(7 / 14)  # vLLM's ratio: not a


def test_ngram_drafter_proposes_what_followed_the_latest_match():
    d = NgramDrafter(min_n=1, max_n=2)
    assert d.lookup([1, 2, 3, 9, 1, 2, 3, 4, 1, 2], 3) == [3, 4, 1]  # "1 2" last seen at 4: then 3 4 1
    assert d.lookup([5, 6, 7], 2) == []  # no earlier occurrence of 7 or 6 7
    with pytest.raises(ValueError, match="min_n <= max_n"):
        NgramDrafter(min_n=3, max_n=2)
    with pytest.raises(ValueError, match="k .drafts per round. must be a positive int"):
        SpeculativeConfig(k=0)


# ---- model drafters: the target's first layers, a quantized copy, a separate draft model ---------------------

@pytest.fixture(scope="module")
def draft_models(smollm):
    model, tok = smollm
    return {"layerskip": layer_skip_model(model, 6), "quantized": quantized_copy(model, tok, "rtn", bits=8)}


@pytest.mark.parametrize("method", ["layerskip", "quantized", "model"])
def test_model_drafters_greedy_equal_plain_greedy(smollm, prompts, plain, draft_models, method):
    model, tok = smollm
    draft = draft_models["quantized" if method == "model" else method]
    config = SpeculativeConfig(k=3 if method == "model" else 4, method=method, draft_model=draft)
    llm = LLM(model, tokenizer=tok, num_kv_blocks=64, max_model_len=512, speculative=config,
              max_num_batched_tokens=9 if method == "model" else 2048)  # "model": a budget that withdraws drafts
    params = [SamplingParams(max_tokens=MAX_NEW, temperature=0, speculate=method != "layerskip" or i != 1)
              for i in range(3)]
    outs = llm.generate(prompts, params)
    assert [o.token_ids for o in outs] == plain
    s = llm.stats()
    assert s["spec_rounds"] > 0 and s["spec_draft_forwards"] >= s["spec_rounds"] // 3
    assert llm.extensions["speculative"].drafter.block_manager.num_used_blocks == 0  # every shadow released at finish
    per_request = [o.metrics.speculation for o in outs if o.metrics.speculation is not None]
    assert sum(r.rounds for r in per_request) == s["spec_rounds"]
    assert sum(r.accepted for r in per_request) == s["spec_accepted"]
    if method == "layerskip":
        assert outs[1].metrics.speculation is None  # the request that did not speculate
    if method == "quantized":  # an 8-bit copy agrees with the target almost always: most drafts are accepted
        assert s["spec_conditional_acceptance"] > 0.8


def test_layer_skip_shares_the_targets_weights(smollm, draft_models):
    model, _ = smollm
    draft = draft_models["layerskip"]
    assert draft.config.num_hidden_layers == 6 and len(draft.layers) == 6
    assert draft.layers[5] is model.layers[5] and draft.lm_head is model.lm_head and draft.norm is model.norm
    with pytest.raises(ValueError, match=r"draft_layers must be an int in \[1, 29\].*got 30"):
        layer_skip_model(model, 30)


def test_sampling_with_a_model_drafter_is_distributed_as_the_target(smollm, draft_models):
    """Temperature 1, top-k 3, three tokens: the first is sampled plainly, the second by a speculative round
    with a drafter that samples its own (different) distribution. (The rule itself, with a broken rule shown
    to fail, is tested on toy targets in test_spec_verify; this checks the engine's wiring of p, q and rows.) The pairs (t1, t2) of 900 seeded requests
    must follow the target's exact joint distribution, computed from its logits (chi-square)."""
    from lab.engine.sampler import probabilities
    from lab.models.reference import forward_logits
    from test_spec_verify import _chi_square_p

    model, tok = smollm
    prompt = tok.encode(tok.apply_chat_template([{"role": "user", "content": "Name a colour."}],
                                                add_generation_prompt=True, tokenize=False), add_special_tokens=False)
    params = [SamplingParams(temperature=1.0, top_k=3, max_tokens=3, ignore_eos=True, seed=i) for i in range(900)]
    joint = {}
    p1 = probabilities(forward_logits(model, prompt)[-1:], params[0])[0].double()
    for t1 in p1.nonzero().flatten().tolist():
        p2 = probabilities(forward_logits(model, prompt + [t1])[-1:], params[0])[0].double()
        for t2 in p2.nonzero().flatten().tolist():
            joint[(t1, t2)] = float(p1[t1] * p2[t2])
    llm = LLM(model, tokenizer=tok, num_kv_blocks=512, max_model_len=128, max_num_seqs=128,
              speculative=SpeculativeConfig(k=2, method="layerskip", draft_model=draft_models["layerskip"]))
    outs = llm.generate([prompt] * len(params), params)
    s = llm.stats()
    assert s["spec_rounds"] == len(params)  # every second token came from a speculative round
    assert 0 < s["spec_accepted"] < s["spec_drafted"]  # both paths: accepted drafts and residual resampling
    pairs = [tuple(o.token_ids[:2]) for o in outs]
    assert set(pairs) <= set(joint)
    keys = sorted(joint)
    counts = torch.tensor([pairs.count(key) for key in keys], dtype=torch.float64)
    assert _chi_square_p(counts, torch.tensor([joint[key] for key in keys])) > 1e-3


def test_policy_pauses_a_request_whose_acceptance_is_low(smollm, prompts, plain, draft_models):
    model, tok = smollm
    runs = {}
    for min_acceptance in (None, 0.55):
        config = SpeculativeConfig(k=2, method="layerskip", draft_model=draft_models["layerskip"],
                                   min_acceptance=min_acceptance, probe_rounds=3, backoff_tokens=10)
        llm = LLM(model, tokenizer=tok, num_kv_blocks=64, max_model_len=512, speculative=config)
        assert [o.token_ids for o in llm.generate(prompts, SamplingParams(max_tokens=MAX_NEW, temperature=0))] == plain
        runs[min_acceptance] = llm.stats()
    assert runs[None]["spec_policy_pauses"] == 0 and runs[0.55]["spec_policy_pauses"] > 0
    assert runs[0.55]["spec_rounds"] < runs[None]["spec_rounds"]


def test_abort_releases_the_drafters_blocks(smollm, prompts, draft_models):
    model, tok = smollm
    llm = LLM(model, tokenizer=tok, num_kv_blocks=64, max_model_len=512,
              speculative=SpeculativeConfig(method="layerskip", draft_model=draft_models["layerskip"]))
    rid = llm.add_request(prompts[0], SamplingParams(max_tokens=MAX_NEW, temperature=0))
    for _ in range(3):
        llm.step()
    assert llm.extensions["speculative"].drafter.block_manager.num_used_blocks > 0
    llm.abort(rid)
    assert llm.extensions["speculative"].drafter.block_manager.num_used_blocks == 0 and llm.block_manager.num_used_blocks == 0


def test_a_model_drafter_reuses_the_prompt_blocks_of_a_one_round_request(smollm, prompts, draft_models):
    """Three tokens, k=2: each request makes one speculative round. The second request with the same prompt finds
    the prompt's full blocks in the drafter's cache (they were named only when a request synced for a second round,
    so one-round requests never left any: the chi-square test above caught up on 900 whole prompts)."""
    model, tok = smollm
    llm = LLM(model, tokenizer=tok, num_kv_blocks=64, max_model_len=512,
              speculative=SpeculativeConfig(k=2, method="layerskip", draft_model=draft_models["layerskip"]))
    params = SamplingParams(max_tokens=3, temperature=0, ignore_eos=True)
    outs, caught_up = [], []
    for _ in range(2):
        before = llm.stats()["spec_draft_catch_up_tokens"]
        outs += [o.token_ids for o in llm.generate([prompts[0]], params)]
        caught_up.append(llm.stats()["spec_draft_catch_up_tokens"] - before)
    assert llm.stats()["spec_rounds"] == 2 and outs[0] == outs[1]
    assert caught_up == [len(prompts[0]), len(prompts[0]) % llm.block_manager.block_size], caught_up
    assert llm.extensions["speculative"].drafter.block_manager.num_used_blocks == 0


def test_bad_speculative_settings_are_refused(smollm):
    model, tok = smollm
    with pytest.raises(ValueError, match="method 'eagle' is not one of"):
        SpeculativeConfig(method="eagle")
    with pytest.raises(ValueError, match='method "model" needs draft_model'):
        SpeculativeConfig(method="model")
    with pytest.raises(ValueError, match="min_acceptance must be in"):
        SpeculativeConfig(min_acceptance=1.5)
    from lab.kv.format import KVCacheFormat
    with pytest.raises(ValueError, match="speculative decoding needs a KV format without staged exact copies"):
        LLM(model, tokenizer=tok, num_kv_blocks=16, max_model_len=128, speculative=SpeculativeConfig(),
            kv_cache_dtype=KVCacheFormat("int4", window=16))
    from lab.models import load_model
    other, _ = load_model("random:tiny")
    with pytest.raises(ValueError, match=r"draft model's vocabulary \(\d+\) is not the target's \(49152\)"):
        LLM(model, tokenizer=tok, num_kv_blocks=16, max_model_len=128,
            speculative=SpeculativeConfig(method="model", draft_model=other))


@pytest.mark.parametrize("changed", [{"repetition_penalty": 1.2}, {"presence_penalty": 0.5}, {"min_tokens": 2},
                                     {"logit_bias": {5: 1.0}}])
def test_a_request_whose_logits_a_processor_changes_is_refused_speculation_but_served_plain(smollm, prompts, changed):
    """Verification compares drafts with the unprocessed distribution: such a request must say speculate=False."""
    model, tok = smollm
    llm = LLM(model, tokenizer=tok, num_kv_blocks=16, max_model_len=128, speculative=SpeculativeConfig())
    with pytest.raises(ValueError, match="speculative verification does not do yet"):
        llm.make_sequence(prompts[2], SamplingParams(max_tokens=2, **changed))
    assert llm.make_sequence(prompts[2], SamplingParams(max_tokens=2, speculate=False, **changed)).params.speculate is False


def test_speculation_on_a_quantized_pool_equals_plain_decoding_on_it(smollm, prompts):
    """int8 per-token codes and scales live in each token's slot: a rolled-back draft's are rewritten. Plain
    decoding reads the pool through the batched decode attention, verification through a chunk's attention: on
    quantized K/V the two may part at a near-tie (as prefix hit and miss may, tests/test_kv_engine.py), so where
    the greedy paths part, the quantized reference must find the two tokens within 0.05 nats of each other; a
    stale code from a rolled-back draft would corrupt the context, not tip a tie."""
    from lab.kv.format import KVCacheFormat
    from lab.kv.calibration import QuantizedContiguousKVCache
    from greedy_helpers import divergence_gap  # tests/ is on sys.path (pytest prepends it)

    model, tok = smollm
    params = SamplingParams(max_tokens=MAX_NEW, temperature=0)
    runs = [[o.token_ids for o in LLM(model, tokenizer=tok, num_kv_blocks=64, max_model_len=512,
                                      kv_cache_dtype="int8", speculative=spec).generate(prompts, params)]
            for spec in (None, SpeculativeConfig(k=4))]
    parted = [(p, a, b) for p, a, b in zip(prompts, *runs) if a != b]
    assert len(parted) <= 1, "more than one request parted: not a tie"
    for prompt, want, got in parted:
        i, gap = divergence_gap(model, prompt, want, got, QuantizedContiguousKVCache(model, KVCacheFormat("int8")))
        assert abs(gap) < 0.05 and i > 0, (i, gap)


def test_policy_pause_doubles_after_each_failed_probe_and_resets():
    from lab.engine.request import Sequence
    from lab.speculative.speculator import Speculator

    spec = Speculator(SpeculativeConfig(min_acceptance=0.5, probe_rounds=1, backoff_tokens=4, max_backoff_tokens=12),
                      None, 1, 16, 100)
    seq = Sequence([1, 2, 3], SamplingParams())
    pauses = []
    for out in (10, 20, 40, 60):
        spec._apply_policy(seq, 4, 0, out)  # a = 0: the probe fails
        pauses.append(spec.paused_until[seq.request_id] - out)
    assert pauses == [4, 8, 12, 12] and spec.pauses == 4
    spec._apply_policy(seq, 4, 4, 80)  # a = 1: passes, the next failure pauses for backoff_tokens again
    spec._apply_policy(seq, 4, 0, 90)
    assert spec.paused_until[seq.request_id] == 94
