"""`python -m lab.bench.lowbit`: packed low-bit linears (`lab.quant.packed`) against float32 and bfloat16.

Two measurements on SmolLM2-135M's shapes, every competitor timed in the same loop, one call of each
per round (interleaved, so a burst of other work on the machine hits all of them alike), median over
rounds, ratios to float32:

- `linear_table`: one linear at M = 1 (a decode step) and M = 32 (a batched step or a prefill chunk)
  for the LM head, the fused qkv, o_proj, the fused gate/up and down_proj. float32 stores weights as
  the model does (transposed, see `LlamaModel.store_weights_transposed`; the LM head keeps the
  embedding's layout); bfloat16 gets bf16 inputs; packed linears get float32 inputs, as in the model,
  so their bf16 conversions are timed too. int4 and grouped int8 at group 64, int8 per channel.
- `decode_step`: the whole model's forward of one token on a KV cache of `context` tokens plus the
  LM head, at batch 1 (`lab.models.reference.ContiguousKVCache`, restored before each step so every
  step sees the same context), for float32, bfloat16 and packed models (RTN codes: the kernels' speed
  does not depend on how the codes were found), with the LM head float32 (as the lab's checkpoints
  leave it) or packed too.

On a 2-core machine shared with other work two OpenMP threads stall behind it (steps of ~8-12 ms
appear); `threads=1` gives stable numbers there, the default keeps torch's setting. The load average
is recorded with the results: timings taken beside other work mean little.
"""

from __future__ import annotations

import copy
import os
import statistics
import time

import torch
from torch import nn

from lab.quant.packed import pack_linear, rtn_packed
from lab.quant.rtn import QuantSpec, quantize

COMPETITORS = ("float32", "bfloat16", "int4", "int8", "int8_grouped")
SPECS = {"int4": QuantSpec(4, 64), "int8": QuantSpec(8, None, symmetric=True), "int8_grouped": QuantSpec(8, 64)}


def interleaved_medians(fns: dict, rounds: int, warmup: int = 2) -> dict[str, float]:
    """Median seconds of each callable over `rounds` rounds, each round calling every one once in turn."""
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {k: statistics.median(v) for k, v in times.items()}


def model_shapes(model: str = "smollm2-135m") -> dict[str, tuple[int, int]]:
    """(out, in) of each distinct linear of the preset's model, the LM head first."""
    from lab.models import preset_config

    c = preset_config(model)
    q, kv = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
    return {"lm_head": (c.vocab_size, c.hidden_size), "qkv_proj": (q + 2 * kv, c.hidden_size),
            "o_proj": (c.hidden_size, q), "gate_up_proj": (2 * c.intermediate_size, c.hidden_size),
            "down_proj": (c.hidden_size, c.intermediate_size)}


def _linears(out_f: int, in_f: int, transposed: bool, seed: int = 0) -> dict[str, nn.Module]:
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(out_f, in_f, generator=g) * 0.02
    f32 = nn.Linear(in_f, out_f, bias=False)
    f32.weight = nn.Parameter(w.t().contiguous().t() if transposed else w, requires_grad=False)
    bf16 = nn.Linear(in_f, out_f, bias=False).to(torch.bfloat16)
    bf16.weight = nn.Parameter(w.to(torch.bfloat16), requires_grad=False)
    mods: dict[str, nn.Module] = {"float32": f32, "bfloat16": bf16}
    for name, spec in SPECS.items():
        q, s, z = quantize(w, spec)
        mods[name] = pack_linear(q, s, z, spec.group_index(in_f), spec.bits)
    return mods


@torch.inference_mode()
def linear_table(ms=(1, 32), rounds: int = 31, model: str = "smollm2-135m") -> list[dict]:
    """One row per (linear, M): milliseconds of each competitor and float32's time over each."""
    rows = []
    for name, (out_f, in_f) in model_shapes(model).items():
        mods = _linears(out_f, in_f, transposed=name != "lm_head")
        for m in ms:
            x = torch.randn(m, in_f)
            xb = x.to(torch.bfloat16)
            fns = {k: (lambda mod=mod, inp=(xb if k == "bfloat16" else x): mod(inp)) for k, mod in mods.items()}
            # the LM head is ~100x the others: fewer rounds keep the run short, the median still holds
            t = interleaved_medians(fns, max(5, rounds // 4) if name == "lm_head" else rounds)
            row = {"linear": name, "out": out_f, "in": in_f, "M": m}
            row.update({f"{k}_ms": t[k] * 1e3 for k in COMPETITORS})
            row.update({f"speedup_{k}": t["float32"] / t[k] for k in COMPETITORS if k != "float32"})
            rows.append(row)
    return rows


@torch.inference_mode()
def decode_step(model: str = "smollm2-135m", context: int = 64, rounds: int = 21) -> dict[str, float]:
    """Milliseconds of one batch-1 decode step (forward of one token on a `context`-token KV cache and
    its logits) for float32, bfloat16 and packed variants of `model`."""
    from lab.models import load_model
    from lab.models.reference import ContiguousKVCache

    base, _ = load_model(model, dtype=torch.float32, device="cpu")
    variants = {"float32": base, "bfloat16": copy.deepcopy(base).to(torch.bfloat16)}
    for name in ("int4", "int8"):
        variants[name] = rtn_packed(base, SPECS[name], head=False)
        variants[f"{name}+head"] = rtn_packed(base, SPECS[name], head=True)
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(100, base.config.vocab_size, (context,), generator=g)
    token, pos = prompt[-1:], torch.tensor([context])
    fns = {}
    for name, net in variants.items():
        cache = ContiguousKVCache(len(net.layers))
        net(prompt, torch.arange(context), cache)
        k, v = list(cache.k), list(cache.v)

        def step(net=net, cache=cache, k=k, v=v):
            cache.k, cache.v = list(k), list(v)  # the same context every step
            return net.compute_logits(net(token, pos, cache))
        fns[name] = step
    t = interleaved_medians(fns, rounds)
    return {name: secs * 1e3 for name, secs in t.items()}


def run(threads: int | None = None, rounds: int = 31, context: int = 64) -> dict:
    """Both measurements, with the settings and the machine's load average beside them."""
    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        load = os.getloadavg()
        linears = linear_table(rounds=rounds)
        decode = decode_step(context=context, rounds=max(5, rounds * 2 // 3))
    finally:
        torch.set_num_threads(before)
    return {"threads": threads or before, "loadavg_before": load, "torch": torch.__version__,
            "linears": linears, "decode_ms": decode,
            "decode_speedup": {k: decode["float32"] / v for k, v in decode.items()}}


def _print(result: dict) -> None:
    print(f"torch {result['torch']}, {result['threads']} thread(s), load average before "
          f"{result['loadavg_before'][0]:.2f}; milliseconds (float32 time / this in brackets)")
    header = f"{'linear':<14}{'out x in':>12}{'M':>4}" + "".join(f"{k:>20}" for k in COMPETITORS)
    print(header)
    for r in result["linears"]:
        cells = [f"{r['float32_ms']:>20.3f}"] + [
            f"{r[k + '_ms']:>12.3f} ({r['speedup_' + k]:4.1f}x)" for k in COMPETITORS[1:]]
        print(f"{r['linear']:<14}{r['out']:>6}x{r['in']:<5}{r['M']:>4}" + "".join(cells))
    print("decode step, batch 1:")
    for k, ms in result["decode_ms"].items():
        print(f"  {k:<14}{ms:8.2f} ms  ({result['decode_speedup'][k]:.2f}x float32)")


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=None, help="intra-op threads (default: torch's)")
    parser.add_argument("--rounds", type=int, default=31)
    parser.add_argument("--context", type=int, default=64, help="KV cache length of the decode step")
    args = parser.parse_args()
    _print(run(args.threads, args.rounds, args.context))
