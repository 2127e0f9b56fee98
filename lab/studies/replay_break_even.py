"""Replay break-even (notebook 04): when is recomputing a window's KV cheaper than moving it?

The cost model is `lab.replay.cost`, the controller `lab.replay.controller`, the timings `lab.replay.measure`;
this module turns them into the notebook's tables and figures: the cost per model, the break-even table per
accelerator and link, the measured crossover on this machine against two predictions (the article's
compute-only rule at 50% efficiency, and a roofline with this machine's measured ceilings that also counts
the weights and the prefix's KV the recompute must read), the PD-disaggregation scenario, and the article's
numbers recomputed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import pandas as pd
import torch
from tqdm.auto import tqdm

from lab.claims import BY_ARGUMENT, CLAIMS_COLUMNS, Bound, Number, claim_row, judged, shown
from lab.hardware import GPUS, Hardware
from lab.memory import ModelShape
from lab.models.loader import default_dtype, parse_dtype
from lab.replay.cost import LINKS, break_even_table, recompute_seconds, window_cost
from lab.runs import as_tuple, check_choice, check_device, check_dtype, check_range, resolve_device

COST_MODELS = ["smollm2-135m", "llama-2-7b", "llama-3-8b", "llama-3-70b", "qwen2.5-72b", "deepseek-v3"]
ATTENTION = {"llama-2-7b": "MHA", "deepseek-v3": "MLA"}  # the rest are GQA


@dataclass
class ReplayParams:
    PRESET: str = "quick"
    INTERACTIVE: bool = False
    DEVICE: str = "auto"  # where the models run: the lossless check, the timed recomputes and the probe
    LOSSLESS_MODEL: str = "smollm2-135m"  # the replay = no-replay check, in float32
    LOSSLESS_TOKENS: int = 32
    MODELS: tuple = ("smollm2-135m", "random:smollm2-360m")  # measured on the engine
    PREFIXES: tuple = (1024, 2048, 4096, 7680)  # M: cached tokens before the window
    WINDOWS: tuple = (16, 32, 64, 128, 256, 512)  # W
    REPEATS: int = 3
    HARDWARE: str = "h100-sxm"  # for the break-even and PD tables
    EFFICIENCY: float = 0.5  # the article's compute efficiency for its self-diagnosis rule
    PD_WINDOW: int = 64
    PD_PREFIX: int = 32768
    DTYPE: str = "auto"  # of the timed models: the serving dtype on DEVICE (the lossless check runs in float32)
    PROBE_SECONDS: float = 6.0  # this machine's ceilings in DTYPE on DEVICE, probed once per timed model
    PRESETS: ClassVar[dict] = {
        "quick": {"MODELS": ("smollm2-135m",), "PREFIXES": (1024, 4096), "WINDOWS": (16, 64, 256), "REPEATS": 2,
                  "PROBE_SECONDS": 4.0},
        "smoke": {"LOSSLESS_MODEL": "random:tiny", "LOSSLESS_TOKENS": 8, "MODELS": ("random:tiny",),
                  "PREFIXES": (64, 128), "WINDOWS": (16, 32), "REPEATS": 1, "PROBE_SECONDS": 2.0},
        # What a CPU cannot time: the recompute at a production shape, Llama-3-8B (random weights; Llama-3.1-8B
        # has the same shape and a 128K context) in bfloat16 on the GPU, against prefixes up to 32K, and against
        # the GPU's own tiers (its memory, pinned and pageable host memory over PCIe); the tables for the H200 it
        # runs on. The lossless check on the real model, on the GPU. ~20 s on one H200: the lossless check ~2 s
        # (4 x 64 SmolLM2 steps), a 33K-token prefill ~2 s, ~70 timed forwards ~1 s, tier loads ~1.5 s, probe 4 s,
        # SmolLM2 load ~1.5 s, 8 s start.
        "gpu": {"MODELS": ("random:llama-3-8b",), "DTYPE": "bfloat16", "PREFIXES": (2048, 8192, 32768),
                "WINDOWS": (16, 64, 256), "REPEATS": 5, "HARDWARE": "h200", "LOSSLESS_TOKENS": 64,
                "PROBE_SECONDS": 4.0},
    }

    def __post_init__(self):
        check_device("DEVICE", self.DEVICE)
        check_dtype("DTYPE", self.DTYPE)
        self.device = resolve_device(self.DEVICE)
        self.torch_dtype = parse_dtype(self.DTYPE) or default_dtype(self.device)  # what "auto" means there
        self.MODELS, self.PREFIXES, self.WINDOWS = (as_tuple(n, getattr(self, n)) for n in ("MODELS", "PREFIXES",
                                                                                             "WINDOWS"))
        check_choice("HARDWARE", self.HARDWARE, sorted(GPUS))
        check_range("REPEATS", self.REPEATS, 1, 100, int)
        check_range("LOSSLESS_TOKENS", self.LOSSLESS_TOKENS, 1, 200, int)
        check_range("PROBE_SECONDS", self.PROBE_SECONDS, 0.5, 60)
        check_range("EFFICIENCY", self.EFFICIENCY, 0.01, 1.0)
        for name in ("PREFIXES", "WINDOWS"):
            for v in getattr(self, name):
                check_range(name, v, 1, 1 << 20, int)


def cost_table(window: int, prefix: int, hw: Hardware, efficiency: float) -> pd.DataFrame:
    rows = []
    for name in COST_MODELS:
        c = window_cost(ModelShape.preset(name), window, prefix)
        rate = efficiency * hw.peak_flops
        rows.append({"model": name, "attention": ATTENTION.get(name, "GQA"), "window": window, "prefix": prefix,
                     "recompute_GFLOP": c.recompute_flops / 1e9, "attention_share": c.attention_flops / c.recompute_flops,
                     "kv_MB": c.kv_bytes / 1e6, "hidden_MB (HCache)": c.hidden_bytes / 1e6,
                     "prefix_read_GB": c.prefix_read_bytes / 1e9, "FLOPs_per_KV_byte": c.flops_per_kv_byte,
                     f"B*_GB/s at {efficiency:.0%} of {hw.name}": c.crossover_bandwidth(rate) / 1e9})
    return pd.DataFrame(rows)


def break_even(p: ReplayParams) -> pd.DataFrame:
    rows = break_even_table(COST_MODELS, [p.HARDWARE], p.PD_WINDOW, p.PD_PREFIX, p.EFFICIENCY)
    df = pd.DataFrame([r.__dict__ for r in rows])
    return df.pivot(index="model", columns="link", values="winner").loc[COST_MODELS]


def pd_scenario(p: ReplayParams) -> pd.DataFrame:
    """A decode node gets the last PD_WINDOW tokens' KV over a link, or recomputes them: both times, where the
    recompute is bounded by compute (at EFFICIENCY) and by reading the weights and the prefix's KV."""
    hw = GPUS[p.HARDWARE]
    rows = []
    for name in COST_MODELS:
        s = ModelShape.preset(name)
        c = window_cost(s, p.PD_WINDOW, p.PD_PREFIX)
        compute, memory = recompute_seconds(s, c, hw, p.EFFICIENCY)
        row = {"model": name, "recompute_compute_ms": 1e3 * compute, "recompute_memory_ms": 1e3 * memory,
               "recompute_ms": 1e3 * max(compute, memory)}
        for link in LINKS.values():
            if "NVMe" not in link.name:
                row[f"receive over {link.name} ms"] = 1e3 * c.kv_bytes / link.bandwidth
        rows.append(row)
    return pd.DataFrame(rows)


# ---- measurement ---------------------------------------------------------------------------------------

def measure(p: ReplayParams) -> pd.DataFrame:
    """For each model, prefix and window: the engine's recompute time on DEVICE in DTYPE, the tiers' load times
    for the window's KV, and the two predictions of the recompute time, from ceilings probed in that dtype on
    that device (`model_ceilings`, kept in the columns probe_GBps and probe_TFLOPs)."""
    from lab.engine import LLM
    from lab.models import load_model
    from lab.replay import ReplayConfig
    from lab.replay.measure import RecomputeBench, tier_loads
    from lab.hardware import model_ceilings

    rows = []
    total = max(p.PREFIXES) + max(p.WINDOWS)
    for name in p.MODELS:
        model, _ = load_model(name, dtype=p.torch_dtype, device=p.device, max_positions=total + 16,
                              prepack_weights=True)
        machine = model_ceilings(model, p.PROBE_SECONDS)
        c = model.config
        shape = ModelShape.from_hf_config(c.to_hf_dict(), name)
        weight_bytes = sum(t.numel() * t.element_size() for t in model.parameters())
        dtype_bytes = model.embed_tokens.weight.element_size()
        ids = torch.randint(0, c.vocab_size, (total,), generator=torch.Generator().manual_seed(0)).tolist()
        # Keeps the layer inputs of the last max(WINDOWS) positions (for the HCache timing); never replays itself.
        keep = ReplayConfig(window=max(p.WINDOWS), source="hidden", memory_headroom=0.0, bandwidth_utilization=1.0,
                            min_position=1.0)
        llm = LLM(model, num_kv_blocks=-(-(total + 2) // 16), max_model_len=total + 16, max_num_batched_tokens=1024,
                  replay=keep)
        bench = RecomputeBench(llm, ids)
        loads = {w: tier_loads(bench.kv_bytes(w), max(p.REPEATS, 5), p.device) for w in p.WINDOWS}
        hcache = {w: bench.hidden_restore_seconds(w, p.REPEATS) for w in p.WINDOWS}

        def roofline(m, w):
            cost = window_cost(shape, w, m, dtype_bytes=dtype_bytes)
            return cost, max(cost.recompute_flops / machine.peak_flops,
                             (weight_bytes + cost.prefix_read_bytes + cost.kv_bytes) / machine.mem_bandwidth)

        # What a forward costs beyond its roofline (Python, launches, small-matrix inefficiency), measured once
        # on a one-token forward and added to every prediction.
        overhead = max(0.0, bench.seconds(min(p.PREFIXES), 1, p.REPEATS) - roofline(min(p.PREFIXES), 1)[1])
        for m, w in tqdm([(m, w) for m in p.PREFIXES for w in p.WINDOWS], desc=f"{name}: prefix x window"):
            cost, bound = roofline(m, w)
            seconds = bench.seconds(m, w, p.REPEATS)
            kv = bench.kv_bytes(w)
            predicted = bound + overhead
            row = {"model": name, "prefix": m, "window": w, "kv_bytes": kv, "recompute_s": seconds,
                   "probe_GBps": machine.mem_bandwidth / 1e9, "probe_TFLOPs": machine.peak_flops / 1e12,
                   "achieved_GFLOPs": cost.recompute_flops / seconds / 1e9,
                   "roofline_bound_s": bound, "overhead_s": overhead, "predicted_roofline_s": predicted,
                   "predicted_article_s": cost.recompute_flops / (p.EFFICIENCY * machine.peak_flops),
                   "measured_crossover_GBps": kv / seconds / 1e9,
                   "predicted_crossover_GBps": kv / predicted / 1e9}
            row["hcache_restore_s"] = hcache[w]
            for t in loads[w]:
                row[f"load {t.what} s"] = t.seconds
            rows.append(row)
        del llm, bench, model
    df = pd.DataFrame(rows)
    df["roofline_error"] = df["predicted_roofline_s"] / df["recompute_s"] - 1
    return df


def summarize(measured: pd.DataFrame) -> pd.DataFrame:
    """Per model: how close the predictions came, and who won against each tier, measured and predicted."""
    rows = []
    for name, d in measured.groupby("model", sort=False):
        row = {"model": name, "points": len(d),
               "roofline_within_20pct": int((d["roofline_error"].abs() <= 0.2).sum()),
               "roofline_median_error": float(d["roofline_error"].median()),
               "article_rule_median_ratio": float((d["predicted_article_s"] / d["recompute_s"]).median()),
               "achieved_GFLOPs_median": float(d["achieved_GFLOPs"].median())}
        for tier in _tiers(d):
            load = d[f"load {tier} s"]
            row[f"recompute_beats_{tier}"] = int((d["recompute_s"] < load).sum())
            row[f"hcache_beats_{tier}"] = int((d["hcache_restore_s"] < load).sum())
            row[f"verdict_agrees_{tier}"] = int(((d["predicted_roofline_s"] < load) == (d["recompute_s"] < load)).sum())
        row["hcache_speedup_over_recompute_median"] = float((d["recompute_s"] / d["hcache_restore_s"]).median())
        rows.append(row)
    return pd.DataFrame(rows)


def _tiers(measured: pd.DataFrame) -> list[str]:
    """The tiers measured: host memory and a disk file everywhere, the device's own on a GPU."""
    return [c[len("load "):-len(" s")] for c in measured.columns if c.startswith("load ")]


def plot_crossover(df: pd.DataFrame):
    import matplotlib.pyplot as plt

    models = list(dict.fromkeys(df["model"]))
    fig, axes = plt.subplots(1, len(models), figsize=(6.5 * len(models), 4.2), squeeze=False)
    for ax, name in zip(axes[0], models):
        d = df[df["model"] == name]
        for i, (w, g) in enumerate(d.groupby("window")):
            color = f"C{i}"
            ax.plot(g["prefix"], g["measured_crossover_GBps"], "o-", color=color, label=f"W={w} measured")
            ax.plot(g["prefix"], g["predicted_crossover_GBps"], "x--", color=color, alpha=0.7)
        for tier, style in zip(_tiers(d), (":", "-.", "--", (0, (1, 4)), (0, (5, 5)))):
            bw = (d["kv_bytes"] / d[f"load {tier} s"]).median() / 1e9
            ax.axhline(bw, color="k", ls=style, lw=1, label=f"{tier}: {bw:.3g} GB/s (median)")
        ax.set(xscale="log", yscale="log", xlabel="prefix M (tokens)", ylabel="crossover bandwidth B* (GB/s)",
               title=f"{name}: tiers below B* lose to recompute\n(x--: roofline prediction)")
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


# ---- the article's numbers -------------------------------------------------------------------------------

def claims_table(p: ReplayParams, measured: pd.DataFrame | None = None) -> pd.DataFrame:
    """The replay article's numbers (its 70B example: 80 layers, 8 KV heads of 128, d_model 8192, fp16, H100)
    beside the lab's recomputation, one `claim_row` each (the claim led by its section of seeds/000). Every
    verdict is `lab.ledger.rules.verdict` on the lab's number: its own arithmetic (`Number(text)`) to its printed
    digit, an estimate (`Number(text, exact=False)`) within 2%, a comparison (`Bound`) strictly; the one claim
    no number decides is wrong by argument, the argument in its note."""
    s = ModelShape.preset("llama-3-70b")
    h100 = GPUS["h100-sxm"]
    per_layer = 2 * s.num_kv_heads * s.head_dim * 2
    kv_128k = s.num_layers * 131072 * per_layer
    article_w64 = 80 * 64 * (2 * 8192 * 128 + 64 * 128)
    article_w32 = 80 * 32 * (2 * 8192 * 128 + 32 * 128)
    full_w32 = window_cost(s, 32, 131072 - 32)
    # Its PD example: a 32K context; pulling the KV takes 2.9 ms, recomputing the last 64 tokens 0.4 ms.
    pd_cost = window_cost(s, 64, 32768 - 64)
    pd_recompute = max(recompute_seconds(s, pd_cost, h100, p.EFFICIENCY))
    # Each: the claim, what the article says, its number in the unit of the lab's as a rule (its own arithmetic,
    # or an estimate), the lab's number, the unit.
    rows = [
        _recomputed("§2.1: H100 ridge point (989 TFLOP/s / 3.35 TB/s)", "295 FLOPs/B", Number("295"),
                    h100.peak_flops / h100.mem_bandwidth, "FLOPs/B"),
        _recomputed("§1.1: KV per token per layer (8 KV heads x 128, fp16)", "8 KB", Number("8192"), per_layer, "B"),
        _recomputed("§2.2: recompute FLOPs of a 64-token window (its formula)", "10.7e9", Number("10.7e9"),
                    article_w64, "FLOPs", why=f"the last printed digit is off: {article_w64:.4g} prints as "
                                              f"{article_w64 / 1e9:.1f}e9"),
        _recomputed("§2.2: ... and of all the work a 64-token window needs (every layer's linears + attention, "
                    "M=32K)", "10.7e9", _estimate("10.7e9"), window_cost(s, 64, 32768).recompute_flops, "FLOPs"),
        _recomputed("§2.2: bytes of a 64-token window's KV (its 2.6 MB counts one KV head)", "2.6 MB", Number("2.6e6"),
                    window_cost(s, 64, 0).kv_bytes, "B"),
        _recomputed("§2.2: FLOPs per KV byte of the window (its 4,072)", "4072", Number("4072"),
                    window_cost(s, 64, 32768).flops_per_kv_byte, "FLOPs/B"),
        _recomputed("§2.2: KV read per decode step at 128K (its 5.4 GB counts one KV head)", "5.4 GB",
                    Number("5.4e9"), kv_128k, "B"),
        _recomputed("§2.2: time to recompute 32 tokens with its 5.38e9 FLOPs on an H100", "0.05 ms", Number("0.05"),
                    1e3 * article_w32 / h100.peak_flops, "ms"),
        _recomputed("§2.2: ... with the full work of 32 tokens after 128K (attention over the prefix included)",
                    "0.05 ms", _estimate("0.05"), 1e3 * full_w32.recompute_flops / h100.peak_flops, "ms"),
        _recomputed("§2.2: time to read 128K tokens' KV at 3.35 TB/s (its 5.4 GB)", "1.6 ms", Number("1.6"),
                    1e3 * 5.37e9 / h100.mem_bandwidth, "ms"),
        _recomputed("§2.2: ... the real 128K KV (8 KV heads)", "1.6 ms", _estimate("1.6"),
                    1e3 * kv_128k / h100.mem_bandwidth, "ms"),
        _recomputed("§3.2: PD: recompute the last 64 tokens of a 32K context on the decode node (H100, 50%, weights "
                    "and prefix read)", "0.4 ms", _estimate("0.4"), 1e3 * pd_recompute, "ms"),
        _recomputed("§3.2: PD: pull the 32K context's KV from the prefill node over a 400 Gb/s link", "2.9 ms",
                    _estimate("2.9"), 1e3 * window_cost(s, 32768, 0).kv_bytes / LINKS["net-400g"].bandwidth, "ms"),
    ]
    receive_ms = 1e3 * pd_cost.kv_bytes / LINKS["net-400g"].bandwidth
    gain = receive_ms / (1e3 * pd_recompute)  # recomputing beats receiving when this exceeds 1
    rows.append(_compared("§3.2: PD: recompute the last 64 tokens rather than receive their KV", "recompute (0.4 ms)",
                          f"receive {receive_ms:.3g} ms over 400 Gb/s vs recompute {1e3 * pd_recompute:.3g} ms: "
                          f"receive / recompute {gain:.3g}", Bound("1"), gain, "receiving wins"))
    # Its self-diagnosis rule (§5.5): replay when the estimated KV read exceeds 1.2 x the estimated recompute of
    # W tokens at 50% efficiency. On its own 128K example, with the real KV and the full work of W = 32:
    read_s = kv_128k / h100.mem_bandwidth
    recompute_s = full_w32.recompute_flops / (0.5 * h100.peak_flops)
    rows.append(_compared("§5.5: self-diagnosis on its 128K example: replay pays (read > 1.2 x recompute at 50%)",
                          "yes (1.6 ms vs 0.08-0.12 ms)",
                          f"read {1e3 * read_s:.3g} ms vs recompute {1e3 * recompute_s:.3g} ms: read / recompute "
                          f"{read_s / recompute_s:.3g}", Bound("1.2"), read_s / recompute_s,
                          "the rule says do not replay"))
    # No number decides it: the window's attention reads every prefix position's K and V, whatever it recomputes.
    rows.append(claim_row("§2.2: replaying a window spares reading the prefix's KV",
                          "1.6 ms read vs 0.05 ms recompute",
                          f"the window's attention reads all {kv_128k / 1e9:.3g} GB of the prefix anyway", BY_ARGUMENT,
                          "the read is not avoided: each recomputed token attends to every prefix position, so the "
                          "window's attention reads the prefix's K and V whether or not its own KV is kept"))
    if measured is not None and len(measured):
        n = len(measured)
        wins = {tier: int((measured[f"load {tier} s"] > measured["recompute_s"]).sum())
                for tier in ("host memory", "disk file")}
        # the notebook's criterion: recomputing beats host memory at most measured points
        word, _ = judged(Bound("0.5"), wins["host memory"] / n)
        rows.append(claim_row("§3.1: recomputing a recent window beats reading its KV on long contexts",
                              "yes, by an order of magnitude",
                              f"recompute faster than host memory in {wins['host memory']} of {n} measured points, "
                              f"than the disk file in {wins['disk file']} of {n}", word,
                              "on this machine: its engine against its host memory and disk"))
    return pd.DataFrame(rows, columns=CLAIMS_COLUMNS)


def _estimate(text: str) -> Number:
    """An article's figure about a real model or device (modelling choices it does not state move it): 2%."""
    return Number(text, exact=False)


def _recomputed(claim: str, says: str, rule: Number, computed: float, unit: str, why: str = "") -> dict:
    """A `claim_row` for an article's number recomputed here, judged by `rule` (`lab.claims.judged`) and printed to
    at least the claim's precision, so the ledger reads back the verdict; by how much (and `why`, where the figure
    has a point worth stating) in the note."""
    word, off = judged(rule, computed)
    return claim_row(claim, says, f"{shown(computed, rule)} {unit}", word, "; ".join(n for n in (off, why) if n))


def _compared(claim: str, says: str, measured: str, rule: Bound, value: float, why_not: str) -> dict:
    """A `claim_row` for a comparison the article draws: `rule` on the ratio `value`; `why_not` when it fails."""
    word, off = judged(rule, value)
    return claim_row(claim, says, measured, word, "; ".join((off, why_not)) if off else "")
