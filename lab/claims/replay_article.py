"""Every numeric or testable claim of seeds/000 (KV cache versus local recomputation, "Replay"), by section.

Most are checked by notebook 04 (the replay break-even, `lab.studies.replay_break_even.claims_table`) and
notebook 01 (memory accounting, with the article's arithmetic recomputed in `lab.claims.arithmetic.replay_article`). The
article's numbers are written in the unit of the lab's figure and to the article's printed precision (its "2.6 MB"
is "2.6e6" bytes).

Each claim says the setting it is about (`about`) and what it depends on (`scope`, `lab.claims.rules.SCOPES`): the
article's own arithmetic, a count of work or bytes (behaviour, which this CPU or arithmetic decides), or a time on
an H100 (gpu-speed, which only a GPU measurement or a projection decides and a physics bound can only refute).

Its wrong verdicts come from far fewer mistakes (`CAUSES`, which CLAIMS.md counts), most of them from two, each
repeated through §2.2's worked example and what is built on it: a KV size of one KV head where the model has eight,
and a recompute cost that leaves out the window's forward pass through the model and its attention over the prefix.
"""

from __future__ import annotations

from lab.claims.model_class import ModelClass
from lab.claims.record import Assumption, Cause, Claim, Link, Reading
from lab.claims.rules import (ARGUMENT, ARITHMETIC, BY_ARGUMENT, NOT_CHECKABLE, PHYSICS_BOUND, PROJECTED,
                              Bound, Number, Range)

MEM, REPLAY, PAR = "01_memory_accounting", "04_replay_break_even", "08_parallelism"
GPU_CLUSTER = "an anecdote from a 70B deployment on 8 GPUs: needs that cluster"
SETTING = "a recommended setting, not a statement with a truth value"
ONE_H100 = ("the lab's figure assumes one H100 holds the 70B model in fp16 (141 GB on an 80 GB card); split over "
            "8 H100s each still reads 17.6 GB of weights, about 5 ms at 3.35 TB/s, over 10x the claim, so the verdict "
            "stands but the lab's number is for a device that does not exist")
# The settings the claims are about.
EX70 = "a 70B model (80 layers, 8 KV heads of 128, d_model 8192), fp16"
A70_CLASS = ModelClass("10B-100B", "dense")
H100 = f"{EX70}, on one H100 SXM"
# How a notebook-04 or notebook-01 row's figure was obtained, where it is not a measurement here.
AT_PEAK = "an H100's 989 TFLOP/s and 3.35 TB/s at 100%, lower bounds on the time"
BY_COST = ("projected to an H100 by lab.replay.cost: the larger of the FLOPs at 50% of peak and the weights + prefix "
           "KV read at 3.35 TB/s")

# The article's mistakes behind its wrong verdicts (a claim's `cause`), in the order they first appear.
CAUSES = (
    Cause("kv-product", "§1.1", "It multiplies out 8 KV heads x 128 x 2 (K and V) x 2 bytes as 8 KB per token and "
                                "layer; the product is 4,096 B."),
    Cause("layers-left-out", "§1.1", "It sizes a 128K-token request's KV cache as 128K tokens x its per-layer 8 KB "
                                     "= 1 GB, leaving out the 80 layers it has just listed (80 x 128K x 4 KB is "
                                     "40 GiB)."),
    Cause("one-kv-head", "§2.2", "Its window and context KV sizes count 2 x d_head x 2 bytes per token and layer, "
                                 "one KV head's K and V (512 B), where the model of §1.1 has eight KV heads "
                                 "(4,096 B), so every KV size and read time built on them is 8x too small."),
    Cause("recompute-undercounted", "§2.2", "It prices recomputing a window of W tokens as their K/V projections and "
                                            "attention within the window, L x W x (2 x d_model x d_head + W x "
                                            "d_head), when recomputing them is the window's full forward pass: every "
                                            "layer's linears, reading all the model's weights, and attention over "
                                            "the whole prefix, which reads the prefix's KV anyway."),
    Cause("rounded-down", "§2.2", "It prints its own 80 x 64 x (2 x 8192 x 128 + 64 x 128) = 1.078e10 FLOPs as "
                                  "10.7e9 (107 亿) rather than 10.8e9."),
    Cause("ratio-slip", "§2.2", "It divides its 107 亿 FLOPs by 262 万 bytes as 4072; the quotient is 4084, and its "
                                "formula's own ratio, (2 x 8192 + 64) / 4, is 4112."),
    Cause("flops-over-peak", "§2.2", "It turns its 53.8 亿 (5.38e9) FLOPs into 53.8e9 when dividing by 989 TFLOP/s, "
                                     "so it prints 0.05 ms where the quotient is 0.0054 ms, ten times less, and its "
                                     "0.08-0.12 ms at 40-60% of peak inherits the factor."),
    Cause("pd-link-rate", "§3.2", "Its 'internal simulation' moves a 32K context's KV (10.7 GB at eight KV heads) "
                                  "from the prefill node to the decode node in 2.9 ms, 3.7 TB/s, faster than an "
                                  "H100's own memory and 74x a 400 Gb/s network link."),
    Cause("bigger-models", "§4.1", "It says bigger models show more of Replay's advantage, when the recompute's FLOPs "
                                   "per KV byte grow with the model's width (its own formula gives (2 d_model + W) / "
                                   "4), so on one GPU replay pays less the bigger the model."),
    Cause("tp-kv-split", "§5.2", "It says recomputing under tensor parallelism needs the complete K/V on one card, so "
                                 "every recompute moves K/V between cards; each card holds and recomputes its own "
                                 "heads' K/V from the layer input it already has."),
    Cause("attention-compute-bound", "§2.1", "It calls attention compute-bound, when a decode step's attention does "
                                              "about 8 FLOPs per KV byte under its 8-to-1 GQA, far below 295."),
    Cause("efficiency-for-small-gemm", "§2.2", "It prices a 32-token window's recompute at 40-60% of peak, when a "
                                               "32-row GEMM's roofline allows 32 / 295 = 10.8% on an H100."),
    Cause("window-covers-history", "§3.1", "It requires the replay window to cover the history attention depends "
                                           "on and concludes W >= 16, when covering it means W = M."),
    Cause("early-token-share", "§3.4", "It says caching one or two early tokens can take a large share of memory, "
                                       "when two tokens' KV in its 70B is 640 KiB, 8 millionths of an 80 GB card."),
    Cause("read-frequency", "§3.4", "It says recent tokens' KV is read far more often than early tokens', when dense "
                                    "attention reads every cached position once a decode step."),
    Cause("chunk-limit", "§4.1", "It caps a chunk at 64 tokens for its O(W^2) attention, when by its own formula that "
                                 "term is 0.39% of the cost at W = 64 and matches the linear one only at W = 16,384."),
    Cause("write-back-cost", "§4.2", "It leaves recomputed KV unwritten as too costly to write back, when a 64-token "
                                     "window's is 21 MB, 6 us at 3.35 TB/s, against recomputing it every step."),
    Cause("concurrency-gain", "§6", "It credits replay with 2-4x one card's concurrency, when replay frees only the "
                                    "KV it leaves uncached: a window of W of each request's M tokens, or at most the "
                                    "20-40% of each sequence its own settings leave uncached (1.25-1.67x)."),
)


def _kv_of_10_gb(tokens: float) -> float:
    """10 requests' KV at `tokens` each on its 70B in fp16, GB: what notebook 01's row computes (`lab.memory`)."""
    from lab.memory import ModelShape, kv_cache_bytes  # torch: imported only when the assumption is swept
    return 10 * kv_cache_bytes(ModelShape.preset("llama-3-70b"), int(tokens), dtype="fp16") / 1e9


def c(n: int, section: str, claim: str, article: str, **kw) -> Claim:
    return Claim(f"000-{n:02d}", "000", section, claim, article, **kw)


def _section_1() -> list[Claim]:
    return [
        c(1, "§1.1", "The KV cache of one token in one layer (8 KV heads x 128, fp16) is 8 KB.", "8 KB",
          link=Link(MEM, "KV per token per layer, 8 KV heads x 128", evidence=ARITHMETIC), rule=Number("8192"),
          cause="kv-product", about=EX70, scope="arithmetic"),
        c(2, "§1.1", "A 128K-token request's KV cache (80 layers) takes about 1 GB.", "about 1 GB",
          link=Link(MEM, "one 128K-token request, 80 layers", evidence=ARITHMETIC), rule=Number("1"),
          cause="layers-left-out", about=EX70, scope="arithmetic"),
        c(3, "§1.1", "H100 memory bandwidth is about 3.35 TB/s, A100's about 2 TB/s.", "3.35 TB/s, 2 TB/s",
          verdict=NOT_CHECKABLE, why="datasheet figures: nothing here measures an H100 or A100, and lab.machine.hardware "
                                     "carries the same datasheets' figures, so comparing them would check the lab's "
                                     "copy, not the article", about="H100 SXM and A100 datasheets", scope="arithmetic"),
        c(4, "§1.2", "A 70B model on 8 x 80 GB A100s with static KV reservation ran at about 20% GPU utilisation at "
                     "32K context.", "about 20%", verdict=NOT_CHECKABLE, why=GPU_CLUSTER,
          about="a 70B model on 8 x A100 80 GB, static KV reservation, 32K context", scope="gpu-speed"),
        c(5, "§1.2", "Going from 2K to 32K context raised per-token decode latency from 40 ms to 130 ms, the KV read "
                     "being too large (「单 token 生成延迟从 40ms 涨到了 130ms」).", "40 -> 130 ms",
          verdict=NOT_CHECKABLE,
          why=f"{GPU_CLUSTER}; a roofline (lab.machine.roofline) gives only a lower bound on a step's time, which a slower "
              "step cannot contradict: the deployment's batch, kernels and scheduler would decide it",
          about="a 70B model on 8 x A100 80 GB, dynamic KV allocation, decode at 2K and 32K context",
          scope="gpu-speed"),
    ]


def _section_2() -> list[Claim]:
    return [
        c(6, "§2.1", "The H100 SXM's ridge point is 989 TFLOP/s / 3.35 TB/s, about 295 FLOPs per byte.",
          "295 FLOPs/B", link=Link(REPLAY, "H100 ridge point", evidence=ARITHMETIC), rule=Number("295"),
          about="H100 SXM datasheet, fp16 dense", scope="arithmetic"),
        c(7, "§2.2", "Recomputing a 64-token window of a 70B model (its formula) costs about 10.7e9 FLOPs.",
          "107 亿 FLOPs",
          link=Link(REPLAY, "recompute FLOPs of a 64-token window (its formula)", evidence=ARITHMETIC),
          rule=Number("10.7e9"),
          why="80 x 64 x (2 x 8192 x 128 + 64 x 128) = 1.078e10, which rounds to 10.8e9", cause="rounded-down",
          about=EX70, scope="arithmetic"),
        c(8, "§2.2", "Those 10.7e9 FLOPs are all the work a 64-token window needs.", "10.7e9 FLOPs",
          link=Link(REPLAY, "and of all the work a 64-token window needs", evidence=ARITHMETIC),
          rule=Number("10.7e9", exact=False), cause="recompute-undercounted",
          about=f"{EX70}, a 64-token window after 32K", scope="behaviour"),
        c(9, "§2.2", "The KV of a 64-token window is about 2.6 MB.", "2.6 MB",
          link=Link(REPLAY, "bytes of a 64-token window's KV", evidence=ARITHMETIC), rule=Number("2.6e6"),
          cause="one-kv-head", about=EX70, scope="arithmetic"),
        c(33, "§2.2", "Its own product for that window's KV, 80 x 64 x 512 B, is 262 万 bytes (2.6 MB).",
          "262 万字节",
          link=Link(MEM, "its 2.6 MB, 80 x 64 x 512 B", evidence=ARITHMETIC), rule=Number("2.62e6"),
          why="its multiplication is right; its 512 B per token and layer is one KV head's (000-09)",
          about="its formula's inputs: 80 layers, 2 x 128 x 2 B", scope="arithmetic"),
        c(10, "§2.2", "Recompute FLOPs per KV byte of the window are about 4,072.", "4072 FLOPs/B",
          link=Link(REPLAY, "FLOPs per KV byte of the window", evidence=ARITHMETIC), rule=Number("4072"),
          cause="recompute-undercounted", about=f"{EX70}, a 64-token window after 32K", scope="behaviour"),
        c(34, "§2.2", "Its own ratio of those figures, 107 亿 / 262 万, is about 4,072 FLOPs per byte.",
          "≈ 4072 FLOPs/Byte",
          link=Link(MEM, "its FLOPs per KV byte of the 64-token window, 107", evidence=ARITHMETIC),
          rule=Number("4072"), cause="ratio-slip", about="its formula's inputs", scope="arithmetic"),
        c(35, "§2.2", "Since 4,072 FLOPs per KV byte exceed the H100's 295, recomputing the 64-token window in place "
                      "of its KV does not pay (「4072 远大于 295 的算术强度阈值…反而是不划算的」).",
          "does not pay",
          link=Link(MEM, "so recomputing the 64-token window in place of its KV does not pay", evidence=ARITHMETIC),
          rule=Bound("295"), why="the whole work of the window (every layer's linears, no prefix at all) is the "
                                 "least a recompute does, and its FLOPs per KV byte are far above the ridge point",
          about=H100, scope="behaviour"),
        c(11, "§2.2", "A decode step at 128K context reads about 5.4 GB of KV.", "5.4 GB",
          link=Link(REPLAY, "KV read per decode step at 128K", evidence=ARITHMETIC), rule=Number("5.4e9"),
          cause="one-kv-head", about=EX70, scope="arithmetic"),
        c(36, "§2.2", "Its own product for the 128K read, 80 x 131072 x 512 B, is about 5.4 GB.", "≈ 5.4 GB",
          link=Link(MEM, "its 128K read, 80 x 131072 x 512 B", evidence=ARITHMETIC), rule=Number("5.4e9"),
          why="its multiplication is right; its 512 B per token and layer is one KV head's (000-11)",
          about="its formula's inputs: 80 layers, 2 x 128 x 2 B", scope="arithmetic"),
        c(12, "§2.2", "Recomputing the last 32 tokens of a 70B model (its formula) costs about 5.38e9 FLOPs.",
          "53.8 亿 FLOPs",
          link=Link(MEM, "recompute FLOPs of the last 32 tokens (its formula", evidence=ARITHMETIC),
          rule=Number("5.38e9"), about=EX70, scope="arithmetic"),
    ]


def _section_2_times() -> list[Claim]:
    """§2.2's times and how they grow with the context, after its counts of FLOPs and bytes."""
    return [
        c(37, "§2.2", "Recomputing a recent window depends at most weakly on the context length M (§3.1 「与总上下文长度"
                      "弱相关」; §2.3 「重算窗口与历史长度无关」; §2.2's 「它是常数」 is said of one token's K/V projection, "
                      "which is constant).", "weakly related to M",
          link=Link(REPLAY, "(projected to its 70B): a recent window's recompute grows with the context M",
                    lab_pattern=r"d log t / d log M (?P<v>[\d.]+)", evidence=PROJECTED, setting=BY_COST),
          rule=Bound("0.5", above=False),
          assumptions=(Assumption("the largest growth d log t / d log M that still reads as 'weakly related' (弱相关)",
                                  0.5, "", "the lab's reading: nearer 0 than 1", 0.1, 0.5,
                                  "from a tenth to halfway to the whole context's read",
                                  rule=lambda x: Bound(repr(x), above=False)),),
          why="projected for the article's own 70B at 32K-128K, where the weights' read is most of a recompute; "
              "measured on this CPU's small models at 1K-8K, where attention over the prefix is a larger share, the "
              "growth is steeper (notebook 04's measured row: 0.76): the growth depends on the model and the context, "
              "and what the article gets wrong is the constant's size (000-08, 000-14), not its growth",
          about="the article's 70B at 32K-128K, a window of W tokens after M", scope="model-behaviour",
          model=A70_CLASS),
        c(13, "§2.2", "Recomputing the last 32 tokens (5.38e9 FLOPs) takes about 0.05 ms on an H100.", "0.05 ms",
          link=Link(REPLAY, "time to recompute 32 tokens with its 5.38e9 FLOPs", evidence=ARITHMETIC),
          rule=Number("0.05"), cause="flops-over-peak", about=H100, scope="arithmetic"),
        c(14, "§2.2", "The full work of recomputing 32 tokens after 128K of context takes about 0.05 ms.", "0.05 ms",
          link=Link(REPLAY, "with the full work of 32 tokens after 128K", evidence=PHYSICS_BOUND, setting=AT_PEAK),
          rule=Number("0.05", exact=False), cause="recompute-undercounted", about=f"{H100}, 128K context",
          scope="gpu-speed"),
        c(15, "§2.2", "Reading 5.4 GB of KV at 3.35 TB/s takes about 1.6 ms.", "1.6 ms",
          link=Link(REPLAY, "time to read 128K tokens' KV at 3.35 TB/s", evidence=ARITHMETIC), rule=Number("1.6"),
          about="its 5.4 GB at the H100's 3.35 TB/s", scope="arithmetic"),
        c(16, "§2.2", "Reading a real 128K context's KV (8 KV heads, 80 layers) takes about 1.6 ms.", "1.6 ms",
          link=Link(REPLAY, "the real 128K KV (8 KV heads), per card at TP=8", evidence=PHYSICS_BOUND,
                    setting=f"{AT_PEAK}; each of the 8 cards a 70B in fp16 needs reads its eighth"),
          rule=Number("1.6", exact=False),
          why="one H100 cannot hold the 70B in fp16 (141 GB) beside 43 GB of KV; at TP=8 each card holds one KV head "
              "and reads an eighth, 5.4 GB: the article's 1.6 ms is right per card, though it got there by counting "
              "one KV head (000-11)",
          about=f"{EX70}, over 8 H100 SXM (TP=8), 128K context", scope="gpu-speed"),
        c(17, "§2.2", "At 40-60% of peak, recomputing the 32 tokens (its 5.38e9 FLOPs) takes 0.08-0.12 ms.",
          "0.08-0.12 ms", link=Link(MEM, "its 5.38e9 FLOPs at 40-60%", evidence=ARITHMETIC),
          rule=Range("0.08", "0.12"), cause="flops-over-peak", about=H100, scope="arithmetic"),
        c(18, "§2.2", "Replaying a recent window spares reading the prefix's KV, an order-of-magnitude saving at long "
                      "context.", "1.6 ms vs 0.05 ms",
          link=Link(REPLAY, "replaying a window spares reading", evidence=ARGUMENT),
          cause="recompute-undercounted", about=f"{EX70}, 128K context", scope="behaviour"),
    ]


def _section_3() -> list[Claim]:
    return [
        c(19, "§3.1", "Recomputing a recent window beats reading its KV on long contexts (「开销1 > 开销2 时触发 "
                      "Replay」; §2.2 「后者的优势是数量级的」).", "by an order of magnitude",
          link=Link(REPLAY, "recomputing a recent window beats reading its KV",
                    lab_pattern=r"than host memory in (?P<v>\d+) of"), rule=Bound("0"),
          why="a time on a GPU: this CPU's engine against a copy within its host memory cannot stand in for an "
              "H100's compute against its HBM; notebook 04 at its gpu preset (the engine's recompute of W tokens "
              "after up to 32K against reading the window's KV from device memory, on an H100 or H200) would "
              "decide it",
          about=f"{EX70}, decode at 32K-128K context on an H100, KV in HBM", scope="gpu-speed"),
        c(20, "§3.1", "A replay window smaller than 16 tokens does not work; windows are 16-64 tokens.", "W >= 16",
          verdict=NOT_CHECKABLE, why=SETTING, about="a replay controller (its §4.2 sketch)", scope="behaviour"),
        c(38, "§3.2", "In PD disaggregation, a prefill node that has computed 10 requests' KV must move tens of GB "
                      "(「10 个请求的 KV Cache，要把这几十 GB 的数据传输」).", "几十 GB",
          link=Link(MEM, "the KV of 10 requests (8 KV heads, fp16)", evidence=ARITHMETIC), rule=Range("10", "99"),
          assumptions=(Assumption("the context of each of the 10 requests", 32768, "tokens",
                                  "notebook 01's 32K, the context of the article's PD example (§3.2); the sentence "
                                  "itself states none", 8192, 131072,
                                  "from the 8K requests its §1 starts from to its 128K example",
                                  figure=_kv_of_10_gb),),
          about=f"{EX70}, 10 requests at 32K-128K context", scope="arithmetic"),
        c(21, "§3.2", "In PD disaggregation, pulling a 32K context's KV from the prefill node takes about 2.9 ms.",
          "2.9 ms", link=Link(REPLAY, "PD: pull the 32K context's KV", evidence=PHYSICS_BOUND,
                              setting="a 400 Gb/s link at its line rate, a lower bound on the time"),
          rule=Number("2.9", exact=False), cause="pd-link-rate",
          about=f"{EX70}, 32K context, prefill and decode nodes over a network link", scope="gpu-speed"),
        c(22, "§3.2", "Recomputing the last 64 tokens of a 32K context on the decode node takes about 0.4 ms.",
          "0.4 ms", link=Link(REPLAY, "PD: recompute the last 64 tokens of a 32K context", evidence=PROJECTED,
                              setting=BY_COST),
          rule=Number("0.4", exact=False), why=ONE_H100, cause="recompute-undercounted",
          about=f"{EX70}, 32K context, an H100 decode node", scope="gpu-speed"),
        c(23, "§3.2", "So the decode node should recompute the last 64 tokens rather than receive their KV.",
          "recompute",
          link=Link(REPLAY, "PD: recompute the last 64 tokens rather than receive", evidence=PROJECTED,
                    lab_pattern=r"receive / recompute (?P<v>[\d.]+)",
                    setting=f"{BY_COST}; the KV over 400 Gb/s at line rate"),
          rule=Bound("1"), why=ONE_H100, cause="recompute-undercounted",
          about=f"{EX70}, 32K context, an H100 decode node, a 400 Gb/s link", scope="gpu-speed"),
        c(24, "§3.3", "Speculative drafts are 4-8 tokens, and verifying them is a short parallel prefill.",
          "4-8 tokens", verdict=NOT_CHECKABLE,
          why="a description of speculative decoding, not a claim with a number to check (seeds/003 section 5's "
              "claims are checked by notebook 05)", about="speculative decoding, any model", scope="behaviour"),
    ]


def _section_4_to_6() -> list[Claim]:
    return [
        c(25, "§4.1", "A 32-token window of a 70B model at 32K context costs about 1/1000 of the context's FLOPs.",
          "1/1000", link=Link(MEM, "a 32-token window's recompute FLOPs over a 32K", evidence=ARITHMETIC),
          rule=Number("1e-3", exact=False),
          why="at its printed precision, one significant figure: the window's attention over the prefix makes it "
              "more than the token counts' 32 / 32768", about=f"{EX70}, 32K context", scope="arithmetic"),
        c(26, "§4.1", "Trigger replay when free memory is under 20% or bandwidth utilisation over 80%.", "20%, 80%",
          verdict=NOT_CHECKABLE, why=SETTING, about="a replay controller", scope="behaviour"),
        c(39, "§4.1", "Bigger models show more of Replay's advantage (its table: 「7B~70B，越大越能体现 Replay 优势」).",
          "bigger is better",
          link=Link(MEM, "bigger models show Replay's advantage more", evidence=ARITHMETIC),
          rule=Bound("1", above=False), cause="bigger-models",
          about="Llama-3-8B and Llama-3-70B, fp16, a 32-token window at 32K on one GPU", scope="behaviour"),
        c(27, "§4.1", "Replay pays only from about 32K of context, and the shorter the context the less it pays "
                      "(its table: 「≥32K，上下文越短，Replay越不划算」).", ">= 32K",
          link=Link(REPLAY, "(projected to its 70B): replay pays more the longer the context",
                    lab_pattern=r"own KV (?P<v>-?[\d.]+)", evidence=PROJECTED, setting=BY_COST),
          rule=Bound("0", above=False),
          readings=(Reading("against the window's own KV, the bytes replay saves", r"own KV (?P<v>-?[\d.]+)"),
                    Reading("against the whole context's KV read, as the article's §2.2 compares",
                            r"KV read (?P<v>-?[\d.]+)")),
          why="how recompute / load grows with the prefix, d log / d log M, below 0 if replay paid more the longer the "
              "context: against the window's own KV (what replay saves) the recompute's growth; against the whole "
              "context's read (what the article compares, but replay does not save: 000-18) one power of M less",
          about="the article's 70B (its table: 7B-70B), a replay window after 32K or more", scope="model-behaviour",
          model=A70_CLASS),
        c(28, "§5.1", "With replay on, TTFT rose from 700 ms to 1.2 s at 33K context.", "0.7 -> 1.2 s",
          verdict=NOT_CHECKABLE, why=GPU_CLUSTER, about="a 70B deployment with replay on, 33K context",
          scope="gpu-speed"),
        c(29, "§5.2", "With 8-way TP on a 70B model and Replay on, all-reduce takes up to 40% of a decode step "
                      "(「Replay 开启后，每一步生成都伴随大量 AllReduce，通信占比高达 40%」).", "40%",
          link=Link(PAR, "with Replay on", evidence=PROJECTED,
                    setting="projected to 8x H100 (NVLink to PCIe) by the roofline step and alpha-beta collectives"),
          rule=Number("40", exact=False),
          why="the 40% is with Replay on: notebook 08 projects a step that decodes one token and replays a 64-token "
              "window of the same sequence (§2.2's window), not a plain TP decode step",
          about="a 70B model, 8-way tensor parallelism, Replay on, decode", scope="gpu-speed"),
        c(40, "§5.2", "Under tensor parallelism a recompute needs the complete K/V on the current card, so every "
                      "recompute moves K/V between cards (「重算需要在当前卡上持有完整的 K/V 矩阵，而张量并行下 K/V "
                      "可能被拆分到不同卡」).", "cross-card K/V", verdict=BY_ARGUMENT,
          why="under tensor parallelism each card holds whole attention heads and their KV heads (8 KV heads on 8 "
              "cards: one each) and computes their attention itself; recomputing a window's K and V on a card needs "
              "the layer's input, which every card holds after the previous all-reduce, and its own heads' K and V "
              "projections, so no K/V crosses cards. What a replayed window adds is the forward's usual two "
              "all-reduces a layer carrying W more tokens' activations; its remedy, 「把 K/V 重新计算限定在本地卡持有"
              "的头范围内」, is what tensor parallelism already does",
          cause="tp-kv-split", about="a 70B model, 8-way tensor parallelism (Megatron-style head split)",
          scope="behaviour"),
        c(30, "§5.4", "Set the window to 1/8-1/4 of the KV segment size.", "1/8-1/4",
          verdict=NOT_CHECKABLE, why=SETTING, about="a replay controller", scope="behaviour"),
        c(31, "§5.5", "Self-diagnosis on its 128K example: replay pays (read > 1.2 x recompute at 50% efficiency).",
          "yes (1.6 ms vs 0.08-0.12 ms)", link=Link(REPLAY, "self-diagnosis on its 128K example", evidence=ARITHMETIC,
                                                    lab_pattern=r"read / recompute (?P<v>[\d.]+)"),
          rule=Bound("1.2"), cause="recompute-undercounted", about=f"{H100}, 128K context, its rule at 50% efficiency",
          scope="behaviour"),
        c(32, "§6 (closing)", "Replay let one card serve 16-32 requests where it served 8.", "8 -> 16-32",
          link=Link(MEM, "one card's concurrency with replay, from 8", evidence=ARITHMETIC), rule=Range("16", "32"),
          why="the lab's figure is the most its own settings free (40% of each sequence uncached), its interval "
              "down to a 64-token window of a 32K context", cause="concurrency-gain",
          about=f"{EX70}, one card whose concurrency is bound by KV memory, 32K context", scope="behaviour"),
    ]


def _unrowed() -> list[Claim]:
    """Claims a skeptic's re-read of the article found without a row (issue 48 item 5), section by section; the
    quotes are the article's words (docs/audit/claims_skeptic_reading.md lists what else was weighed)."""
    return [
        c(41, "§1.1", "At 16 or 32 concurrent requests of 128K, memory blows up at once (「并发拉到 16 路、32 路显存瞬间就"
                      "爆了」).", "blows up at 16-32",
          link=Link(MEM, "16 concurrent 128K requests' KV", evidence=ARITHMETIC), rule=Bound("1"),
          about=f"{EX70}, 16 requests of 128K on an 8 x 80 GB node", scope="arithmetic"),
        c(42, "§2.1", "Attention itself is compute-bound (「而 Attention 计算本身是计算密集型」).", "compute-bound",
          verdict=BY_ARGUMENT, cause="attention-compute-bound",
          why="a decode step's attention reads each cached K and V element once and does 2 FLOPs per query head with "
              "it: under the 70B's 8 query heads per KV head that is 16 FLOPs per 4 bytes of K and V, about 8 FLOPs "
              "per byte, far below the H100's 295; attention is compute-bound only for a block of queries of more "
              "than about 37 tokens (a prefill or a long replay window), not for the decode the article is about",
          about=f"{H100}, decode attention", scope="behaviour"),
        c(43, "§2.2", "Real matrix multiplications reach 40-60% of peak (「实际矩阵运算达不到峰值算力通常只有 40%~60%」), "
                      "applied to a 32-token window.", "40-60%", verdict=BY_ARGUMENT, cause="efficiency-for-small-gemm",
          why="a GEMM of W rows against 16-bit weights does 2 W N K FLOPs for the 2 N K bytes of weights it reads, W "
              "FLOPs per byte; at the 32-token window it is applied to (000-17) the H100's roofline allows 32 / 295 = "
              "10.8% of peak, so 40-60% is out of reach for it",
          about=f"{H100}, a 32-row GEMM against fp16 weights", scope="behaviour"),
        c(44, "§2.2", "Attention of one query over M tokens is O(M x d_head) (「这部分 FLOPs 是 O(M × d_head)」), yet a "
                      "recomputed window costs a constant plus W x d_head (「成本就是一个常数项 C 一个小窗口 W × d_head」).",
          "C + W x d_head", verdict=BY_ARGUMENT, cause="recompute-undercounted",
          why="the two sentences contradict each other: each of the W recomputed queries attends over the M + W keys "
              "before it, so the window's attention is O(W M d_head), which grows with M, not O(W d_head)",
          about="any decoder-only model, a window of W tokens after M", scope="behaviour"),
        c(45, "§3.1", "The replay window must cover the whole history attention depends on, so W is at least 16 "
                      "(「Replay 窗口的下限要能覆盖整个 Attention 所依赖的历史范围。W 通常不会小于 16。」).", "W >= 16",
          verdict=BY_ARGUMENT, cause="window-covers-history",
          why="a window covering the whole history attention depends on is W = M, the whole context; 16 tokens cover "
              "none of a 32K-128K history, and the sentence before concedes that the history's K/V must still be read "
              "(「这部分还是得读」), which is 000-18's argument in the article's words",
          about="a replay window after a 32K-128K context", scope="behaviour"),
        c(46, "§3.2", "Network bandwidth is scarcer than GPU memory bandwidth in many clusters "
                      "(「通信带宽在很多机群里比显存带宽更稀缺」).", "scarcer",
          link=Link(MEM, "an H100's memory bandwidth over a 400 Gb/s link's", evidence=ARITHMETIC), rule=Bound("1"),
          about="an H100's HBM against a 400 Gb/s network link", scope="arithmetic"),
        c(47, "§3.4", "Caching even one or two early tokens can take a large share of memory "
                      "(「即使只缓存一两个 token显存占比也可能不小」).", "not small", verdict=BY_ARGUMENT,
          cause="early-token-share",
          why="one token's KV in its 70B is 80 layers x 4,096 B = 320 KiB; two are 640 KiB, 8 millionths of an 80 GB "
              "card",
          about=f"{EX70}, one or two cached tokens", scope="arithmetic"),
        c(48, "§3.4", "The recent tokens' cache is read far more often than the early tokens' "
                      "(「晚段几十个 token缓存占用小但读取频率极高」).", "read more often", verdict=BY_ARGUMENT,
          cause="read-frequency",
          why="under dense attention every decode step reads every cached position once, early or late: the "
              "frequency is the same for all of them",
          about="dense attention in decode, any model", scope="behaviour"),
        c(49, "§4.1", "A chunk usually cannot exceed 64 tokens, for the window's O(W^2) attention "
                      "(「所以 chunk 通常不能超过 64」).", "64",
          link=Link(MEM, "the chunk W at which its formula's W^2 term matches", evidence=ARITHMETIC),
          rule=Number("64", exact=False), cause="chunk-limit",
          about="its §2.2 formula on its 70B (d_model 8192)", scope="arithmetic"),
        c(50, "§4.2", "Most implementations do not write recomputed KV back, since writing back costs bandwidth and "
                      "memory (「大多数工程实现是不写回写回又占用带宽和显存」).", "costs too much", verdict=BY_ARGUMENT,
          cause="write-back-cost",
          why="writing a 64-token window's KV back is 64 x 327,680 B = 21 MB, about 6 us at 3.35 TB/s, against "
              "recomputing the same window at every step (about 45 ms on one H100 by notebook 04's projection, "
              "000-22); 'most implementations' is a census the lab cannot take",
          about=f"{H100}, a 64-token replay window", scope="arithmetic"),
        c(51, "§5.3", "With replay, GPU utilisation fell under 30% (「但 GPU 利用率掉到 30% 以下」).", "< 30%",
          verdict=NOT_CHECKABLE, why=GPU_CLUSTER, about="a 70B deployment with replay on", scope="gpu-speed"),
    ]


CLAIMS = [*_section_1(), *_section_2(), *_section_2_times(), *_section_3(), *_section_4_to_6(), *_unrowed()]
