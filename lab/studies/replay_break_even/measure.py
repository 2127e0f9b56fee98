"""Replay break-even (notebook 04): when is recomputing a window's KV cheaper than moving it?

The cost model is `lab.replay.cost`, the controller `lab.replay.controller`, the timings `lab.replay.measure`;
this module turns them into the notebook's tables and figures: the cost per model, the break-even table per
accelerator and link, the measured crossover on this machine against two predictions (the article's
compute-only rule at 50% efficiency, and a roofline with this machine's measured ceilings that also counts
the weights and the prefix's KV the recompute must read), the PD-disaggregation scenario, and the article's
numbers recomputed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import pandas as pd
import torch
from tqdm.auto import tqdm

from lab.machine.hardware import GPUS, Hardware
from lab.memory import ModelShape
from lab.models.loader import default_dtype, parse_dtype
from lab.replay.cost import LINKS, break_even_table, recompute_seconds, window_cost
from lab.figures.style import PALETTE, legend_outside
from lab.workflow.run import as_tuple, check_choice, check_device, check_model, check_dtype, check_range, resolve_device

COST_MODELS = ["smollm2-135m", "llama-2-7b", "llama-3-8b", "llama-3-70b", "qwen2.5-72b", "deepseek-v3"]
ATTENTION = {"llama-2-7b": "MHA", "deepseek-v3": "MLA"}  # the rest are GQA


@dataclass
class ReplayParams:
    PRESET: str = "quick"
    INTERACTIVE: bool = False
    DEVICE: str = "auto"  # where the models run: the lossless check, the timed recomputes and the probe
    MODEL: str = "smollm2-135m"  # the replay = no-replay check (in float32) and the first model timed
    LOSSLESS_TOKENS: int = 32
    MORE_MODELS: tuple = ("random:smollm2-360m",)  # timed beside MODEL on the engine: another scale
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
        "quick": {"MORE_MODELS": (), "PREFIXES": (1024, 4096), "WINDOWS": (16, 64, 256), "REPEATS": 2,
                  "PROBE_SECONDS": 4.0},
        "smoke": {"MODEL": "random:tiny", "LOSSLESS_TOKENS": 8, "MORE_MODELS": (),
                  "PREFIXES": (64, 128), "WINDOWS": (16, 32), "REPEATS": 1, "PROBE_SECONDS": 2.0},
        # What a CPU cannot time: the recompute at a production shape, Llama-3-8B (random weights; Llama-3.1-8B
        # has the same shape and a 128K context) in bfloat16 on the GPU, against prefixes up to 32K, and against
        # the GPU's own tiers (its memory, pinned and pageable host memory over PCIe); the tables for the H200 it
        # runs on. The lossless check on that model too, in float32 (exactness holds or fails whatever the
        # weights). ~25 s on one H200 (an estimate): the lossless check ~7 s (4 x 64 steps of the 8B in float32), a
        # 33K-token prefill ~2 s, ~70 timed forwards ~1 s, tier loads ~1.5 s, probe 4 s, the 8B's random weights
        # built twice (float32, then bfloat16) ~1.5 s, 8 s start.
        "gpu": {"MODEL": "random:llama-3-8b", "DTYPE": "bfloat16", "PREFIXES": (2048, 8192, 32768),
                "WINDOWS": (16, 64, 256), "REPEATS": 5, "HARDWARE": "h200", "LOSSLESS_TOKENS": 64,
                "PROBE_SECONDS": 4.0},
    }

    def __post_init__(self):
        check_device("DEVICE", self.DEVICE)
        check_dtype("DTYPE", self.DTYPE)
        self.device = resolve_device(self.DEVICE)
        self.torch_dtype = parse_dtype(self.DTYPE) or default_dtype(self.device)  # what "auto" means there
        self.MORE_MODELS, self.PREFIXES, self.WINDOWS = (as_tuple(n, getattr(self, n))
                                                         for n in ("MORE_MODELS", "PREFIXES", "WINDOWS"))
        check_model("MODEL", self.MODEL, self.DEVICE, "float32")  # the lossless check's dtype
        for m in self.MORE_MODELS:
            check_model("MORE_MODELS", m, self.DEVICE, self.DTYPE)
        self.MODELS = (self.MODEL, *self.MORE_MODELS)  # every model timed, MODEL first
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
    for the window's KV, and three predictions of the recompute time: the article's compute-only rule, the
    roofline with the machine's probed ceilings (`model_ceilings`, columns probe_GBps and probe_TFLOPs), and the
    engine's cost model (`lab.replay.engine_cost`: fixed + forward + gather + attention, each term's ceiling from
    its own microbenchmark in this run, `lab.replay.microbench`), term by term."""
    from lab.engine import LLM, KeysNotRebuildable
    from lab.models import load_model
    from lab.replay import ReplayConfig
    from lab.replay.measure import RecomputeBench, tier_loads
    from lab.replay.microbench import measure_ceilings
    from lab.machine.hardware import model_ceilings

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
        sizes = dict(num_kv_blocks=-(-(total + 2) // 16), max_model_len=total + 16, max_num_batched_tokens=1024)
        try:
            llm, no_hcache = LLM(model, **sizes, replay=keep), ""
        except KeysNotRebuildable as e:  # a family whose keys pass a k_norm or a partial RoPE: recompute only
            llm, no_hcache = LLM(model, **sizes), str(e)
        bench = RecomputeBench(llm, ids)
        loads = {w: tier_loads(bench.kv_bytes(w), max(p.REPEATS, 5), p.device) for w in p.WINDOWS}
        hcache = {w: math.nan if no_hcache else bench.hidden_restore_seconds(w, p.REPEATS) for w in p.WINDOWS}
        ceilings = measure_ceilings(bench, p.WINDOWS, p.PREFIXES, p.REPEATS)

        def roofline(m, w):
            cost = window_cost(shape, w, m, dtype_bytes=dtype_bytes)
            return cost, max(cost.recompute_flops / machine.peak_flops,
                             (weight_bytes + cost.prefix_read_bytes + cost.kv_bytes) / machine.mem_bandwidth)

        # The roofline's fixed per-forward overhead, measured once on a one-token forward (the model before the
        # engine's terms: kept to show what they add).
        overhead = max(0.0, bench.seconds(min(p.PREFIXES), 1, p.REPEATS) - roofline(min(p.PREFIXES), 1)[1])
        for m, w in tqdm([(m, w) for m in p.PREFIXES for w in p.WINDOWS], desc=f"{name}: prefix x window"):
            cost, bound = roofline(m, w)
            seconds = bench.seconds(m, w, p.REPEATS)
            kv = bench.kv_bytes(w)
            terms = ceilings.predict(m, w)
            row = {"model": name, "prefix": m, "window": w, "kv_bytes": kv, "recompute_s": seconds,
                   "probe_GBps": machine.mem_bandwidth / 1e9, "probe_TFLOPs": machine.peak_flops / 1e12,
                   "achieved_GFLOPs": cost.recompute_flops / seconds / 1e9,
                   "roofline_bound_s": bound, "overhead_s": overhead, "predicted_roofline_s": bound + overhead,
                   "predicted_article_s": cost.recompute_flops / (p.EFFICIENCY * machine.peak_flops),
                   **{f"{n}_s": getattr(terms, n) for n in terms.NAMES}, "predicted_s": terms.total,
                   "largest_term": terms.largest(), "gather_GBps": ceilings.gather_Bps / 1e9,
                   "attention_GFLOPs": ceilings.attention_Fps[w] / 1e9, "attention_keys": ceilings.attention_keys,
                   "measured_crossover_GBps": kv / seconds / 1e9, "predicted_crossover_GBps": kv / terms.total / 1e9}
            row["hcache_restore_s"], row["hcache_not_measured"] = hcache[w], no_hcache
            for t in loads[w]:
                row[f"load {t.what} s"] = t.seconds
            rows.append(row)
        del llm, bench, model
    return judge_predictions(pd.DataFrame(rows))


def judge_predictions(df: pd.DataFrame) -> pd.DataFrame:
    """`df` with each prediction's error, and per tier the break-even verdict measured and predicted by the
    engine's cost model side by side (recompute beats loading from the tier: True or False)."""
    df["roofline_error"] = df["predicted_roofline_s"] / df["recompute_s"] - 1
    df["model_error"] = df["predicted_s"] / df["recompute_s"] - 1
    # what the sum leaves out, where it misses by more than 20%: the measured time less the prediction
    df["unexplained_s"] = (df["recompute_s"] - df["predicted_s"]).where(df["model_error"].abs() > 0.2, 0.0)
    for tier in _tiers(df):
        load = df[f"load {tier} s"]
        df[f"measured: recompute beats {tier}"] = df["recompute_s"] < load
        df[f"model: recompute beats {tier}"] = df["predicted_s"] < load
    return df


def summarize(measured: pd.DataFrame) -> pd.DataFrame:
    """Per model: how close the predictions came (the engine's cost model and the roofline before it), and who
    won against each tier, measured and as the cost model predicts it, side by side."""
    rows = []
    for name, d in measured.groupby("model", sort=False):
        row = {"model": name, "points": len(d),
               "model_within_20pct": int((d["model_error"].abs() <= 0.2).sum()),
               "model_median_error": float(d["model_error"].median()),
               "model_worst_error": float(d["model_error"].abs().max()),
               "roofline_within_20pct": int((d["roofline_error"].abs() <= 0.2).sum()),
               "roofline_median_error": float(d["roofline_error"].median()),
               "article_rule_median_ratio": float((d["predicted_article_s"] / d["recompute_s"]).median()),
               "achieved_GFLOPs_median": float(d["achieved_GFLOPs"].median())}
        for tier in _tiers(d):
            measured_wins, model_wins = d[f"measured: recompute beats {tier}"], d[f"model: recompute beats {tier}"]
            row[f"recompute_beats_{tier}"] = int(measured_wins.sum())
            row[f"model_recompute_beats_{tier}"] = int(model_wins.sum())
            row[f"verdict_agrees_{tier}"] = int((measured_wins == model_wins).sum())
            row[f"roofline_verdict_agrees_{tier}"] = int(((d["predicted_roofline_s"] < d[f"load {tier} s"])
                                                          == measured_wins).sum())
            # None, not 0, where HCache could not run on this family (`hcache_not_measured` says why)
            row[f"hcache_beats_{tier}"] = (int((d["hcache_restore_s"] < d[f"load {tier} s"]).sum())
                                           if d["hcache_restore_s"].notna().all() else None)
        row["hcache_speedup_over_recompute_median"] = float((d["recompute_s"] / d["hcache_restore_s"]).median())
        row["hcache_not_measured"] = d["hcache_not_measured"].iloc[0] if "hcache_not_measured" in d else ""
        rows.append(row)
    return pd.DataFrame(rows)


def terms_table(measured: pd.DataFrame) -> pd.DataFrame:
    """Per point: measured, the cost model's terms and their sum, its error, and where it misses by more than 20%
    what it leaves unexplained against its largest term (which term is short, or a term it lacks)."""
    cols = ["model", "prefix", "window", "recompute_s", "predicted_s", "model_error", "fixed_s", "forward_s",
            "gather_s", "attention_s", "largest_term", "unexplained_s"]
    return measured[cols]


def plot_predicted(df: pd.DataFrame):
    """Predicted against measured recompute time, the cost model's points (left) and the roofline's (right), each
    with the identity line and the +-20% band the model is held to; one colour per model."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8), sharex=True, sharey=True)
    lo = min(df["recompute_s"].min(), df["predicted_s"].min(), df["predicted_roofline_s"].min()) / 2
    hi = max(df["recompute_s"].max(), df["predicted_s"].max(), df["predicted_roofline_s"].max()) * 2
    grid = [lo, hi]
    for ax, column, name in ((axes[0], "predicted_s", "the cost model"),
                             (axes[1], "predicted_roofline_s", "the roofline alone")):
        ax.fill_between(grid, [0.8 * x for x in grid], [1.2 * x for x in grid], color="0.9", label="within 20%")
        ax.plot(grid, grid, "k-", lw=1, label="predicted = measured")
        for i, (model, d) in enumerate(df.groupby("model", sort=False)):
            ax.scatter(d["recompute_s"], d[column], color=PALETTE[i], s=18, label=model)
        ax.set(xscale="log", yscale="log", xlabel="measured recompute (s)", ylabel="predicted recompute (s)",
               title=f"Recompute time: {name} against the engine")
        for axis in (ax.xaxis, ax.yaxis):  # a narrow range (a smoke run) labels minor ticks, which collide
            axis.set_minor_formatter(plt.NullFormatter())
        legend_outside(ax)
    fig.tight_layout()
    return fig


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
            color = PALETTE[i]
            ax.plot(g["prefix"], g["measured_crossover_GBps"], "o-", color=color, label=f"W={w} measured")
            ax.plot(g["prefix"], g["predicted_crossover_GBps"], "x--", color=color, alpha=0.7, label="_predicted")
        for tier, style in zip(_tiers(d), (":", "-.", "--", (0, (1, 4)), (0, (5, 5)))):
            bw = (d["kv_bytes"] / d[f"load {tier} s"]).median() / 1e9
            ax.axhline(bw, color="k", ls=style, lw=1, label=f"{tier}: {bw:.3g} GB/s (median)")
        ax.plot([], [], "x--", color="0.5", label="x--: the cost model's prediction\n(in its window's colour)")
        ax.set(xscale="log", yscale="log", xlabel="prefix M (tokens)", ylabel="crossover bandwidth B* (GB/s)",
               title=f"{name}: tiers below B* lose to recompute")
        prefixes = sorted(d["prefix"].unique())
        ax.set_xticks(prefixes, [f"{p:,}" for p in prefixes])
        ax.xaxis.set_minor_locator(plt.NullLocator())
        legend_outside(ax)
    fig.tight_layout()
    return fig
