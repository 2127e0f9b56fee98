"""Measured on this machine: loading a window's KV from each storage tier against recomputing it on the engine.

Recompute: the engine holds a sequence of M + W tokens; its `num_computed_tokens` goes back to M and the model
runner executes the W tokens as one chunk over the cached M-token prefix (what the replay controller makes the
scheduler do). Load: the window's KV bytes read from a tier into a buffer:

- `host memory`: a copy out of a pool larger than the last-level cache, after streaming another buffer through
  the caches (so the window is not already cached);
- `disk file`: a read of a file whose pages were dropped from the page cache first (posix_fadvise DONTNEED
  after fsync), i.e. from the device;
- on a GPU also `device memory`, `pinned host -> device` and `pageable host -> device`.

HCache's restore (`lab.replay.hidden`): the K/V projections of the window from the layer inputs the engine kept.

Times are medians of repeats. The crossover bandwidth measured is kv_bytes / t_recompute: a tier slower than
it loses to recomputing.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass

import torch

from lab.engine import LLM, SamplingParams
from lab.machine.timing import median_seconds


@dataclass(frozen=True)
class Timing:
    what: str
    bytes: int
    seconds: float

    @property
    def bandwidth(self) -> float:
        return self.bytes / self.seconds


def host_memory_load(nbytes: int, repeats: int = 5, pool_bytes: int = 256 * 1024**2) -> Timing:
    pool = torch.empty(max(pool_bytes, 4 * nbytes), dtype=torch.uint8)
    pool.fill_(1)
    flush = torch.empty(pool_bytes, dtype=torch.uint8)
    dst = torch.empty(nbytes, dtype=torch.uint8)
    offset = (pool.numel() - nbytes) // 2
    src = pool[offset:offset + nbytes]
    return Timing("host memory", nbytes, median_seconds(lambda: dst.copy_(src), repeats, lambda: flush.fill_(0)))


def disk_load(nbytes: int, repeats: int = 5, directory: str | None = None) -> Timing:
    """Read `nbytes` from a file whose cached pages are dropped before each read."""
    buf = bytearray(nbytes)
    with tempfile.NamedTemporaryFile(dir=directory) as f:
        f.write(b"\1" * nbytes)
        f.flush()
        os.fsync(f.fileno())
        fd = f.fileno()

        def drop():
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)

        def read():
            os.preadv(fd, [buf], 0)

        return Timing("disk file", nbytes, median_seconds(read, repeats, drop))


def gpu_loads(nbytes: int, repeats: int = 5, flush_bytes: int = 512 * 1024**2,
              device: torch.device | str = "cuda") -> list[Timing]:
    """Device memory and the two host-to-device paths, on CUDA `device`. Before each timed copy a `flush_bytes`
    device buffer is written (untimed), several times an H100/H200's 50-60 MB L2: a window of a few MB copied
    again and again would otherwise be read from L2, and "device memory" would be L2's bandwidth, not HBM's."""
    if not torch.cuda.is_available():
        return []
    flush = torch.empty(flush_bytes, dtype=torch.uint8, device=device)
    dev_src = torch.empty(max(nbytes, 1), dtype=torch.uint8, device=device)
    dev_dst = torch.empty_like(dev_src)
    out = []
    for what, src in (("device memory", dev_src), ("pinned host -> device", torch.empty(nbytes, dtype=torch.uint8).pin_memory()),
                      ("pageable host -> device", torch.empty(nbytes, dtype=torch.uint8))):
        out.append(Timing(what, nbytes, median_seconds(lambda src=src: dev_dst.copy_(src, non_blocking=True), repeats,
                                                       lambda: flush.fill_(0))))
    return out


def tier_loads(nbytes: int, repeats: int = 5, device: torch.device | str = "cpu") -> list[Timing]:
    """Every tier this machine has, for one window's KV bytes; the GPU tiers on `device` where it is a CUDA
    device (the one the study's model runs on), else on the default CUDA device."""
    gpu = device if torch.device(device).type == "cuda" else "cuda"
    return [host_memory_load(nbytes, repeats), disk_load(nbytes, repeats), *gpu_loads(nbytes, repeats, device=gpu)]


class RecomputeBench:
    """An engine holding one long sequence, to time recomputing W tokens after an M-token prefix."""

    def __init__(self, llm: LLM, token_ids: list[int]):
        self.llm, self.num_tokens = llm, len(token_ids)
        self.request_id = llm.add_request(token_ids, SamplingParams(max_tokens=2, temperature=0, ignore_eos=True))
        while self._view().num_computed_tokens < len(token_ids):  # the prefill (chunked by the engine's budget)
            llm.step()

    def _view(self):
        return next(s for s in self.llm.view().requests if s.request_id == self.request_id)

    @property
    def block_table(self) -> tuple[int, ...]:
        """The held sequence's blocks in the engine's pool."""
        return self._view().block_table

    def seconds(self, prefix: int, window: int, repeats: int = 3) -> float:
        """Median time of the model runner's forward over tokens prefix .. prefix + window - 1."""
        if prefix + window > self.num_tokens:
            raise ValueError(f"prefix {prefix} + window {window} exceeds the {self.num_tokens} tokens held")
        return median_seconds(lambda: self.llm.recompute(self.request_id, prefix, window), repeats)

    def hidden_restore_seconds(self, window: int, repeats: int = 3) -> float:
        """HCache: median time to zero and rebuild the K/V of the sequence's last `window` positions from the
        layer inputs the engine kept (needs an engine made with ReplayConfig(source="hidden")). Independent
        of the prefix: only the K/V projections run."""
        replay, end = self.llm.extensions["replay"], self.num_tokens
        return median_seconds(lambda: replay.restore(self.request_id, end - window, end), repeats)

    def kv_bytes(self, window: int) -> int:
        """Bytes of the window's KV in the engine's pool (all layers, K and V)."""
        return int(self.llm.kv_bytes_per_token * window)
