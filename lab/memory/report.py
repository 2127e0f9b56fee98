"""One memory account of a model, as `lab memory` prints it: parameters, weight and KV bytes, their total,
and the capacity on a GPU.

GiB (1024^3 bytes) is used wherever a number is reported in "GB", as the articles' own code does.
"""

from __future__ import annotations

from .device_capacity import capacity
from .kv_cache import KV_DTYPE_BITS, default_kv_granularity, kv_bytes_per_token
from .shape import ModelShape, param_counts
from .weights import weight_bytes

GIB = 1024**3


def memory_report(model: str | ModelShape, weights: str = "bf16", kv_dtype: str = "bf16", seq_len: int = 8192,
                  concurrency: int = 1, gpu: str | None = None, block_size: int = 16, utilization: float = 0.9,
                  kv_granularity: str | None = None) -> dict:
    """Everything `lab memory` prints: parameters, weight and KV bytes, their total, and the capacity on a GPU."""
    s = model if isinstance(model, ModelShape) else ModelShape.load(model)
    for name, value in (("seq_len", seq_len), ("concurrency", concurrency), ("block_size", block_size)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if kv_dtype not in KV_DTYPE_BITS:
        raise ValueError(f"unknown KV dtype {kv_dtype!r}; known: {', '.join(KV_DTYPE_BITS)}")
    kv_kw = dict(granularity=kv_granularity or default_kv_granularity(kv_dtype))
    w = weight_bytes(s, weights)
    per_token = kv_bytes_per_token(s, kv_dtype, seq_len=seq_len, **kv_kw)
    kv_total = per_token * seq_len * concurrency
    report = {
        "model": s.name, "weights_format": weights, "kv_dtype": kv_dtype, "seq_len": seq_len,
        "concurrency": concurrency, "params": param_counts(s),
        "weight_bytes": w, "kv_bytes_per_token": per_token,
        "kv_bytes_per_token_per_layer": kv_bytes_per_token(s, kv_dtype, **kv_kw) / s.num_layers,
        "kv_bytes_total": kv_total, "total_bytes": w["total"] + kv_total,
    }
    if gpu:
        from lab.machine.hardware import get_gpu

        hw = get_gpu(gpu)
        cap = capacity(s, hw.memory_bytes, weights, kv_dtype, max_model_len=seq_len, block_size=block_size,
                       utilization=utilization, **kv_kw)
        report["gpu"] = {"name": hw.name, "memory_bytes": hw.memory_bytes, **cap.as_dict()}
    return report


def format_report(r: dict) -> str:
    g = lambda b: f"{b / GIB:10.2f} GiB"  # noqa: E731
    p = r["params"]
    lines = [f"{r['model']}: {p['total'] / 1e9:.3f} B parameters ({p['active'] / 1e9:.3f} B active per token)",
             f"weights ({r['weights_format']}):"]
    lines += [f"  {k:18s}{g(v)}" for k, v in r["weight_bytes"].items()]
    lines += [f"KV cache ({r['kv_dtype']}): {r['kv_bytes_per_token']:,.0f} bytes per token "
              f"({r['kv_bytes_per_token_per_layer']:,.0f} per layer)",
              f"  {r['seq_len']} tokens x {r['concurrency']} sequences{g(r['kv_bytes_total'])}",
              f"weights + KV{g(r['total_bytes'])}"]
    if "gpu" in r and r["gpu"]["free_bytes"] < 0:
        c = r["gpu"]
        lines += [f"on {c['name']} ({c['memory_bytes'] / GIB:.0f} GiB, utilization {c['utilization']}): weights and "
                  f"activations alone exceed the usable memory by {-c['free_bytes'] / GIB:.2f} GiB: no KV blocks"]
    elif "gpu" in r:
        c = r["gpu"]
        lines += [f"on {c['name']} ({c['memory_bytes'] / GIB:.0f} GiB, utilization {c['utilization']}): "
                  f"{c['num_blocks']} KV blocks of {c['block_size']} tokens -> max concurrency "
                  f"{c['max_concurrency']:.2f} at {c['max_model_len']} tokens, operate at {c['operating_concurrency']}"]
    return "\n".join(lines)
