"""Seed 002's claims on the lab's own engine and server (notebook 09): its int8 allocation and its readiness.

`engine_int8`: the article's INT8 saving (§5.2 "30%", §6.2 "about 50%") is counted by `lab.memory` for model
shapes; here the engine's own allocation checks that account on the real model: SmolLM2 loaded in bfloat16 and
with its decoder linears RTN-int8 (per output channel) packed for the CPU kernel (`lab.quant.packed`), the bytes
of every tensor the model holds, beside `lab.memory.weight_bytes` for the same shape and formats.

`probe_timeline`: readiness against liveness, as a Kubernetes probe sees it. A pod gets traffic once its readiness probe passes. `lab serve --warmup` answers `/health` (liveness) as soon as it
listens and `/ready` only after one warm-up request (`lab.serve.async_engine`). `probe_timeline` starts a fresh
`lab serve` process and polls both routes from the moment it is spawned, then sends the first request when a probe
would first route traffic: on `/health` for a server without warm-up (a probe pointed at the liveness route), on
`/ready` for one with it. What it returns, in seconds from the spawn: when the server answered `/health`, when it
answered `/ready`, and the first and second requests' latency (one generated token, so about their TTFT plus
HTTP). A probe on `/ready` routes later; the question is whether the first user's first token comes earlier.
`lab serve` has no device option (it loads on CUDA when it sees one), so `device_env` puts it on the run's device
through `CUDA_VISIBLE_DEVICES`.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import httpx
import pandas as pd

from lab import memory as mem

POLL_S = 0.01  # probe period: far finer than Kubernetes' (periodSeconds >= 1) to time the transitions


def _client() -> httpx.Client:
    """One client for a timeline's polls and requests. `httpx.get` builds a client, and with it a TLS context, on
    every call: about 30 ms of CPU, which at a 10 ms poll period kept one of two cores busy while the server it
    timed was starting, and which `_request_s` counted in each request's latency. Keep-alive is off: each poll and
    request opens its own connection, as a kubelet probe and a new user's request do."""
    return httpx.Client(limits=httpx.Limits(max_keepalive_connections=0))


def _first_200(client: httpx.Client, url: str, proc: subprocess.Popen, timeout: float, t0: float) -> float:
    """Seconds from `t0` until `url` first answers 200 (the process must stay alive)."""
    end = time.monotonic() + timeout
    while True:
        try:
            if client.get(url, timeout=1).status_code == 200:
                return time.perf_counter() - t0
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() > end:
            raise RuntimeError(f"{url} never answered 200 (process exit code {proc.poll()}): "
                               f"{proc.stdout.read().decode()[-2000:] if proc.poll() is not None else 'timed out'}")
        time.sleep(POLL_S)


def _request_s(client: httpx.Client, url: str, model: str, prompt_tokens: int, offset: int) -> float:
    body = {"model": model, "prompt": list(range(offset, offset + prompt_tokens)), "max_tokens": 1, "temperature": 0,
            "ignore_eos": True}
    t = time.perf_counter()
    r = client.post(url + "/v1/completions", json=body, timeout=120)
    r.raise_for_status()
    return time.perf_counter() - t


def device_env(device: str) -> dict[str, str]:
    """This process's environment with only `device` visible to CUDA ("cpu": none; "cuda:N": the N-th of those
    visible here; "cuda": unchanged), for a child that puts its model on CUDA whenever it sees one."""
    env = os.environ.copy()
    if device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
    elif device.startswith("cuda:"):
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        index = int(device.removeprefix("cuda:"))
        env["CUDA_VISIBLE_DEVICES"] = visible.split(",")[index] if visible else str(index)
    return env


def probe_timeline(model: str, dtype: str, prompt_tokens: int, warmup: bool, device: str = "cpu",
                   timeout: float = 180) -> dict:
    """One fresh `lab serve` process on `device` (see the module docstring); the first request goes out when the
    route a probe would use answers 200: `/ready` with `warmup`, `/health` without."""
    from lab.serve.server import free_port

    port = free_port()
    cmd = [sys.executable, "-m", "lab.cli", "serve", "--model", model, "--port", str(port), "--dtype", dtype,
           "--max-model-len", str(prompt_tokens + 32), "--max-num-seqs", "2"] + (["--warmup"] if warmup else [])
    client = _client()  # before the spawn: building it is not the server's time
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=device_env(device))
    try:
        url = f"http://127.0.0.1:{port}"
        live = _first_200(client, url + "/health", proc, timeout, t0)
        ready = _first_200(client, url + "/ready", proc, timeout, t0)
        routed = ready if warmup else live
        first = _request_s(client, url, model, prompt_tokens, 1000)
        second = _request_s(client, url, model, prompt_tokens, 5000)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        client.close()
    return {"probe": "/ready, warm-up request" if warmup else "/health, no warm-up", "live_s": live, "ready_s": ready,
            "routed_s": routed, "first_request_s": first, "first_token_at_s": routed + first, "second_request_s": second}


def probe_table(model: str, dtype: str, prompt_tokens: int, repeats: int, device: str = "cpu") -> pd.DataFrame:
    """`probe_timeline` on `device` with and without warm-up, `repeats` fresh processes each, alternating."""
    return pd.DataFrame([{**probe_timeline(model, dtype, prompt_tokens, warmup, device), "repeat": r}
                         for r in range(repeats) for warmup in (False, True)])


def held_bytes(model) -> int:
    """Bytes of every distinct tensor in the model's state (parameters and persistent buffers: packed codes,
    scales); a tied embedding and LM head count once."""
    seen, total = set(), 0
    for t in model.state_dict().values():
        key = t.untyped_storage().data_ptr()
        if key not in seen:
            seen.add(key)
            total += t.untyped_storage().nbytes()
    return total


def engine_int8(model_name: str) -> pd.DataFrame:
    """The model's weight bytes as the engine holds them in bf16 and in int8 (decoder linears per channel,
    embedding and a tied head left in bf16; and with the head packed in int8 too), beside lab.memory's count."""
    from lab.models import load_model
    from lab.quant.packed import rtn_packed
    from lab.quant.rtn import QuantSpec

    bf16, _ = load_model(model_name, dtype="bfloat16", device="cpu")  # a byte count: the packed kernel is the CPU's
    spec = QuantSpec(bits=8, group_size=None)
    shape = mem.ModelShape.load(model_name)
    builds = (("bf16", bf16, mem.weight_bytes(shape, "bf16")["total"]),
              ("int8 linears, bf16 embedding", rtn_packed(bf16, spec, head=False),
               mem.weight_bytes(shape, "int8", embedding="bf16", lm_head="bf16")["total"]),
              ("int8 linears and LM head", rtn_packed(bf16, spec, head=True),
               mem.weight_bytes(shape, "int8", embedding="bf16", lm_head="int8")["total"]))
    held = [(name, held_bytes(m), counted) for name, m, counted in builds]
    base = held[0][1]
    return pd.DataFrame([{"build": name, "engine MB": b / 1e6, "lab.memory MB": counted / 1e6,
                          "engine / lab.memory": b / counted, "engine saving vs bf16": 1 - b / base}
                         for name, b, counted in held])
