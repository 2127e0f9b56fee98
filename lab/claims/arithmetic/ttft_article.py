"""Seed 002's arithmetic, recomputed from the inputs the article states (TTFT and cold start) and datasheet figures.

Three of its claims are settled by its own numbers set beside `lab.machine.hardware`'s A100 (the GPU it names) through
`lab.memory` and `lab.machine.roofline`: what bounds a prefill on a KV-cache miss (§1.1), whether a 70B model in FP16 fits
one card (§2.2), and whether loading is bound by GPU memory bandwidth (§3.1). Each comparison is a `Bound` the
claim implies, so a different model, prompt or GPU could turn it.
"""

from __future__ import annotations

from lab import memory as mem
from lab.machine import roofline as rl
from lab.machine.hardware import get_gpu
from lab.claims.arithmetic import Bound, recomputed

MODEL, GPU = "llama-3-70b", "a100-sxm-80gb"  # the article's 70B and its A100 80GB
PROMPT = 1024  # §6.1's worked example: "以70B模型、輸入長度1024 token為例"
LOAD_S = 10  # §1.1 and §3: a 70B's cold-start load "can exceed 10 s"


def miss_bound(model: str = MODEL, gpu: str = GPU, prompt: int = PROMPT) -> dict:
    """Roofline times of the prefill a miss makes: its weights and KV bytes over the GPU's bandwidth, its FLOPs
    over its peak (`lab.machine.roofline.prefill_time_lower_bound`)."""
    cost = rl.model_cost(mem.ModelShape.preset(model), "bf16", "bf16")
    t = rl.prefill_time_lower_bound(get_gpu(gpu), rl.prefill_flops(cost, prompt), rl.prefill_bytes(cost, prompt))
    return {"memory_s": t.memory_s, "compute_s": t.compute_s}


def fp16_over_card(model: str = MODEL, gpu: str = GPU) -> float:
    """A model's 16-bit weights over one card's memory."""
    return mem.weight_bytes(mem.ModelShape.preset(model), "bf16")["total"] / get_gpu(gpu).memory_bytes


def hbm_share_of_load(model: str = MODEL, gpu: str = GPU, load_s: float = LOAD_S) -> float:
    """The time to write a model's 16-bit weights into the GPU's memory at its bandwidth, as a share of `load_s`."""
    return mem.weight_bytes(mem.ModelShape.preset(model), "bf16")["total"] / get_gpu(gpu).mem_bandwidth / load_s


def rows() -> list[dict]:
    """One `recomputed` row per claim of seed 002 that arithmetic on its stated inputs decides."""
    t = miss_bound()
    gpu = get_gpu(GPU)
    return [
        recomputed(
            f"002 §1.1: on a KV-cache miss memory bandwidth becomes the bottleneck: roofline memory over compute time "
            f"of a {PROMPT}-token prefill of a 70B on an A100", "memory-bound (「顯存帶寬反而成為瓶頸」)",
            Bound("1"), t["memory_s"] / t["compute_s"],
            f"x ({MODEL}, bf16, {gpu.name}: reading its weights and writing the KV {t['memory_s'] * 1e3:.0f} ms, its "
            f"FLOPs at peak {t['compute_s'] * 1e3:.0f} ms)",
            f"a miss means a prefill, which uses each 16-bit weight it reads once per prompt token: compute-bound "
            f"past the GPU's ridge point, {rl.ridge_point(gpu):.0f} FLOP/byte, about that many tokens"),
        recomputed(
            "002 §2.2: a 70B model in FP16 runs short of memory on a single card: weights over one A100 80GB",
            "short of memory (「若僅單卡推理，TTFT會因顯存不足頻繁觸發swap而飆升」)", Bound("1"), fp16_over_card(),
            f"x ({MODEL} in bf16 over {gpu.memory_bytes / 2**30:.0f} GiB)",
            "the weights alone do not fit; a serving engine then refuses to start (vLLM's swap space holds the KV "
            "of preempted requests, not weights) unless the excess is offloaded to host memory and read over PCIe "
            "every forward, which is what would make TTFT soar"),
        recomputed(
            "002 §3.1: loading a large model on one machine is bound by GPU memory bandwidth: writing a 70B's "
            "weights into A100 memory, as a share of the article's own 10 s load",
            "bound by GPU memory bandwidth (「單機加載大模型受限于顯存帶寬」)", Bound("0.5"), hbm_share_of_load(),
            f"of the load ({MODEL} in bf16 at {gpu.mem_bandwidth / 1e12:.3f} TB/s, against {LOAD_S} s)",
            "bound by a resource means its time is most of the load (the rule: over half); the weights cross storage "
            "and PCIe, each far slower than HBM (notebook 09's cold_start table times this machine's disk)"),
    ]
