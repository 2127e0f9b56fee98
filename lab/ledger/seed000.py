"""Every numeric or testable claim of seeds/000 (KV cache versus local recomputation, "Replay"), by section.

Most are checked by notebook 04 (the replay break-even, `lab.studies.replay_break_even.claims_table`) and
notebook 01 (memory accounting); the all-reduce share by notebook 08. The article's numbers are written in the
unit of the lab's figure and to the article's printed precision (its "2.6 MB" is "2.6e6" bytes).

Its wrong verdicts come from far fewer mistakes (`CAUSES`, which CLAIMS.md counts), most of them from two, each
repeated through §2.2's worked example and what is built on it: a KV size of one KV head where the model has eight,
and a recompute cost that leaves out the window's forward pass through the model and its attention over the prefix.
"""

from __future__ import annotations

from lab.ledger.record import Cause, Claim, Link
from lab.ledger.rules import NOT_CHECKABLE, NOT_YET, Number

MEM, REPLAY, PAR = "01_memory_accounting", "04_replay_break_even", "08_parallelism"
GPU_CLUSTER = "an anecdote from a 70B deployment on 8 GPUs: needs that cluster"
SETTING = "a recommended setting, not a statement with a truth value"
# The lab's 45 ms puts a 70B fp16 model's weights (141 GB) on one 80 GB H100, which cannot hold them.
ONE_H100 = ("the lab's figure assumes one H100 holds the 70B model in fp16 (141 GB on an 80 GB card); split over "
            "8 H100s each still reads 17.6 GB of weights, about 5 ms at 3.35 TB/s, over 10x the claim, so the verdict "
            "stands but the lab's number is for a device that does not exist")

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
    Cause("flops-over-peak", "§2.2", "It turns its 53.8 亿 (5.38e9) FLOPs into 53.8e9 when dividing by 989 TFLOP/s, "
                                     "so it prints 0.05 ms where the quotient is 0.0054 ms, ten times less."),
    Cause("pd-link-rate", "§3.2", "Its 'internal simulation' moves a 32K context's KV (10.7 GB at eight KV heads) "
                                  "from the prefill node to the decode node in 2.9 ms, 3.7 TB/s, faster than an "
                                  "H100's own memory and 74x a 400 Gb/s network link."),
)


def c(n: int, section: str, claim: str, article: str, **kw) -> Claim:
    return Claim(f"000-{n:02d}", "000", section, claim, article, **kw)


CLAIMS = [
    c(1, "§1.1", "The KV cache of one token in one layer (8 KV heads x 128, fp16) is 8 KB.", "8 KB",
      link=Link(MEM, "KV per token per layer, 8 KV heads x 128"), rule=Number("8192"), cause="kv-product"),
    c(2, "§1.1", "A 128K-token request's KV cache (80 layers) takes about 1 GB.", "about 1 GB",
      link=Link(MEM, "one 128K-token request, 80 layers"), rule=Number("1"), cause="layers-left-out"),
    c(3, "§1.1", "H100 memory bandwidth is about 3.35 TB/s, A100's about 2 TB/s.", "3.35 TB/s, 2 TB/s",
      verdict=NOT_CHECKABLE, why="datasheet figures: nothing here measures an H100 or A100 (lab.hardware carries "
                                 "them as given)"),
    c(4, "§1.2", "A 70B model on 8 x 80 GB A100s with static KV reservation ran at about 20% GPU utilisation at "
                 "32K context.", "about 20%", verdict=NOT_CHECKABLE, why=GPU_CLUSTER),
    c(5, "§1.2", "Going from 2K to 32K context raised per-token decode latency from 40 ms to 130 ms.", "40 -> 130 ms",
      verdict=NOT_YET, why="a roofline decode step of a 70B on A100 at 2K and at 32K context (lab.roofline) would "
                           "say whether the KV read explains the rise; measuring it needs 8 A100s",
      decider="lab.roofline's decode step of a 70B on an A100 at 2K and at 32K context: does the KV read explain 40"
              " -> 130 ms?"),
    c(6, "§2.1", "The H100 SXM's ridge point is 989 TFLOP/s / 3.35 TB/s, about 295 FLOPs per byte.", "295 FLOPs/B",
      link=Link(REPLAY, "H100 ridge point"), rule=Number("295")),
    c(7, "§2.2", "Recomputing a 64-token window of a 70B model (its formula) costs about 10.7e9 FLOPs.",
      "107 亿 FLOPs",
      link=Link(REPLAY, "recompute FLOPs of a 64-token window (its formula)"), rule=Number("10.7e9"),
      why="80 x 64 x (2 x 8192 x 128 + 64 x 128) = 1.078e10, which rounds to 10.8e9", cause="rounded-down"),
    c(8, "§2.2", "Those 10.7e9 FLOPs are all the work a 64-token window needs.", "10.7e9 FLOPs",
      link=Link(REPLAY, "and of all the work a 64-token window needs"), rule=Number("10.7e9", exact=False),
      cause="recompute-undercounted"),
    c(9, "§2.2", "The KV of a 64-token window is about 2.6 MB.", "2.6 MB",
      link=Link(REPLAY, "bytes of a 64-token window's KV"), rule=Number("2.6e6"), cause="one-kv-head"),
    c(10, "§2.2", "Recompute FLOPs per KV byte of the window are about 4,072.", "4072 FLOPs/B",
      link=Link(REPLAY, "FLOPs per KV byte of the window"), rule=Number("4072"), cause="recompute-undercounted"),
    c(11, "§2.2", "A decode step at 128K context reads about 5.4 GB of KV.", "5.4 GB",
      link=Link(REPLAY, "KV read per decode step at 128K"), rule=Number("5.4e9"), cause="one-kv-head"),
    c(12, "§2.2", "Recomputing the last 32 tokens of a 70B model (its formula) costs about 5.38e9 FLOPs.",
      "53.8 亿 FLOPs", verdict=NOT_YET,
      why="its formula gives 80 x 32 x (2 x 8192 x 128 + 32 x 128) = 5.379e9; notebook 04 takes the figure as an "
          "input and has no row for it",
      decider="arithmetic: a notebook 04 row computing 80 x 32 x (2 x 8192 x 128 + 32 x 128) against 5.38e9"),
    c(13, "§2.2", "Recomputing the last 32 tokens (5.38e9 FLOPs) takes about 0.05 ms on an H100.", "0.05 ms",
      link=Link(REPLAY, "time to recompute 32 tokens with its 5.38e9 FLOPs"), rule=Number("0.05"),
      cause="flops-over-peak"),
    c(14, "§2.2", "The full work of recomputing 32 tokens after 128K of context takes about 0.05 ms.", "0.05 ms",
      link=Link(REPLAY, "with the full work of 32 tokens after 128K"), rule=Number("0.05", exact=False),
      cause="recompute-undercounted"),
    c(15, "§2.2", "Reading 5.4 GB of KV at 3.35 TB/s takes about 1.6 ms.", "1.6 ms",
      link=Link(REPLAY, "time to read 128K tokens' KV at 3.35 TB/s"), rule=Number("1.6")),
    c(16, "§2.2", "Reading a real 128K context's KV (8 KV heads, 80 layers) takes about 1.6 ms.", "1.6 ms",
      link=Link(REPLAY, "the real 128K KV (8 KV heads)"), rule=Number("1.6", exact=False), cause="one-kv-head"),
    c(17, "§2.2", "At 40-60% of peak, recomputing the 32 tokens takes 0.08-0.12 ms.", "0.08-0.12 ms",
      verdict=NOT_YET, why="no row recomputes it; notebook 04's 0.0054 ms at peak divided by 0.4-0.6 would "
                           "(0.009-0.014 ms, so the article's range would be 10x high)",
      decider="arithmetic: a notebook 04 row dividing its 0.0054 ms at peak by 0.4-0.6, against 0.08-0.12 ms"),
    c(18, "§2.2", "Replaying a recent window spares reading the prefix's KV, an order-of-magnitude saving at long "
                  "context.", "1.6 ms vs 0.05 ms", link=Link(REPLAY, "replaying a window spares reading"),
      cause="recompute-undercounted"),
    c(19, "§3.1", "Recomputing a recent window beats reading its KV on long contexts.", "by an order of magnitude",
      link=Link(REPLAY, "recomputing a recent window beats reading its KV"), cause="recompute-undercounted"),
    c(20, "§3.1", "A replay window smaller than 16 tokens does not work; windows are 16-64 tokens.", "W >= 16",
      verdict=NOT_CHECKABLE, why=SETTING),
    c(21, "§3.2", "In PD disaggregation, pulling a 32K context's KV from the prefill node takes about 2.9 ms.",
      "2.9 ms", link=Link(REPLAY, "PD: pull the 32K context's KV"), rule=Number("2.9", exact=False),
      cause="pd-link-rate"),
    c(22, "§3.2", "Recomputing the last 64 tokens of a 32K context on the decode node takes about 0.4 ms.", "0.4 ms",
      link=Link(REPLAY, "PD: recompute the last 64 tokens of a 32K context"), rule=Number("0.4", exact=False),
      why=ONE_H100, cause="recompute-undercounted"),
    c(23, "§3.2", "So the decode node should recompute the last 64 tokens rather than receive their KV.", "recompute",
      link=Link(REPLAY, "PD: recompute the last 64 tokens rather than receive"), why=ONE_H100,
      cause="recompute-undercounted"),
    c(24, "§3.3", "Speculative drafts are 4-8 tokens, and verifying them is a short parallel prefill.", "4-8 tokens",
      verdict=NOT_CHECKABLE, why="a description of speculative decoding, not a claim with a number to check "
                                 "(seeds/003 section 5's claims are checked by notebook 05)"),
    c(25, "§4.1", "A 32-token window of a 70B model at 32K context costs about 1/1000 of the context's FLOPs.",
      "1/1000", verdict=NOT_YET, why="arithmetic: lab.roofline's prefill FLOPs of 32 tokens against 32K tokens "
                                     "(with attention) would check it; no notebook row computes it",
      decider="arithmetic: lab.roofline's prefill FLOPs of 32 tokens over those of 32K tokens (attention included),"
              " against 1/1000"),
    c(26, "§4.1", "Trigger replay when free memory is under 20% or bandwidth utilisation over 80%.", "20%, 80%",
      verdict=NOT_CHECKABLE, why=SETTING),
    c(27, "§4.1", "Replay pays only from about 32K of context, for models of 7B-70B.", ">= 32K",
      verdict=NOT_YET, why="notebook 04 finds recompute faster than a host-memory or disk read in 0 of 48 "
                           "measured points on this machine, but has no row for the 32K threshold",
      decider="a notebook 04 row setting its measured break-even context (recompute against host memory and disk) "
              "against 32K"),
    c(28, "§5.1", "With replay on, TTFT rose from 700 ms to 1.2 s at 33K context.", "0.7 -> 1.2 s",
      verdict=NOT_CHECKABLE, why=GPU_CLUSTER),
    c(29, "§5.2", "With 8-way TP on a 70B model, all-reduce takes up to 40% of a decode step.", "40%",
      link=Link(PAR, "all-reduce takes up to 40%",
                lab_pattern=r"(?P<lo>(?P<v>\d+))% on NVLink.*?(?P<hi>\d+)% on PCIe"),
      rule=Number("40", exact=False),
      why="the lab's projection spans 32% (NVLink, an assumed 15 us all-reduce latency) to 49% (PCIe): 40% is "
          "inside the span its unknown latency allows, so the claim is neither confirmed nor refuted"),
    c(30, "§5.4", "Set the window to 1/8-1/4 of the KV segment size.", "1/8-1/4",
      verdict=NOT_CHECKABLE, why=SETTING),
    c(31, "§5.5", "Self-diagnosis on its 128K example: replay pays (read > 1.2 x recompute at 50% efficiency).",
      "yes (1.6 ms vs 0.08-0.12 ms)", link=Link(REPLAY, "self-diagnosis on its 128K example"),
      cause="recompute-undercounted"),
    c(32, "§6 (closing)", "Replay let one card serve 16-32 requests where it served 8.", "8 -> 16-32",
      verdict=NOT_YET, why="lab.memory's concurrency at a context with and without a window's KV would bound it "
                           "(a window of W tokens frees only W tokens per request); the measured figure needs the "
                           "deployment",
      decider="lab.memory's concurrency on one card at the article's context with and without a window's KV, "
              "against 8 -> 16-32"),
]
