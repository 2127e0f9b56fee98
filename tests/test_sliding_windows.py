"""Sliding windows that bind in the paged cache (issue 37 item 1): attention restricted to each windowed layer's
last W keys, and, when every layer has a window (Mistral), the blocks outside it returned to the pool.

A tiny random Mistral (every layer windowed, W = 20) against transformers in float32 with prompts and outputs well
past the window: logits, and greedy tokens through paged decode, chunked prefill, prefix hits and preemption with
the blocks being freed. Then the freeing itself (a decode holds at most ceil((W - 1) / bs) + 1 blocks, which
`lab.memory.blocks_held` counts; Gemma's global layers keep every block), the prefix cache's window-aware hits
on hand-built sequences, and what the engine still refuses.
"""

import pytest
import torch
from test_model_families import COMMON, GREEDY, N_NEW, prompts, save_tiny_hf, tokens

from lab.engine import LLM, SamplingParams
from lab.engine.block_manager import NULL_BLOCK, BlockManager
from lab.engine.request import Sequence
from lab.memory import ModelShape, blocks_held
from lab.models import load_model
from lab.models.reference import ContiguousKVCache, forward_logits

WINDOW = 20


def mistral_config(**over):
    import transformers as tf

    return tf.MistralConfig(**{**COMMON, "sliding_window": WINDOW, **over})


class TinyMistral:
    def __init__(self, path):
        self.hf = save_tiny_hf(path, mistral_config())
        self.model, _ = load_model(path, device="cpu", dtype=torch.float32)
        self.prompts = prompts()
        long = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)  # 61-85 tokens: 3-4 windows
        self.params = long
        with torch.inference_mode():
            self.expected = [self.hf.generate(torch.tensor([p]), max_new_tokens=long.max_tokens, do_sample=False,
                                              eos_token_id=None, pad_token_id=0)[0, len(p):].tolist()
                             for p in self.prompts]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, one_thread):
    return TinyMistral(tmp_path_factory.mktemp("mistral"))


def windowed_engine(model, **kw) -> LLM:
    llm = LLM(model, tokenizer=None, max_model_len=128, **{"num_kv_blocks": 64, **kw})
    assert llm.block_manager.sliding_window == llm.runner.free_window  # the engine frees by the runner's window
    return llm


def test_windowed_logits_match_transformers(tiny):
    ids = tiny.prompts[3]  # 45 tokens, more than twice the window
    with torch.inference_mode():
        theirs = tiny.hf(torch.tensor([ids])).logits[0]
    assert (forward_logits(tiny.model, ids) - theirs).abs().max().item() <= 1e-4
    unwindowed = forward_logits(tiny.model, ids, ContiguousKVCache(3))  # the window binds: without it, others
    assert (unwindowed[WINDOW:] - theirs[WINDOW:]).abs().max().item() > 1e-2
    assert (unwindowed[:WINDOW] - theirs[:WINDOW]).abs().max().item() <= 1e-4


@pytest.mark.parametrize("options", [
    {},  # plain prefill and decode, blocks freed as the window moves
    dict(max_num_batched_tokens=7, enable_prefix_caching=False),  # chunks of 7, each reading back past its start
    dict(num_kv_blocks=7, enable_prefix_caching=False),  # 4 sequences of 3 blocks each cannot all fit
], ids=["paged", "chunked", "preempted"])
def test_greedy_tokens_match_transformers_with_blocks_freed(tiny, options):
    llm = windowed_engine(tiny.model, **options)
    assert llm.runner.free_window == WINDOW
    assert tokens(llm.generate(tiny.prompts, tiny.params)) == tiny.expected
    if "num_kv_blocks" in options:
        assert llm.stats()["preemptions"] > 0


def test_prefix_hits_with_freed_blocks_match(tiny):
    """The second round's prompts hit the first round's blocks, some of them freed (still cached, in the pool);
    a hit takes only the blocks its first query's window reads and NULL for the rest."""
    llm = windowed_engine(tiny.model, enable_prefix_caching=True)
    first = llm.generate(tiny.prompts, tiny.params)
    second = llm.generate(tiny.prompts, tiny.params)
    assert all(o.metrics.num_cached_tokens >= 16 for o in second)
    assert tokens(first) == tokens(second) == tiny.expected


def max_blocks_per_step(llm: LLM, prompt: list[int], max_tokens: int) -> list[int]:
    """The blocks the one running sequence holds (not NULL) after each step's schedule, step by step."""
    llm.add_request(prompt, SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True))
    held = []
    while llm.has_unfinished():
        llm.step()
        held += [sum(b != NULL_BLOCK for b in s.block_table) for s in llm.scheduler.running]
    return held


def test_blocks_outside_the_window_are_freed_and_counted(tiny):
    """Before this change the engine kept all ceil(85 / 16) = 6 blocks of an 85-token sequence; with W = 20 a
    decode step holds at most ceil(19 / 16) + 1 = 3, which `blocks_held` counts, and so do chunks of 7 tokens
    (ceil(25 / 16) + 1 = 3); the pool's used blocks are the sequence's."""
    shape = ModelShape.from_hf_config(mistral_config().to_dict())
    for chunk, per_step in ((128, 1), (7, 7)):  # the 45-token prompt at once, then decodes; or chunks of 7
        llm = windowed_engine(tiny.model, enable_prefix_caching=False, max_num_batched_tokens=chunk)
        held = max_blocks_per_step(llm, tiny.prompts[3], 40)
        assert max(held) == blocks_held(shape, 85, 16, tokens_per_step=per_step) == 3 < -(-85 // 16)
        assert llm.block_manager.num_used_blocks == 0  # finished: everything back


def test_gemma_global_layers_keep_every_block(tmp_path, one_thread):
    """Gemma 2's global layers read the whole context from the one pool every layer shares: nothing is freed, and
    the calculator says so (`blocks_held` is the full length although half the layers are windowed)."""
    import transformers as tf

    config = tf.Gemma2Config(**COMMON, head_dim=16, sliding_window=WINDOW, pad_token_id=None)
    save_tiny_hf(tmp_path, config)
    model, _ = load_model(tmp_path, device="cpu", dtype=torch.float32)
    llm = windowed_engine(model)
    assert llm.runner.free_window is None and llm.block_manager.sliding_window is None
    held = max_blocks_per_step(llm, prompts()[3], 40)
    shape = ModelShape.from_hf_config(config.to_dict())
    assert shape.sliding_window_layers == 2 and max(held) == blocks_held(shape, 85, 16) == 6


def test_replay_is_refused_where_blocks_are_freed(tiny):
    """Replay rewinds num_computed_tokens; its recomputed queries would read blocks already freed."""
    from lab.replay import ReplayConfig

    with pytest.raises(ValueError, match="replay rewinds .* sliding window of 20"):
        LLM(tiny.model, tokenizer=None, max_model_len=128, num_kv_blocks=64, replay=ReplayConfig())
    LLM(tiny.model, tokenizer=None, max_model_len=WINDOW, num_kv_blocks=64, replay=ReplayConfig())  # never binds


@pytest.mark.parametrize("kv", ["int4/per-channel", "int8/window16"])
def test_kv_formats_with_exact_copies_are_refused_before_any_step(tiny, kv):
    with pytest.raises(ValueError, match="keeps exact copies or pre-RoPE keys"):
        LLM(tiny.model, tokenizer=None, max_model_len=128, num_kv_blocks=64, kv_cache_dtype=kv)


def test_a_plain_quantized_cache_frees_as_the_full_one(tiny):
    """int8 with per-token scales reads back what it stored wherever the block lies: freeing changes nothing."""
    kept = LLM(tiny.model, tokenizer=None, max_model_len=128, num_kv_blocks=64, kv_cache_dtype="int8")
    kept.block_manager.sliding_window = None  # this engine keeps every block
    freed = windowed_engine(tiny.model, kv_cache_dtype="int8")
    assert tokens(freed.generate(tiny.prompts, tiny.params)) == tokens(kept.generate(tiny.prompts, tiny.params))


# ---- the block pool on hand-built sequences -----------------------------------------------------------------

BS = 4


def seq(tokens_):
    return Sequence(list(tokens_), SamplingParams(temperature=0, max_tokens=4))


def run(bm: BlockManager, s: Sequence, n: int) -> None:
    """Allocate and compute `s` up to n tokens, then free what the window leaves behind, as the engine does."""
    assert bm.allocate(s, n)
    bm.update(s, n)
    bm.cache_full_blocks(s)
    bm.free_outside_window(s)


def test_freeing_follows_the_window_and_keeps_the_prefix_cache():
    bm = BlockManager(16, BS, sliding_window=6)
    a = seq(range(100, 132))  # 8 blocks of 4
    run(bm, a, 12)  # the next query (position 12) sees keys 7 .. 12: blocks 0 (0-3) freed, 1 (4-7) kept
    assert a.block_table[0] == NULL_BLOCK and a.block_table[1] != NULL_BLOCK
    run(bm, a, 32)  # next query at 32 sees 27 ..: blocks 0-5 freed
    assert a.block_table[:6] == [NULL_BLOCK] * 6 and NULL_BLOCK not in a.block_table[6:]
    assert bm.num_used_blocks == 2
    # The same prompt again: a hit of 7 blocks (never the last token's), of which only 5 and 6 (positions 20-27,
    # what a query at 28 sees from 23 on) are taken, freed but intact in the pool; 0-4 are NULL, not taken.
    b = seq(range(100, 132))
    blocks, hashes = bm.find_cached_prefix(b)
    assert len(hashes) == 7 and blocks[:5] == [NULL_BLOCK] * 5 and blocks[5:] == a_blocks(bm, hashes[5:])
    used = bm.num_used_blocks
    assert bm.allocate(b, 32, blocks, hashes) and bm.num_used_blocks == used + 2  # 5 from the pool, a new 7; 6 shared
    bm.free_sequence(a)
    bm.free_sequence(b)
    assert bm.num_used_blocks == 0 and sorted(bm.ref_count) == [0] * 16


def a_blocks(bm: BlockManager, hashes: list[bytes]) -> list[int]:
    return [bm.cached[h] for h in hashes]


def test_an_evicted_block_is_no_hit_and_an_early_gap_does_not_cut_one():
    """A freed block handed to another sequence loses its hash: a later prompt cannot hit it. Where the evicted
    block lies before the window of the hit's end, the hit still reaches the end (it never reads that block);
    where it lies inside, the hit stops before it."""
    bm = BlockManager(8, BS, sliding_window=6)
    a = seq(range(100, 132))
    run(bm, a, 32)  # blocks 0-5 freed (cached, in the pool), 6 and 7 held
    bm.free_sequence(a)
    taker = seq(range(500, 504))
    assert bm.allocate(taker, 4)  # takes the least recently freed: one of a's blocks, whose hash goes
    evicted = taker.block_table[0]
    assert bm.hash_of[evicted] is None and evicted not in bm.cached.values()
    blocks, hashes = bm.find_cached_prefix(seq(range(100, 132)))
    assert evicted not in blocks
    # the window freed a's blocks oldest first, so the evicted one held positions 0-3: the hit still covers 7
    assert len(hashes) == 7 and blocks[:5] == [NULL_BLOCK] * 5 and blocks[5:] == a_blocks(bm, hashes[5:])
    # Let the next allocation take the block of positions 20-23, inside the window of a hit ending at 28: the hit
    # ends where that block begins, at 20, reading 16-19 from the block before it.
    bm.free.move_to_end(blocks[5], last=False)
    assert bm.allocate(taker, 8) and taker.block_table[1] == blocks[5]
    blocks, hashes = bm.find_cached_prefix(seq(range(100, 132)))
    assert len(hashes) == 5 and blocks[:3] == [NULL_BLOCK] * 3
    assert all(bm.hash_of[b] == h for b, h in zip(blocks[3:], hashes[3:]))


def test_no_window_no_freeing():
    bm = BlockManager(16, BS)
    a = seq(range(100, 132))
    run(bm, a, 32)
    assert NULL_BLOCK not in a.block_table and bm.num_used_blocks == 8


def test_attention_outside_the_engine_applies_the_window_or_refuses_it_by_name(tiny):
    """The KV-scale calibration's forward attends within the window (its hidden states are the engine's); the
    KV-error recorder, the quantized contiguous cache and GPTQ/AWQ's calibration pass compute plain causal
    attention and refuse a window that binds, by name, where they computed the wrong attention silently."""
    from lab.eval.kv_error import record
    from lab.kv.format import parse_format
    from lab.kv.calibration import QuantizedContiguousKVCache, _Recorder
    from lab.quant.layerwise import CalibrationPass

    model, ids = tiny.model, tiny.prompts[3]  # 45 tokens, the window 20
    rec = _Recorder(len(model.layers), None, "max", 99.9, model.attention_layout)
    with torch.inference_mode():
        logits = model.compute_logits(model(torch.tensor(ids), torch.arange(len(ids)), rec))
        want = tiny.hf(torch.tensor([ids])).logits[0]
    torch.testing.assert_close(logits, want, atol=1e-4, rtol=0)
    with pytest.raises(ValueError, match="KV-error recorder .* sliding window of 20 keys"):
        record(model, ids)
    with pytest.raises(ValueError, match="quantized contiguous KV cache .* sliding window of 20 keys"):
        with torch.inference_mode():
            model(torch.tensor(ids), torch.arange(len(ids)), QuantizedContiguousKVCache(model, parse_format("int8/per-token")[0]))
    with pytest.raises(ValueError, match="GPTQ/AWQ calibration .* sliding window"):
        CalibrationPass(model, [ids]).run(model.layers[0])
    record(model, ids[:20])  # within the window: plain attention is the model's
