"""This machine's collectives, measured: a ping-pong and an all-reduce over a sweep of message sizes between
processes of one torch.distributed group (gloo on a CPU, NCCL on CUDA), and the alpha-beta fit of each
(`lab.parallel.comm_model`).

Every rank runs one intra-op thread, as a tensor-parallel rank of the engine does on a CPU. Each size is timed
`repeats` times after a warm-up, ranks aligned by a barrier before each call; rank 0's times are reported (its
ping-pong time is a round trip, halved), as median, mean, min and max; "all-reduce between matmuls" runs a small
matmul on every rank before each call and no barrier, as the collectives inside a step meet: on a shared CPU the mean can be several
times the median (a few calls wait for a process to be scheduled), and a step that makes dozens of collectives
pays the mean. The group is started with `torch.multiprocessing` (spawn) on a file
rendezvous in a temporary directory, with a timeout, so a stuck collective fails instead of hanging.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import pandas as pd
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from lab.parallel.comm_model import fit_alpha_beta

DEFAULT_SIZES = tuple(4 ** k for k in range(1, 13))  # 4 B .. 16 MiB
TIMEOUT = timedelta(seconds=60)


def _time(fn, repeats: int) -> list[float]:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        dist.barrier()
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def _time_between(fn, repeats: int, compute) -> list[float]:
    """`fn`'s times when each call follows `compute()` on every rank and no barrier aligns the ranks: what a
    collective costs inside a step, where the ranks arrive when their own work and the OS scheduler let them."""
    fn()
    times = []
    for _ in range(repeats):
        compute()
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def _worker(rank: int, world: int, rendezvous: str, sizes: list[int], repeats: int, out: str, device: str) -> None:
    torch.set_num_threads(1)
    backend = "nccl" if device == "cuda" else "gloo"
    if device == "cuda":
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, init_method=f"file://{rendezvous}", rank=rank, world_size=world,
                            timeout=TIMEOUT)
    try:
        rows = []
        for n in sizes:
            buf = torch.zeros(max(n // 4, 1), dtype=torch.float32, device=device)

            def ping_pong():
                if rank == 0:
                    dist.send(buf, 1)
                    dist.recv(buf, 1)
                elif rank == 1:
                    dist.recv(buf, 0)
                    dist.send(buf, 0)
                if device == "cuda":
                    torch.cuda.synchronize()

            def all_reduce():
                dist.all_reduce(buf)
                if device == "cuda":
                    torch.cuda.synchronize()

            x, w = torch.randn(8, 576, device=device), torch.randn(576, 1536, device=device)  # ~0.1 ms on a CPU core
            for op, times in (("ping-pong", [t / 2 for t in _time(ping_pong, repeats)]),
                              ("all-reduce", _time(all_reduce, repeats)),
                              ("all-reduce between matmuls", _time_between(all_reduce, repeats, lambda: x @ w))):
                rows.append({"op": op, "bytes": buf.numel() * 4, "median_s": statistics.median(times),
                             "mean_s": statistics.fmean(times), "min_s": min(times), "max_s": max(times)})
        if rank == 0:
            Path(out).write_text(json.dumps(rows))
    finally:
        dist.destroy_process_group()


def measure(world: int = 2, sizes=DEFAULT_SIZES, repeats: int = 20, device: str = "cpu") -> pd.DataFrame:
    """Time a ping-pong (ranks 0 and 1) and an all-reduce of each size across `world` processes; one row per
    (op, bytes) with the median, min and max seconds of `repeats` calls."""
    if world < 2:
        raise ValueError(f"measuring collectives needs at least 2 processes, got world={world}")
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "times.json")
        mp.start_processes(_worker, args=(world, os.path.join(tmp, "rendezvous"), list(sizes), repeats, out, device),
                           nprocs=world, join=True, start_method="spawn")
        return pd.DataFrame(json.loads(Path(out).read_text()))


def fit(df: pd.DataFrame, world: int) -> pd.DataFrame:
    """Alpha (s) and bus bandwidth (bytes/s) of each op, fitted to the median and to the mean times (an
    all-reduce's traffic factor 2(p - 1)/p, a send's 1). The mean is what a step of many collectives pays: on a
    busy 2-core machine a few calls wait milliseconds for a process to be scheduled, which the median hides."""
    rows = []
    for op, g in df.groupby("op"):
        factor = 2 * (world - 1) / world if op.startswith("all-reduce") else 1.0
        for stat in ("median", "mean"):
            alpha, bandwidth = fit_alpha_beta(g["bytes"], g[f"{stat}_s"], factor)
            rows.append({"op": op, "statistic": stat, "alpha_us": 1e6 * alpha, "bandwidth_GBps": bandwidth / 1e9,
                         "smallest_message_us": 1e6 * g.sort_values("bytes")[f"{stat}_s"].iloc[0]})
    return pd.DataFrame(rows)
