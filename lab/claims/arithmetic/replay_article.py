"""Seed 000's arithmetic, recomputed from the inputs the article states (KV cache versus local recomputation (Replay)).

Its worked example is a 70B model: L = 80 layers, G = 8 KV heads of d_head = 128, d_model = 8192, fp16, on an H100
(989 TFLOP/s, 3.35 TB/s): Llama-3-70B's shape (`ModelShape.preset("llama-3-70b")`, 64 query heads = 8192 / 128).
Two kinds of row: the article's own products and quotients on those inputs (its §2.2 formula, which counts one
KV head's K and V, 2 x d_head x 2 bytes, and only the window's K/V projections), and claims its example settles once
the work is counted whole (`lab.replay.cost.window_cost`: every layer's linears and attention over the prefix) and
the KV is counted with its eight heads (`lab.memory`).
"""

from __future__ import annotations

from lab import memory as mem
from lab.claims.table import Bound, Number, Range, claim_row, judged, shown
from lab.machine.hardware import GPUS
from lab.replay.cost import window_cost
from lab.claims.arithmetic import recomputed

FP16 = 2


def seventy_b() -> mem.ModelShape:
    """The article's 70B: L = 80, G = 8, d_head = 128, d_model = 8192 (Llama-3-70B has exactly that shape)."""
    return mem.ModelShape.preset("llama-3-70b")


def formula_flops(s: mem.ModelShape, window: int) -> float:
    """The article's §2.2 recompute cost: L x W x (2 x d_model x d_head + W x d_head), the window's K (or V)
    projection and its attention within the window only."""
    return s.num_layers * window * (2 * s.hidden_size * s.head_dim + window * s.head_dim)


def formula_bytes(s: mem.ModelShape, tokens: int) -> float:
    """The article's §2.2 KV read: L x tokens x (2 x d_head x dtype_size), K and V of one KV head."""
    return s.num_layers * tokens * 2 * s.head_dim * FP16


def spanned(claim: str, says: str, rule: Range | Number, value: float, span: tuple[float, float], unit: str,
            why: str = "") -> dict:
    """A `claim_row` for a figure its inputs leave a span for ("at 40-60% of peak"): `value` with its span printed
    "v [lo, hi]", which the ledger reads back as the figure and its interval, judged over the whole span."""
    lo, hi = min(span), max(span)
    word, off = judged(rule, value, (lo, hi))
    text = f"{shown(value, rule)} [{shown(lo, rule)}, {shown(hi, rule)}] {unit}"
    return claim_row(claim, says, text, word, "; ".join(n for n in (off, why) if n))


def _section_2(s: mem.ModelShape) -> list[dict]:
    h100 = GPUS["h100-sxm"]
    w32 = formula_flops(s, 32)
    at = {eff: 1e3 * w32 / (eff * h100.peak_flops) for eff in (0.4, 0.5, 0.6, 1.0)}
    ratio = formula_flops(s, 64) / formula_bytes(s, 64)
    whole = window_cost(s, 64, 0)  # the least work a 64-token window's recompute does: no prefix at all
    return [
        recomputed("000 §2.2: its 2.6 MB, 80 x 64 x 512 B (one KV head's K and V, fp16)", "262 万字节 ≈ 2.6 MB",
                   Number("2.62e6"), formula_bytes(s, 64), "B"),
        # the quotient the sentence names, of the two figures it printed (its formula's own ratio is another number)
        recomputed("000 §2.2: its FLOPs per KV byte of the 64-token window, 107 亿 / 262 万", "≈ 4072 FLOPs/Byte",
                   Number("4072"), 10.7e9 / 2.62e6, "FLOPs/B",
                   why=f"the quotient of its two printed figures; its formula's own ratio, (2 x 8192 + 64) / 4, is "
                       f"{ratio:.0f}"),
        recomputed("000 §2.2: so recomputing the 64-token window in place of its KV does not pay (FLOPs per KV byte "
                   "above the H100's 295; the whole work, no prefix)", "4072 远大于 295 … 反而是不划算的",
                   Bound(f"{h100.peak_flops / h100.mem_bandwidth:.0f}"), whole.flops_per_kv_byte, "FLOPs/B"),
        recomputed("000 §2.2: its 128K read, 80 x 131072 x 512 B (one KV head's K and V, fp16)", "≈ 5.4 GB",
                   Number("5.4e9"), formula_bytes(s, 131072), "B"),
        recomputed("000 §2.2: recompute FLOPs of the last 32 tokens (its formula 80 x 32 x (2 x 8192 x 128 + "
                   "32 x 128))", "53.8 亿 FLOPs", Number("5.38e9"), w32, "FLOPs"),
        spanned("000 §2.2: its 5.38e9 FLOPs at 40-60% of an H100's 989 TFLOP/s (at 50% [60%, 40%])",
                "0.08~0.12ms", Range("0.08", "0.12"), at[0.5], (at[0.6], at[0.4]), "ms",
                why=f"its 0.05 ms at peak is {0.05 / at[1.0]:.1f}x the quotient, {at[1.0]:.2g} ms; so is this range"),
    ]


def _section_3_to_6(s: mem.ModelShape) -> list[dict]:
    per_request = {m: mem.kv_cache_bytes(s, m, dtype="fp16") for m in (32768, 131072)}
    small = mem.ModelShape.preset("llama-3-8b")
    width = (window_cost(s, 32, 32768 - 32).flops_per_kv_byte / window_cost(small, 32, 32768 - 32).flops_per_kv_byte)
    share = window_cost(s, 32, 32768 - 32).recompute_flops / window_cost(s, 32768, 0).recompute_flops
    # One card's concurrency is its KV budget over one request's KV. Replay frees, per request, its window
    # (W = 64 of a 32K context), or at most the 20-40% its §4.1 table leaves uncached ("前 60%~80% 仍缓存").
    kv32k = mem.kv_cache_bytes(s, 32768, dtype="fp16")
    window_only = 8 * kv32k / mem.kv_cache_bytes(s, 32768 - 64, dtype="fp16")
    generous = 8 * kv32k / mem.kv_cache_bytes(s, round(0.6 * 32768), dtype="fp16")
    return [
        spanned("000 §3.2: the KV of 10 requests (8 KV heads, fp16) at 32K [32K-128K, the contexts it targets]",
                "几十 GB", Range("10", "99"), 10 * per_request[32768] / 1e9,
                (10 * per_request[32768] / 1e9, 10 * per_request[131072] / 1e9), "GB",
                why="hundreds of GB; one KV head (its §2.2 count) would give an eighth"),
        recomputed("000 §4.1: a 32-token window's recompute FLOPs over a 32K context's (70B, attention included)",
                   "大约是总上下文的 1/1000", Number("1e-3", exact=False), share, ""),
        recomputed("000 §4.1: bigger models show Replay's advantage more (FLOPs per KV byte of a 32-token window at "
                   "32K, Llama-3-70B over Llama-3-8B, below 1)", "越大越能体现 Replay 优势",
                   Bound("1", above=False), width, "x",
                   why="a wider model does more work per KV byte it recomputes (its own formula: (2 d_model + W) / 4 "
                       "FLOPs per byte), so replay pays less, not more"),
        spanned("000 §6: one card's concurrency with replay, from 8 (its KV freed: 60% of each sequence cached "
                "[a 64-token window of 32K, 60% cached])", "8 路 -> 16 路甚至 32 路", Range("16", "32"), generous,
                (window_only, generous), "requests",
                why="memory-bound concurrency grows only by the KV replay frees per request"),
    ]


def _unrowed(s: mem.ModelShape) -> list[dict]:
    """Claims a skeptic's re-read found without a row (issue 48 item 5), each settled by arithmetic on the article's
    inputs: its §1.1 concurrency, §3.2 link against memory and §4.1 chunk limit."""
    h100 = GPUS["h100-sxm"]
    node = 8 * 80e9 - mem.weight_bytes(s, "fp16", unquantized="fp16")["total"]  # its 8 x 80 GB less the fp16 weights
    return [
        recomputed("000 §1.1: 16 concurrent 128K requests' KV (8 KV heads, 80 layers, fp16) over what its 8 x 80 GB "
                   "node holds beside the fp16 weights, above 1", "16 路、32 路显存瞬间就爆了", Bound("1"),
                   16 * mem.kv_cache_bytes(s, 131072, dtype="fp16") / node, "x",
                   why="with its own 1 GB a request (000-02) 16-32 requests would fit; with the eight heads they do not"),
        recomputed("000 §3.2: an H100's memory bandwidth over a 400 Gb/s link's, above 1", "通信带宽…比显存带宽更稀缺",
                   Bound("1"), h100.mem_bandwidth / 50e9, "x",
                   why="its own 2.9 ms for a 32K context's KV over the link (000-21) needs 3.7 TB/s, more than HBM"),
        recomputed("000 §4.1: the chunk W at which its formula's W^2 term matches its linear term (2 x d_model)",
                   "chunk 通常不能超过 64", Number("64", exact=False), 2 * s.hidden_size, "tokens",
                   why=f"at W = 64 the W^2 term is {100 * 64 / (2 * s.hidden_size + 64):.2f}% of its per-window cost"),
    ]


def rows() -> list[dict]:
    """One `recomputed` row per claim of seed 000 that arithmetic on its stated inputs decides."""
    s = seventy_b()
    return [*_section_2(s), *_section_3_to_6(s), *_unrowed(s)]
