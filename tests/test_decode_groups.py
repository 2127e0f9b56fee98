"""Decodes of very different lengths are batched in groups (`lab.models.attention.length_groups`): one long
context among many short ones no longer pads every short decode to its length. The groups cover every decode
once, read fewer positions, and compute what one padded batch computes."""

import random

import pytest
import torch

from lab.engine import LLM, SamplingParams
from lab.kv import KVCacheFormat, build_store
from lab.models import load_model
from lab.models.attention import MIN_PADDING_SAVED, PagedAttentionMetadata, TorchPagedAttention, length_groups

BLOCK = 16


def test_groups_split_only_where_padding_would_double_and_the_saving_is_worth_a_group():
    assert length_groups([100] * 40) is None  # like lengths: one batch
    assert length_groups([40, 18]) is None  # a split would save 22 positions, less than a group costs
    assert length_groups([]) is None and length_groups([7]) is None
    (long, long_span), (short, short_span) = length_groups([100] * 20 + [2074] * 3 + [90] * 20)
    assert (long, long_span) == ((20, 21, 22), 2074) and short_span == 100 and len(short) == 40
    rng = random.Random(0)
    for _ in range(200):
        lens = [rng.choice([rng.randint(1, 64), rng.randint(1, 4096)]) for _ in range(rng.randint(1, 60))]
        groups = length_groups(lens) or ((tuple(range(len(lens))), max(lens)),)
        assert sorted(i for rows, _ in groups for i in rows) == list(range(len(lens)))  # each decode once
        assert [span for _, span in groups] == sorted((span for _, span in groups), reverse=True)
        for rows, span in groups:
            assert span == max(lens[i] for i in rows)
        # Between one group and the next, the padding the split saves is at least the minimum.
        for (_, span), (rows, next_span) in zip(groups, groups[1:]):
            later = sum(len(r) for r, s in groups if s <= next_span)
            assert 2 * next_span <= span and later * (span - next_span) >= MIN_PADDING_SAVED


class CountingStore:
    """A store that counts the blocks attention gathers."""

    def __init__(self, store):
        self.store, self.gathered = store, 0

    def __getattr__(self, name):
        return getattr(self.store, name)

    def gather(self, layer, blocks, per_sequence=None):
        self.gathered += blocks.numel()
        return self.store.gather(layer, blocks, per_sequence)


def _decode_meta(lens: list[int], grouped: bool, dtype) -> PagedAttentionMetadata:
    """Decodes only, sequence i in its own run of blocks, as `ModelRunner.prepare` lays them out."""
    tables, first = [], 0
    for n in lens:
        tables.append(list(range(first, first + -(-n // BLOCK))))
        first += len(tables[-1])
    width = max(map(len, tables))
    lens_t = torch.tensor(lens)
    bias = torch.zeros(len(lens), width * BLOCK, dtype=dtype).masked_fill_(
        torch.arange(width * BLOCK)[None, :] >= lens_t[:, None], float("-inf"))
    slots = torch.tensor([t[(n - 1) // BLOCK] * BLOCK + (n - 1) % BLOCK for t, n in zip(tables, lens)])
    return PagedAttentionMetadata(
        slot_mapping=slots, positions=lens_t - 1, decode_rows=torch.arange(len(lens)),
        decode_blocks=torch.tensor([b for t in tables for b in t + [0] * (width - len(t))]),
        decode_bias=bias[:, None, None, :], decode_lens=lens_t, prefills=[], max_decode_len=max(lens),
        decode_groups=length_groups(lens) if grouped else None)


def test_grouped_decodes_read_fewer_blocks_and_equal_one_padded_batch():
    model, _ = load_model("random:tiny", dtype=torch.float32, device="cpu")
    lens = [1000, 37, 20, 61, 5, 900, 44] + [30] * 30
    store = CountingStore(build_store(model, sum(-(-n // BLOCK) for n in lens) + 1, BLOCK))
    n_kv, d = store.k_cache[0].shape[-2:]
    torch.manual_seed(0)
    for layer in range(len(store.k_cache)):
        store.k_cache[layer].normal_()
        store.v_cache[layer].normal_()
    q, k, v = torch.randn(len(lens), 2 * n_kv, d), torch.randn(len(lens), n_kv, d), torch.randn(len(lens), n_kv, d)
    out = {}
    for grouped in (False, True):
        store.gathered = 0
        meta = _decode_meta(lens, grouped, torch.float32)
        assert (meta.decode_groups is not None) == grouped
        out[grouped] = TorchPagedAttention(store, meta).attend(0, q, k, v)
        out[grouped, "blocks"] = store.gathered
    torch.testing.assert_close(out[True], out[False], rtol=1e-5, atol=1e-6)  # float32 sums in another order
    # One batch pads all 37 decodes to 63 blocks; the groups read the two long ones' and the others' own.
    assert out[False, "blocks"] == 37 * 63 and out[True, "blocks"] == 2 * 63 + 35 * 4


@pytest.mark.slow
@pytest.mark.parametrize("kv", [None, KVCacheFormat("int4", "per-channel", token_group=4)],
                         ids=["exact", "int4-per-channel"])
def test_a_long_decode_among_short_ones_gives_the_greedy_tokens_of_one_padded_batch(smollm, monkeypatch, one_thread,
                                                                                     kv):
    """The real model, float32: a 128-token prompt decoding beside twelve short ones (two groups a step: the
    split saves 12 x ~110 padded positions a layer) gives the tokens it gives when every decode is padded to the
    longest; also through a quantized cache whose decodes read their per-channel keys' open group exactly from
    its staging lanes, where each group takes its own decodes' exact reads (an int8 cache with a window of 5 gave
    the same tokens even with those reads skipped, so it is not the case tested)."""
    model, tok = smollm
    long = tok.encode("\n".join(f"Line {i}: the river bends east past mill number {i}." for i in range(12)))
    short = [tok.encode(f"Count from {i} to {i + 9}:") for i in range(12)]
    prompts = [long[:128]] + short
    greedy = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    engine = dict(tokenizer=tok, num_kv_blocks=64, max_model_len=256, kv_cache_dtype=kv)
    calls = []
    monkeypatch.setattr("lab.engine.model_runner.length_groups", lambda lens: calls.append(g := length_groups(lens))
                        or g)
    grouped = [o.token_ids for o in LLM(model, **engine).generate(prompts, greedy)]
    assert any(g is not None and len(g) == 2 for g in calls)  # the long decode was batched apart
    monkeypatch.setattr("lab.engine.model_runner.length_groups", lambda lens: None)
    assert [o.token_ids for o in LLM(model, **engine).generate(prompts, greedy)] == grouped


def test_a_pipeline_micro_batch_groups_its_own_decodes():
    """`split_meta` re-indexes the decodes of a micro-batch from 0, so it groups them again: the step's groups
    index the whole batch's decodes, not the micro-batch's."""
    from lab.parallel.pipeline import split_meta

    lens = [30] * 20 + [1000] + [25] * 20
    meta = _decode_meta(lens, True, torch.float32)
    assert [rows for rows, _ in meta.decode_groups] == [(20,), tuple(range(20)) + tuple(range(21, 41))]
    part = split_meta(meta, 15, 41)  # decodes 15-40, the long one at 5 of them
    assert part.decode_groups == (((5,), 1000), (tuple(range(5)) + tuple(range(6, 26)), 30))
    assert split_meta(meta, 0, 20).decode_groups is None  # like lengths only
