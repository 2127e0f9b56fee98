"""Unit tests of the KV block pool (`BlockManager`) and the scheduler on hand-built sequences, no model."""

import random

import pytest

from lab.engine.request import SamplingParams, Sequence, Status
from lab.engine.block_manager import BlockManager, block_hash
from lab.engine.scheduler import Scheduler

BS = 4


def seq(tokens, salt=None, max_tokens=8):
    return Sequence(list(tokens), SamplingParams(temperature=0, max_tokens=max_tokens), cache_salt=salt)


def computed(bm: BlockManager, s: Sequence, n: int | None = None) -> Sequence:
    """Pretend the model ran over the first `n` tokens of `s` (all by default) and name its full blocks."""
    bm.update(s, len(s) if n is None else n)
    bm.cache_full_blocks(s)
    return s


def admit(bm: BlockManager, s: Sequence, n: int | None = None) -> Sequence:
    """Look up the prefix cache, allocate, and compute `s` as the scheduler would."""
    blocks, hashes = bm.find_cached_prefix(s)
    assert bm.allocate(s, len(s), blocks, hashes)
    return computed(bm, s, n)


def check_consistent(bm: BlockManager, live: list[Sequence]) -> None:
    """Reference counts equal the number of live block tables holding each block; free == unreferenced."""
    holders = [0] * bm.num_blocks
    for s in live:
        assert len(set(s.block_table)) == len(s.block_table), "a block appears twice in one block table"
        for b in s.block_table:
            holders[b] += 1
    assert bm.ref_count == holders
    assert set(bm.free) == {b for b in range(bm.num_blocks) if holders[b] == 0}
    for h, b in bm.cached.items():
        assert bm.hash_of[b] == h
    assert sum(h is not None for h in bm.hash_of) == len(bm.cached)


# ---- allocation and reference counts ------------------------------------------------------------

def test_allocate_and_free_with_reference_counts():
    bm = BlockManager(8, BS)
    a = seq(range(3, 13))  # 10 tokens -> 3 blocks
    assert bm.allocate(a, len(a))
    assert len(a.block_table) == 3 and len(set(a.block_table)) == 3
    assert bm.num_free_blocks == 5 and bm.num_used_blocks == 3
    assert [bm.ref_count[b] for b in a.block_table] == [1, 1, 1]
    # growing to a length inside the last block takes nothing; crossing a boundary takes one block
    assert bm.allocate(a, 12) and len(a.block_table) == 3
    assert bm.allocate(a, 13) and len(a.block_table) == 4 and bm.num_free_blocks == 4
    check_consistent(bm, [a])
    bm.free_sequence(a)
    assert a.block_table == [] and bm.num_free_blocks == 8 and bm.ref_count == [0] * 8
    check_consistent(bm, [])


def test_shared_prefix_blocks_are_reference_counted():
    bm = BlockManager(8, BS)
    a = admit(bm, seq(range(3, 15)))  # 12 tokens, 3 full blocks, all cached
    b = seq(list(range(3, 15)) + [99])
    blocks, hashes = bm.find_cached_prefix(b)
    assert blocks == a.block_table and hashes == bm.block_hashes[a.request_id]
    assert bm.allocate(b, len(b), blocks, hashes)
    assert b.block_table[:3] == a.block_table and b.block_table[3] not in a.block_table
    assert [bm.ref_count[x] for x in a.block_table] == [2, 2, 2]
    assert bm.num_free_blocks == 8 - 4
    check_consistent(bm, [a, b])
    bm.free_sequence(a)
    assert [bm.ref_count[x] for x in b.block_table] == [1, 1, 1, 1]
    assert bm.num_free_blocks == 4  # the shared blocks are still held by b
    check_consistent(bm, [b])
    bm.free_sequence(b)
    assert bm.num_free_blocks == 8 and bm.ref_count == [0] * 8
    check_consistent(bm, [])


def test_allocate_is_all_or_nothing():
    bm = BlockManager(4, BS)
    a = seq(range(3, 11))
    assert bm.allocate(a, 8)  # 2 blocks
    before = (list(bm.ref_count), list(bm.free), dict(bm.cached), list(bm.hash_of))
    b = seq(range(20, 32))  # 12 tokens -> 3 blocks, only 2 free
    assert not bm.allocate(b, len(b))
    assert b.block_table == [] and (list(bm.ref_count), list(bm.free), dict(bm.cached), list(bm.hash_of)) == before
    # a sequence that already holds blocks and asks to grow past what is free keeps its table
    table = list(a.block_table)
    assert not bm.allocate(a, 8 + 3 * BS)
    assert a.block_table == table and (list(bm.ref_count), list(bm.free)) == before[:2]
    assert bm.allocate(a, 8 + 2 * BS) and len(a.block_table) == 4 and bm.num_free_blocks == 0
    check_consistent(bm, [a])


def test_allocate_with_cached_blocks_is_all_or_nothing():
    bm = BlockManager(4, BS)
    a = admit(bm, seq(range(3, 11)))  # 2 cached blocks
    bm.free_sequence(a)  # they are free (ref 0) but still cached
    c = seq(range(100, 104))
    assert bm.allocate(c, 4)  # an uncached free block; 1 uncached + 2 cached blocks stay free
    b = seq(list(range(3, 11)) + list(range(50, 62)))  # hits 2 blocks, needs 3 more: 5 > 3 free
    blocks, hashes = bm.find_cached_prefix(b)
    assert len(blocks) == 2
    before = (list(bm.ref_count), list(bm.free), dict(bm.cached), list(bm.hash_of))
    assert not bm.allocate(b, len(b), blocks, hashes)
    assert b.block_table == [] and b.request_id not in bm.block_hashes
    assert (list(bm.ref_count), list(bm.free), dict(bm.cached), list(bm.hash_of)) == before
    # the cached blocks are still found
    assert bm.find_cached_prefix(b)[0] == blocks
    check_consistent(bm, [c])


# ---- the chained block hash ---------------------------------------------------------------------

def test_block_hash_is_chained():
    t0, t1, other = [5, 6, 7, 8], [9, 10, 11, 12], [5, 6, 7, 9]
    h0 = block_hash(None, t0, None)
    assert h0 == block_hash(None, list(t0), None)
    assert block_hash(h0, t1, None) == block_hash(block_hash(None, t0, None), t1, None)
    assert block_hash(None, other, None) != h0
    # the same later tokens under a different earlier block name a different block
    assert block_hash(block_hash(None, other, None), t1, None) != block_hash(h0, t1, None)
    # order within a block matters
    assert block_hash(None, t0[::-1], None) != h0
    # the salt is part of the root
    assert block_hash(None, t0, "tenant-a") != h0
    assert block_hash(None, t0, "tenant-a") != block_hash(None, t0, "tenant-b")
    assert block_hash(None, t0, "tenant-a") == block_hash(None, t0, "tenant-a")


def test_block_manager_hashes_depend_on_every_earlier_block():
    bm = BlockManager(16, BS)
    tail = [40, 41, 42, 43, 44, 45, 46, 47]
    a = admit(bm, seq([3, 4, 5, 6] + tail))
    b = admit(bm, seq([3, 4, 5, 7] + tail))  # differs only in block 0
    c = admit(bm, seq([3, 4, 5, 6] + tail, salt=None))
    ha, hb, hc = (bm.block_hashes[s.request_id] for s in (a, b, c))
    assert len(ha) == len(hb) == 3
    assert all(x != y for x, y in zip(ha, hb)), "a different block 0 must change every later hash"
    assert ha == hc
    # b computed its own blocks 1 and 2 (identical tokens, different parent): no sharing with a
    assert set(a.block_table).isdisjoint(b.block_table)
    # c found a's blocks (all but the one holding its last token)
    assert c.block_table[:2] == a.block_table[:2] and c.block_table[2] != a.block_table[2]
    check_consistent(bm, [a, b, c])


# ---- cache_salt isolation -----------------------------------------------------------------------

@pytest.mark.parametrize("salts", [("x", "y"), (None, "x"), ("x", None), ("", "x")])
def test_different_salts_share_no_blocks(salts):
    bm = BlockManager(16, BS)
    prompt = list(range(3, 3 + 3 * BS + 1))
    a = admit(bm, seq(prompt, salt=salts[0]))
    b = seq(prompt, salt=salts[1])
    assert bm.find_cached_prefix(b) == ([], [])
    admit(bm, b)
    assert set(a.block_table).isdisjoint(b.block_table)
    assert set(bm.block_hashes[a.request_id]).isdisjoint(bm.block_hashes[b.request_id])
    check_consistent(bm, [a, b])


def test_same_salt_shares_blocks():
    bm = BlockManager(16, BS)
    prompt = list(range(3, 3 + 3 * BS + 1))
    a = admit(bm, seq(prompt, salt="tenant-a"))
    b = seq(prompt, salt="tenant-a")
    blocks, _ = bm.find_cached_prefix(b)
    assert blocks == a.block_table[:3]
    # after a leaves, its cached blocks still serve the same tenant and no other
    bm.free_sequence(a)
    assert bm.find_cached_prefix(seq(prompt, salt="tenant-a"))[0] == blocks
    assert bm.find_cached_prefix(seq(prompt, salt="tenant-b"))[0] == []


# ---- a hit never covers the last prompt token ---------------------------------------------------

@pytest.mark.parametrize("length, hits", [(1, 0), (BS, 0), (BS + 1, 1), (2 * BS, 1), (2 * BS + 1, 2),
                                          (3 * BS, 2), (3 * BS + 1, 3)])
def test_prefix_hit_never_covers_last_token(length, hits):
    bm = BlockManager(16, BS)
    long = list(range(3, 3 + 4 * BS))
    admit(bm, seq(long + [1]))  # all 4 blocks of `long` cached
    assert len(bm.cached) == 4
    s = seq(long[:length])
    blocks, hashes = bm.find_cached_prefix(s)
    assert len(blocks) == len(hashes) == hits
    assert len(blocks) * BS < length


def test_scheduler_recomputes_last_token_of_a_fully_cached_prompt():
    bm = BlockManager(16, BS)
    sched = Scheduler(bm, max_num_seqs=4, max_num_batched_tokens=64, enable_chunked_prefill=True)
    prompt = list(range(3, 3 + 2 * BS))  # exactly 2 full blocks
    admit(bm, seq(prompt + [7]))
    b = seq(prompt)
    sched.add(b)
    out = sched.schedule()
    assert [(s.request_id, n) for s, n in out.scheduled] == [(b.request_id, BS)]
    assert b.num_computed_tokens == BS and b.metrics.num_cached_tokens == BS
    assert sched.prefix_hit_tokens == BS and sched.prefix_query_tokens == 2 * BS


def test_no_prefix_caching_means_no_hits():
    bm = BlockManager(16, BS, enable_prefix_caching=False)
    prompt = list(range(3, 3 + 3 * BS + 1))
    a = admit(bm, seq(prompt))
    assert bm.cached == {} and bm.hash_of == [None] * 16
    assert bm.find_cached_prefix(seq(prompt)) == ([], [])
    bm.free_sequence(a)
    assert bm.num_free_blocks == 16


# ---- LRU eviction -------------------------------------------------------------------------------

def test_freed_tail_blocks_are_evicted_before_the_head():
    bm = BlockManager(4, BS)
    prompt = list(range(3, 3 + 4 * BS))
    a = admit(bm, seq(prompt))
    table = list(a.block_table)
    bm.free_sequence(a)
    probe = prompt + [1]  # would hit all 4 blocks
    assert bm.find_cached_prefix(seq(probe))[0] == table
    for k in range(1, 5):
        c = seq(range(200 + 10 * k, 200 + 10 * k + 1))
        assert bm.allocate(c, 1)
        assert c.block_table == [table[4 - k]], f"allocation {k} should reuse block {4 - k} of the freed sequence"
        assert bm.find_cached_prefix(seq(probe))[0] == table[:4 - k]


def test_uncached_blocks_are_reused_before_cached_ones():
    bm = BlockManager(6, BS)
    pa = list(range(3, 3 + 2 * BS))
    a = admit(bm, seq(pa))  # 2 blocks, both cached
    ta = list(a.block_table)
    b = seq(range(100, 100 + 2 * BS))
    assert bm.allocate(b, len(b))
    computed(bm, b, BS - 1)  # not a single full block computed: nothing of b is cached
    tb = list(b.block_table)
    bm.free_sequence(a)
    bm.free_sequence(b)  # freed after a, yet its blocks hold nothing worth keeping
    c = seq(range(300, 300 + 2 * BS))
    assert bm.allocate(c, len(c))
    assert sorted(c.block_table) == sorted(tb)
    d = seq(range(400, 400 + 2 * BS))
    assert bm.allocate(d, len(d))  # the two never-used blocks
    assert set(d.block_table).isdisjoint(ta)
    assert bm.find_cached_prefix(seq(pa + [1]))[0] == ta
    e = seq(range(500, 500 + BS))
    assert bm.allocate(e, len(e))  # only now is a cached block evicted: a's tail
    assert e.block_table == [ta[1]]
    assert bm.find_cached_prefix(seq(pa + [1]))[0] == ta[:1]


def test_least_recently_freed_sequence_is_evicted_first():
    bm = BlockManager(4, BS)
    pa, pb = list(range(3, 3 + 2 * BS)), list(range(100, 100 + 2 * BS))
    a, b = admit(bm, seq(pa)), admit(bm, seq(pb))
    ta, tb = list(a.block_table), list(b.block_table)
    bm.free_sequence(a)
    bm.free_sequence(b)
    c = seq(range(300, 300 + 2 * BS))
    assert bm.allocate(c, len(c))
    assert sorted(c.block_table) == sorted(ta)
    assert bm.find_cached_prefix(seq(pa + [1]))[0] == []
    assert bm.find_cached_prefix(seq(pb + [1]))[0] == tb


def test_a_hit_on_a_free_block_refreshes_it():
    """A free cached block taken by a hit leaves the free queue; freed again, it is most recent."""
    bm = BlockManager(4, BS)
    pa, pb = list(range(3, 3 + 2 * BS)), list(range(100, 100 + 2 * BS))
    a, b = admit(bm, seq(pa)), admit(bm, seq(pb))
    ta, tb = list(a.block_table), list(b.block_table)
    bm.free_sequence(a)
    bm.free_sequence(b)
    a2 = admit(bm, seq(pa + [1]))  # hits a's 2 blocks, takes one more (b's tail)
    assert a2.block_table[:2] == ta
    bm.free_sequence(a2)
    c = seq(range(300, 300 + 2 * BS))
    assert bm.allocate(c, len(c))  # b's blocks (its tail, now uncached, and its head), not a's
    assert sorted(c.block_table) == sorted(tb)
    assert bm.find_cached_prefix(seq(pa + [1]))[0] == ta


def test_eviction_removes_the_hash():
    bm = BlockManager(2, BS)
    pa = list(range(3, 3 + 2 * BS))
    a = admit(bm, seq(pa))
    hashes = list(bm.block_hashes[a.request_id])
    table = list(a.block_table)
    bm.free_sequence(a)
    assert all(h in bm.cached for h in hashes)
    c = seq(range(300, 300 + 2 * BS))
    assert bm.allocate(c, len(c))
    assert sorted(c.block_table) == sorted(table)
    assert not any(h in bm.cached for h in hashes)
    assert bm.hash_of == [None, None]
    assert bm.find_cached_prefix(seq(pa + [1])) == ([], [])
    # c computes its blocks: they get c's hashes, and a's prompt still misses
    computed(bm, c)
    assert len(bm.cached) == 2 and not any(h in bm.cached for h in hashes)
    assert bm.find_cached_prefix(seq(pa + [1])) == ([], [])
    check_consistent(bm, [c])


def test_reset_prefix_cache_forgets_only_unreferenced_blocks():
    bm = BlockManager(8, BS)
    pa, pb = list(range(3, 3 + 2 * BS)), list(range(100, 100 + 2 * BS))
    a, b = admit(bm, seq(pa)), admit(bm, seq(pb))
    bm.free_sequence(a)  # a's blocks are free but cached; b still runs
    assert len(bm.find_cached_prefix(seq(pa + [1]))[0]) == 2
    bm.reset_prefix_cache()
    assert bm.find_cached_prefix(seq(pa + [1])) == ([], [])
    assert bm.find_cached_prefix(seq(pb + [1]))[0] == b.block_table
    assert bm.num_free_blocks == 6
    check_consistent(bm, [b])
    bm.free_sequence(b)
    bm.reset_prefix_cache()
    assert bm.cached == {} and bm.hash_of == [None] * 8 and bm.num_free_blocks == 8


# ---- the scheduler over the pool ----------------------------------------------------------------

def test_preemption_frees_the_most_recent_and_requeues_it_first():
    bm = BlockManager(4, BS)
    sched = Scheduler(bm, max_num_seqs=4, max_num_batched_tokens=64, enable_chunked_prefill=True)
    a, b = seq(range(3, 3 + 2 * BS), max_tokens=8), seq(range(100, 100 + 2 * BS), max_tokens=8)
    sched.add(a)
    sched.add(b)
    out = sched.schedule()
    assert [s for s, _ in out.scheduled] == [a, b] and bm.num_free_blocks == 0
    for s, n in out.scheduled:
        bm.update(s, s.num_computed_tokens + n)
        s.token_ids.append(7)  # the sampled token: each now needs a third block
    out = sched.schedule()
    assert out.preempted == [b]
    assert [(s, n) for s, n in out.scheduled] == [(a, 1)]
    assert b.status == Status.WAITING and b.num_computed_tokens == 0 and b.block_table == []
    assert list(sched.waiting) == [b] and sched.running == [a] and b.metrics.num_preemptions == 1
    check_consistent(bm, [a])


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("caching", [True, False])
def test_scheduler_simulation_keeps_the_pool_consistent(seed, caching):
    """Drive the scheduler with fake model steps; the pool stays consistent and ends empty."""
    rng = random.Random(seed)
    num_blocks = rng.randint(4, 12)
    bm = BlockManager(num_blocks, BS, enable_prefix_caching=caching)
    sched = Scheduler(bm, max_num_seqs=rng.randint(1, 5), max_num_batched_tokens=rng.randint(1, 24),
                      enable_chunked_prefill=True)
    shared = [rng.randrange(3, 500) for _ in range(3 * BS)]
    seqs = []
    for _ in range(rng.randint(2, 10)):
        max_tokens = rng.randint(1, 10)
        n = rng.randint(1, num_blocks * BS - max_tokens)
        prompt = (shared + [rng.randrange(3, 500) for _ in range(n)])[:n] if rng.random() < 0.5 else \
            [rng.randrange(3, 500) for _ in range(n)]
        seqs.append(seq(prompt, salt=rng.choice([None, "s"]), max_tokens=max_tokens))
    pending = list(seqs)
    for step in range(2000):
        if pending and rng.random() < 0.5:
            sched.add(pending.pop(0))
        if not pending and not sched.has_unfinished():
            break
        out = sched.schedule()
        for s, n in out.scheduled:
            assert 0 < n <= s.num_wanted_tokens
            assert len(s.block_table) * BS >= s.num_computed_tokens + n
            bm.update(s, s.num_computed_tokens + n)
            bm.cache_full_blocks(s)
            if s.num_computed_tokens == len(s):
                s.token_ids.append(rng.randrange(3, 500))
                if s.num_output_tokens >= s.params.max_tokens:
                    sched.finish(s, "length")
        assert out.num_tokens <= sched.max_num_batched_tokens
        assert len(sched.running) <= sched.max_num_seqs
        check_consistent(bm, sched.running)
        assert all(s.block_table == [] for s in sched.waiting)
    else:
        pytest.fail("the simulation did not finish in 2000 steps")
    assert all(s.status == Status.FINISHED and s.num_output_tokens == s.params.max_tokens for s in seqs)
    assert bm.num_free_blocks == num_blocks and bm.ref_count == [0] * num_blocks
