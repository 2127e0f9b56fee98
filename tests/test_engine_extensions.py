"""The engine's extension hooks (lab.engine.extension) on the real model, and the defects the old wiring hid:

1. speculation hashed blocks completed by accepted drafts over a token list that did not yet hold them, so a
   request continuing a speculative request's output missed those blocks in the prefix cache;
2. an abort never reached the replay controller (its ranges and kept layer inputs leaked), and nothing removed
   the HCache hooks from a shared model;
3. three readings of a KV-format string (`lab eval` accepted "int4/per-token", `LLM` and `lab serve` did not).
"""

import pytest

from lab.engine import LLM, EngineConfig, SamplingParams
from lab.engine.extension import EngineExtension, StepView
from lab.kv.format import KVCacheFormat, parse_format, parse_kv_cache_dtype
from lab.replay import ReplayConfig
from lab.speculative import SpeculativeConfig

# Repetitive text: n-gram drafts are accepted often, so accepted drafts complete blocks.
REPEAT = "Repeat this sentence four times: the quick brown fox jumps over the lazy dog."


@pytest.fixture(scope="module")
def repeat_ids(smollm):
    _, tok = smollm
    return tok.encode(tok.apply_chat_template([{"role": "user", "content": REPEAT}], add_generation_prompt=True,
                                              tokenize=False), add_special_tokens=False)


def test_a_continuation_of_a_speculative_output_hits_every_full_block(smollm, repeat_ids):
    model, tok = smollm
    llm = LLM(model, tokenizer=tok, num_kv_blocks=128, max_model_len=512, speculative=SpeculativeConfig(k=4))
    first = llm.generate([repeat_ids], SamplingParams(max_tokens=96, temperature=0, ignore_eos=True))[0]
    assert llm.stats()["spec_accepted"] >= 8  # blocks completed by accepted drafts (19 of 96 tokens here)
    # Every token but the last emitted one went through the model: its full blocks are in the cache.
    computed = len(repeat_ids) + len(first.token_ids) - 1
    follow = repeat_ids + first.token_ids + tok.encode(" Thanks!", add_special_tokens=False)
    second = llm.generate([follow], SamplingParams(max_tokens=1, temperature=0))[0]
    assert second.metrics.num_cached_tokens == computed // 16 * 16


def test_a_stop_inside_accepted_drafts_hashes_only_the_tokens_kept(smollm, repeat_ids):
    """A request that stops at an accepted draft holds fewer tokens than it computed: its blocks are hashed over
    what it holds, so a later request with the same tokens hits them and decodes as a fresh engine would."""
    model, tok = smollm
    plain = LLM(model, tokenizer=tok, num_kv_blocks=128, max_model_len=512)
    reference = plain.generate([repeat_ids], SamplingParams(max_tokens=64, temperature=0, ignore_eos=True))[0]
    stop = reference.token_ids[40]  # the first occurrence of this token ends the speculative run there
    stop_at = reference.token_ids.index(stop)
    llm = LLM(model, tokenizer=tok, num_kv_blocks=128, max_model_len=512, speculative=SpeculativeConfig(k=4))
    out = llm.generate([repeat_ids], SamplingParams(max_tokens=64, temperature=0, ignore_eos=True,
                                                    stop_token_ids=[stop]))[0]
    assert out.token_ids == reference.token_ids[:stop_at + 1]
    again = llm.generate([repeat_ids + out.token_ids], SamplingParams(max_tokens=8, temperature=0,
                                                                    ignore_eos=True))[0]
    fresh = plain.generate([repeat_ids + out.token_ids], SamplingParams(max_tokens=8, temperature=0,
                                                                       ignore_eos=True))[0]
    assert again.metrics.num_cached_tokens > 0 and again.token_ids == fresh.token_ids


def test_aborts_leave_nothing_in_the_replay_controller_and_close_removes_its_hooks(smollm, chat_prompt_ids):
    model, tok = smollm
    hooks_before = sum(len(layer.self_attn.qkv_proj._forward_pre_hooks) for layer in model.layers)
    llm = LLM(model, tokenizer=tok, num_kv_blocks=64, max_model_len=256,
              replay=ReplayConfig(window=8, always=True, min_position=0.0, source="hidden"))
    params = SamplingParams(max_tokens=32, temperature=0, ignore_eos=True)
    ids = [llm.add_request(p, params) for p in chat_prompt_ids[:2]]
    for _ in range(6):  # the prompts and a few decode steps with replays
        llm.step()
    replay = llm.extensions["replay"]
    assert llm.stats()["replays"] > 0 and set(ids) <= set(replay.hidden.inputs) and set(ids) <= set(replay.cached_ranges)
    for rid in ids:
        llm.abort(rid)
    assert not set(ids) & (set(replay.cached_ranges) | set(replay.replayed) | set(replay.hidden.inputs)
                           | set(replay.hidden.first_kept))
    assert llm.block_manager.num_used_blocks == 0
    assert sum(len(layer.self_attn.qkv_proj._forward_pre_hooks) for layer in model.layers) > hooks_before
    llm.close()
    assert sum(len(layer.self_attn.qkv_proj._forward_pre_hooks) for layer in model.layers) == hooks_before


class Recorder(EngineExtension):
    """Records the hooks the engine calls, in order."""

    name = "recorder"

    def __init__(self):
        self.calls, self.finished = [], []

    def before_schedule(self, step):
        assert isinstance(step, StepView)  # the step hooks see a narrow view, never the LLM
        self.calls.append("before_schedule")

    def after_schedule(self, step, scheduled):
        assert isinstance(step, StepView)
        self.calls.append("after_schedule")
        return {}

    def process_logits(self, seq, logits):
        self.calls.append("process_logits")
        return None

    def on_finish(self, seq):
        self.finished.append((seq.request_id, seq.finish_reason))

    def after_step(self, step):
        assert isinstance(step, StepView)
        self.calls.append("after_step")

    def stats(self):
        return {"recorder_finished": len(self.finished)}


class RecorderConfig:
    def build(self, engine):
        return Recorder()


def test_every_finish_and_every_abort_reaches_every_extension_in_the_documented_order(smollm, chat_prompt_ids):
    model, tok = smollm
    llm = LLM(model, tokenizer=tok, num_kv_blocks=64, max_model_len=256, max_num_seqs=2,
              extensions=[RecorderConfig()])
    rec = llm.extensions["recorder"]
    done = llm.add_request(chat_prompt_ids[0], SamplingParams(max_tokens=2, temperature=0, ignore_eos=True))
    running = llm.add_request(chat_prompt_ids[1], SamplingParams(max_tokens=50, temperature=0, ignore_eos=True))
    waiting = llm.add_request(chat_prompt_ids[2], SamplingParams(max_tokens=50, temperature=0))  # no seat yet
    llm.step()
    assert rec.calls == ["before_schedule", "after_schedule", "process_logits", "process_logits", "after_step"]
    llm.abort(running)
    llm.abort(waiting)
    while llm.has_unfinished():
        llm.step()
    assert sorted(rec.finished) == sorted([(done, "length"), (running, "abort"), (waiting, "abort")])
    assert llm.stats()["recorder_finished"] == 3 and llm.block_manager.num_used_blocks == 0


class BiasWatcher(Recorder):
    """Asked for by the requests that set `logit_bias`: its per-request hooks hear those requests only."""

    name = "bias_watcher"
    requested_by = "logit_bias"

    def check_request(self, seq):
        self.calls.append(("check_request", seq.request_id))


class BiasWatcherConfig:
    def build(self, engine):
        return BiasWatcher()


def test_an_extension_asked_for_by_a_field_hears_only_the_requests_that_set_it(smollm, chat_prompt_ids):
    model, tok = smollm
    llm = LLM(model, tokenizer=tok, num_kv_blocks=64, max_model_len=256, extensions=[BiasWatcherConfig()])
    watcher = llm.extensions["bias_watcher"]
    plain = llm.add_request(chat_prompt_ids[0], SamplingParams(max_tokens=3, temperature=0))
    biased = llm.add_request(chat_prompt_ids[1], SamplingParams(max_tokens=3, temperature=0, logit_bias={7: -5.0}))
    while llm.has_unfinished():
        llm.step()
    assert ("check_request", biased) in watcher.calls and ("check_request", plain) not in watcher.calls
    assert watcher.calls.count("process_logits") == 3  # the biased request's three tokens, not the plain one's
    assert [rid for rid, _ in watcher.finished] == [biased]
    assert watcher.calls.count("after_step") == llm.num_steps  # step hooks run every step, for every request


def test_adding_an_extension_leaves_a_loop_over_the_old_ones_running(smollm, chat_prompt_ids):
    """A server adds `FanOut` (its first `n` > 1) on the event loop's thread while the engine thread may be in a
    loop over the extensions: the engine swaps in a new dict rather than changing the one being iterated."""
    model, tok = smollm
    llm = LLM(model, tokenizer=tok, num_kv_blocks=64, max_model_len=256, extensions=[RecorderConfig()])
    seen = []
    for name in llm.extensions:  # an engine thread's loop, interrupted by the server's first n = 2 request
        seen.append(name)
        if len(seen) == 1:
            llm.add_samples([llm.make_sequence(chat_prompt_ids[0], q)
                             for q in SamplingParams(n=2, max_tokens=2, temperature=0).samples()])
    assert "fanout" in llm.extensions and "fanout" not in seen
    while llm.has_unfinished():
        llm.step()
    assert llm.block_manager.num_used_blocks == 0


def test_two_rewinding_extensions_are_refused_by_name(smollm):
    model, tok = smollm
    with pytest.raises(ValueError, match="speculative and replay both rewind"):
        LLM(model, tokenizer=tok, num_kv_blocks=16, max_model_len=128, replay=ReplayConfig(),
            speculative=SpeculativeConfig())
    with pytest.raises(ValueError, match="has no build"):
        EngineConfig(extensions=[object()])


@pytest.mark.parametrize("spec, expected", [
    ("auto", None), (None, None),
    ("fp8", KVCacheFormat("fp8_e4m3")),  # vLLM's spelling
    ("fp8_e5m2", KVCacheFormat("fp8_e5m2")),
    ("int4/per-token", KVCacheFormat("int4", "per-token")),
    ("int2/per-channel/group16/window32", KVCacheFormat("int2", "per-channel", token_group=16, window=32)),
])
def test_one_reading_of_a_kv_cache_dtype(spec, expected):
    assert parse_kv_cache_dtype(spec) == expected
    assert EngineConfig(kv_cache_dtype=spec).kv_format == expected
    if isinstance(spec, str) and spec != "auto":
        assert parse_format(spec)[0] == expected  # lab eval's reading, which also takes k-only / v-only


def test_kv_cache_dtype_strings_that_cannot_be_served_are_refused_by_name():
    with pytest.raises(ValueError, match="'int4/k-only'.*keys and values together"):
        EngineConfig(kv_cache_dtype="int4/k-only")
    with pytest.raises(ValueError, match="must start with one of"):
        EngineConfig(kv_cache_dtype="int3")
    with pytest.raises(ValueError, match="dtype 'fp64' is not one of"):
        EngineConfig(dtype="fp64")


def test_an_engine_serves_a_granularity_given_as_a_string(smollm, chat_prompt_ids):
    model, tok = smollm
    params = SamplingParams(max_tokens=8, temperature=0)
    outs = [LLM(model, tokenizer=tok, num_kv_blocks=32, max_model_len=256, kv_cache_dtype=kv).generate(
        chat_prompt_ids[:2], params) for kv in ("int4/per-token", KVCacheFormat("int4", "per-token"))]
    assert [o.token_ids for o in outs[0]] == [o.token_ids for o in outs[1]]
