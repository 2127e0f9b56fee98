"""**The KV block pool** (`BlockManager`): allocation, reference counts and prefix caching.
PagedAttention (Kwon et al., "Efficient Memory Management for LLM Serving with PagedAttention", SOSP
2023) stores each sequence's KV in fixed-size blocks reached through a block table, so memory is
allocated as a sequence grows and waste is at most one partly filled block per sequence.

Prefix caching (vLLM's automatic prefix caching; SGLang's RadixAttention is the tree-shaped
relative): a *full* block is named by a chained hash, h_i = sha256(h_{i-1} || tokens of block i),
with the request's `cache_salt` mixed into h_0 so two tenants never share a block. A new request
whose leading blocks' hashes are known reuses those blocks (reference count + 1) instead of
computing them. A block whose count drops to zero keeps its hash and stays reusable until it is
needed for something else; the free queue is LRU, and a finished sequence returns its blocks tail
first so the tail (the part least likely to be shared) is evicted first. A hit never covers the
last prompt token: that token must run through the model to produce the first output's logits.

Sliding windows (`sliding_window`, set when every layer of the model has one: Mistral). The query at position p
sees keys p - W + 1 .. p only, so once a sequence has computed p tokens the blocks wholly before position
p - W + 1 are read by no later query: `free_outside_window` returns them to the pool and leaves NULL_BLOCK in
their place in the block table (positions keep their block index; attention never reads them). A freed block
keeps its hash and content until the pool hands it out again, like any freed block, so it may still serve as a
prefix hit. A hit for a window model needs only the blocks the next query can see: the last ceil((W - 1) / bs)
before the hit's end, all present; the blocks before them are neither looked for nor taken from the pool (NULL),
and a block missing there does not cut the hit short (vLLM v1's sliding-window manager reasons the same way, from
the right). When only some layers have windows (Gemma's local and global layers share this one pool), a block is
needed as long as a global layer reads it, so nothing is freed: `sliding_window` stays None.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict

from .request import Sequence

NULL_BLOCK = -1  # a block-table entry whose block was freed outside the sliding window, or never needed by a hit


def block_hash(parent: bytes | None, tokens: list[int], salt: str | None) -> bytes:
    h = hashlib.sha256(parent if parent is not None else (salt or "").encode() + b"\x00root")
    h.update(array("q", tokens).tobytes())
    return h.digest()


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True,
                 sliding_window: int | None = None):
        """`sliding_window`: the window of every layer (the widest, if they differ), for freeing blocks outside
        it; None when any layer attends globally."""
        self.num_blocks, self.block_size = num_blocks, block_size
        self.sliding_window = sliding_window
        self.enable_prefix_caching = enable_prefix_caching
        self.ref_count = [0] * num_blocks
        self.hash_of: list[bytes | None] = [None] * num_blocks
        self.cached: dict[bytes, int] = {}  # hash -> block id holding those tokens' KV
        self.free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))  # LRU order
        self.block_hashes: dict[int, list[bytes]] = {}  # request id -> hashes of its full computed blocks

    @property
    def num_free_blocks(self) -> int:
        return len(self.free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self.free)

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def find_cached_prefix(self, seq: Sequence) -> tuple[list[int], list[bytes]]:
        """Blocks (and their hashes) that already hold this sequence's leading full blocks; with a sliding window,
        NULL_BLOCK for the leading ones no query after the hit reads (`window_hit`)."""
        if not self.enable_prefix_caching:
            return [], []
        blocks, hashes, parent = [], [], None
        bs = self.block_size
        for i in range((len(seq) - 1) // bs):  # never the block holding the last token
            parent = block_hash(parent, seq.token_ids[i * bs:(i + 1) * bs], seq.cache_salt)
            block = self.cached.get(parent)
            if block is None and self.sliding_window is None:
                break
            blocks.append(block)
            hashes.append(parent)
        if self.sliding_window is not None:
            return self.window_hit(blocks, hashes)
        return blocks, hashes

    def window_hit(self, blocks: list[int | None], hashes: list[bytes]) -> tuple[list[int], list[bytes]]:
        """The longest hit of N blocks whose last min(N, ceil((W - 1) / bs)) blocks are all cached (None: not
        cached): the next query, at position N * bs, sees keys from N * bs - W + 1 on, in those blocks only."""
        need = -(-(self.sliding_window - 1) // self.block_size)
        best, run = 0, 0
        for i, block in enumerate(blocks):
            run = run + 1 if block is not None else 0
            if run >= min(need, i + 1):
                best = i + 1
        kept = min(need, best)
        return [NULL_BLOCK] * (best - kept) + blocks[best - kept:best], hashes[:best]

    def allocate(self, seq: Sequence, num_tokens: int, cached_blocks: list[int] = (),
                 cached_hashes: list[bytes] = ()) -> bool:
        """Grow `seq`'s block table to hold `num_tokens`, reusing `cached_blocks` first.

        All or nothing: returns False, changing nothing, when the free pool is too small.
        """
        need = self.blocks_for(num_tokens) - len(seq.block_table) - len(cached_blocks)
        taken_from_free = sum(1 for b in cached_blocks if b != NULL_BLOCK and self.ref_count[b] == 0)
        if max(need, 0) + taken_from_free > len(self.free):
            return False
        for b in cached_blocks:
            if b == NULL_BLOCK:
                continue
            if self.ref_count[b] == 0:
                del self.free[b]
            self.ref_count[b] += 1
        seq.block_table.extend(cached_blocks)
        self.block_hashes.setdefault(seq.request_id, []).extend(cached_hashes)
        for _ in range(need):
            seq.block_table.append(self._take_free_block())
        return True

    def _take_free_block(self) -> int:
        block, _ = self.free.popitem(last=False)  # least recently freed
        if (h := self.hash_of[block]) is not None:  # evict its cached content
            del self.cached[h]
            self.hash_of[block] = None
        self.ref_count[block] = 1
        return block

    def update(self, seq: Sequence, num_computed_tokens: int) -> None:
        """The one place a sequence's progress changes (`Sequence.num_computed_tokens`): its first
        `num_computed_tokens` positions hold valid KV in its blocks. Up: a forward wrote them, or a prefix hit found
        them; down: their KV is dropped (drafts verification rejected, a replay window, a preemption, a step that
        failed), and their slots are rewritten when they are computed again. Checked against the tokens the
        sequence holds and the slots its block table has, so a wrong report fails here, by name, and not later as
        attention over slots nobody wrote."""
        limit = min(len(seq) + len(seq.draft_token_ids), len(seq.block_table) * self.block_size)
        if not 0 <= num_computed_tokens <= limit:
            raise RuntimeError(f"request {seq.request_id}: {num_computed_tokens} computed tokens is outside 0 .. "
                               f"{limit} (it holds {len(seq)} tokens and {len(seq.draft_token_ids)} drafts in "
                               f"{len(seq.block_table)} blocks of {self.block_size})")
        seq._num_computed_tokens = num_computed_tokens

    def cache_full_blocks(self, seq: Sequence) -> None:
        """Name every block that became full and computed, so later requests can reuse it. A block is named by
        the tokens the sequence holds: call this after the step's tokens are appended (a speculative round's
        accepted drafts are computed before they are appended), and a sequence that stops inside its accepted
        drafts holds fewer tokens than it computed."""
        if not self.enable_prefix_caching:
            return
        hashes = self.block_hashes.setdefault(seq.request_id, [])
        bs = self.block_size
        for i in range(len(hashes), min(seq.num_computed_tokens, len(seq)) // bs):
            h = block_hash(hashes[-1] if hashes else None, seq.token_ids[i * bs:(i + 1) * bs], seq.cache_salt)
            hashes.append(h)
            block = seq.block_table[i]
            if block != NULL_BLOCK and h not in self.cached and self.hash_of[block] is None:
                self.cached[h] = block
                self.hash_of[block] = h

    def free_sequence(self, seq: Sequence) -> None:
        for block in reversed(seq.block_table):
            self._release(block)
        seq.block_table = []
        self.block_hashes.pop(seq.request_id, None)

    def free_outside_window(self, seq: Sequence) -> int:
        """Return the blocks of `seq` wholly before the window of its next query (position num_computed_tokens)
        to the pool, NULL_BLOCK in their place; how many. Nothing without a window for every layer."""
        if self.sliding_window is None:
            return 0
        table = seq.block_table
        end = min(max(0, seq.num_computed_tokens - self.sliding_window + 1) // self.block_size, len(table))
        start = end
        while start > 0 and table[start - 1] != NULL_BLOCK:  # the freed ones are a prefix of the table
            start -= 1
        # Oldest positions first, so they are evicted first: a later hit reads only the blocks near its end.
        for i in range(start, end):
            self._release(table[i])
            table[i] = NULL_BLOCK
        return end - start

    def _release(self, block: int) -> None:
        if block == NULL_BLOCK:
            return
        self.ref_count[block] -= 1
        if self.ref_count[block] == 0:
            self.free[block] = None
            if self.hash_of[block] is None:  # nothing worth keeping: reuse it first
                self.free.move_to_end(block, last=False)

    def reset_prefix_cache(self) -> None:
        """Forget every cached block that no running sequence holds (e.g. between benchmark runs)."""
        for h, block in list(self.cached.items()):
            if self.ref_count[block] == 0:
                del self.cached[h]
                self.hash_of[block] = None
