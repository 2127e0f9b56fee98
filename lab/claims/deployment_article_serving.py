"""Seeds/003's claims of §4-§7 (kernels and parallelism, speculative and constrained decoding, benchmarking, the
starting configuration and the troubleshooting notes); §1-§3 and the article's mistakes (`CAUSES`) are in `deployment_article`.
"""

from __future__ import annotations

import re

from lab.claims.record import Assumption, Link, Part, Reading
from lab.claims.rules import (ARITHMETIC, BY_ARGUMENT, NOT_CHECKABLE, NOT_YET, PROJECTED, Bound, LabNumber, Number, Range,
                              run_cell)
from lab.claims.deployment_article import A70_CLASS, PAR, SERVE, SETTING, SPEC, STRUCT, arith, c
from lab.speculative.theory import break_even

SPEC_GPU = "speculative decoding on a GPU serving a large target at small batch"
DRAFT = "a small draft model (「小模型」) against its target on a GPU"
MASK = "a GPU serving a 100k+ vocabulary at small batch, the mask computed in full every step (before precompiling)"
GRAMMAR = "constrained decoding of JSON (a grammar mask each step), any model and device"
PCIE = "projected to 8 H100s over PCIe Gen5 (no NVLink) by the roofline's step and alpha-beta collectives"
MASK_H100 = ("projected to an H100 SXM by the roofline's decode step, the masks' host time measured here scaled by "
             "vocabulary")
SERVING = "an online serving stack on GPUs, the article's load"
CONFIG = "the article's starting configuration for long-context QA (vLLM-style)"
NAIVE = r"^(?P<v>[\d.]+)%"  # notebook 07's "naive% [precompiled, naive]": the two ends of a range between methods
# "Computing the full mask every step" read as each way of computing it the lab has: the two ends of a range between
# implementations, not an interval around one figure; judged apart, decided only where they agree.
MASK_WAYS = (Reading("the full mask computed every step by trying each token against the grammar (the lab's naive "
                     "mask, the slow end)", NAIVE),
             Reading("the full mask filled every step from xgrammar's precompiled table (the fast end, the article's "
                     "own remedy)", r"\[(?P<v>[\d.]+),"))
HARDLY = Assumption("the speedup below which speculation is 'hardly worth it' (基本没什么意思)", 1.1, "x",
                    "the notebooks' reading: the article gives no number", 1.05, 1.5,
                    "from a few percent to the 1.5x that benchmarks of speculative decoding call marginal",
                    figure=lambda t: break_even(0.05, 4, floor=t))
ONE_STEP = Assumption("the verification cost, in plain steps, that still 'costs one target step'", 1.1, "x",
                      "the notebooks' reading", 1.05, 1.25, "within five to twenty-five percent of one step",
                      rule=lambda x: Bound(repr(x), above=False))


def rows_outside(cell: str) -> LabNumber | None:
    """Notebook 05's tally of its rows against the article's prediction ("the article's prediction: not
    distinguishable at 12, within 10% at 6"; a count it does not print is 0), as the rows outside 10% with those
    not distinguishable from 10% as its interval: [outside, outside + not distinguishable]."""
    m = re.search(r"the article's prediction: ([^;]*)", cell)
    if m is None:
        return None
    count = {word: int(n) for word, n in re.findall(r"(not distinguishable|within 10%|outside 10%) at (\d+)",
                                                     m.group(1))}
    out, open_ = count.get("outside 10%", 0), count.get("not distinguishable", 0)
    return LabNumber(str(out), str(out), str(out + open_))


def by_task(drafter: str) -> tuple[Part, ...]:
    """The parts of "code, rewriting, translation and summarization reach a >= 0.7; open-ended writing falls under
    0.5" for one drafter's row: each category's acceptance and its interval over prompts."""
    def part(category: str, rule) -> Part:
        return Part(category, rf"{category} (?P<v>[\d.]+) \[(?P<lo>[\d.]+), (?P<hi>[\d.]+)\]", rule)
    return (*(part(cat, Range("0.7", None)) for cat in ("code", "rewriting", "translation", "summarization")),
            part("open-ended", Range(None, "0.5")))


KERNELS = [
    c(31, "§4.1", "Tiled attention with an online softmax keeps the scores on chip, so attention memory grows linearly "
                  "rather than quadratically with context.", "quadratic -> linear", verdict=NOT_YET,
      why="the lab's Triton paged attention kernels (lab/kernels/paged_attention.py) are of that kind and their traffic "
          "is checked against formulas, but no notebook row measures memory against context",
      decider="peak attention memory of the lab's tiled (Triton) attention against an eager one, swept over the "
              "context length",
      about="FlashAttention-style kernels against materialized scores, any device", scope="behaviour"),
    c(74, "§4.1", "With long context the materialized attention matrix runs to hundreds of MB (「几百 MB」).",
      "hundreds of MB", verdict=NOT_CHECKABLE,
      why="a size given without the context length, heads or batch it is for: any of them moves it by orders of "
          "magnitude, so no input of the article's decides it",
      about="eager attention, the context, heads and batch unstated", scope="arithmetic"),
    c(32, "§4.2", "Kernel launches take about 20% of decode time; CUDA graphs remove it.", "about 20%",
      verdict=NOT_CHECKABLE, why="needs a GPU (CUDA graphs): decode with and without CUDA graphs, launches timed",
      about="decode on a GPU, hundreds of kernel launches a step, CUDA graphs", scope="gpu-speed"),
    c(33, "§4.3", "TP without fast links: communication eats the gain, even slower than one card "
                  "(「没有高速互联硬上张量并行…甚至比单卡还慢」).", "slower",
      link=Link(PAR, "TP without fast links", lab_pattern=r"^(?P<v>[\d.]+)x one card", evidence=PROJECTED,
                setting=PCIE),
      rule=Bound("1", above=False),
      assumptions=(Assumption("the latency of one all-reduce across the 8 cards (alpha)", 30, "us",
                              "notebook 08's PCIe Gen5 link: the article names no link, only 'no fast interconnect'",
                              10, 300, "from NCCL over PCIe with peer-to-peer access to a TCP network between nodes",
                              flip_pattern=r"once an all-reduce takes over (?P<v>[\d.]+) us"),),
      why="a measurement of TP=8 against one card on GPUs joined by PCIe only would decide it beyond the projection",
      about="tensor parallelism on GPUs joined by PCIe only (no NVLink), a 70B model, decode", scope="gpu-speed"),
    c(34, "§4.3", "In PP, micro-batches at least 4x the stages fill most of the bubble.", "m >= 4p",
      link=Link(PAR, "PP: micro-batches at least 4x", lab_pattern=r"the formula (?P<v>[\d.]+)%", evidence=ARITHMETIC),
      rule=Bound("25", above=False),
      assumptions=(Assumption("the idle share 'most of the bubble filled' leaves, at p = 2 (half the 50% idle at m = 1 "
                              "or less)", 25, "%", "the lab's reading of 填掉大半", 12.5, 25,
                              "from 'more than half filled' to 'three quarters filled'",
                              rule=lambda x: Bound(repr(x), above=False)),),
      why="judged on the formula (p - 1) / (m + p - 1) at m = 4p, which the run's measured wait matches (one run, "
          "a time: it stands beside the formula, not in its place)",
      about="pipeline parallelism over p stages, m micro-batches, any device", scope="behaviour"),
    c(35, "§4.3", "TP inside a node of at most 8 cards; PP across nodes.", "TP <= 8",
      link=Link(PAR, "TP inside a node of at most 8 cards"), about="multi-node GPU clusters", scope="gpu-speed"),
]

SPECULATIVE = [
    c(36, "§5.1", "A small draft model costs c = 0.03-0.1 of the target (the n-gram drafter).", "0.03-0.1",
      link=Link(SPEC, "draft cost ratio c is typically 0.03-0.1 (ngram)"), rule=Range("0.03", "0.1"),
      why="an n-gram lookup is no small model: the range is not said of it", about=DRAFT, scope="gpu-speed"),
    c(37, "§5.1", "c = 0.03-0.1 (the lab's layer-skip drafter).", "0.03-0.1",
      link=Link(SPEC, "draft cost ratio c is typically 0.03-0.1 (layerskip)"), rule=Range("0.03", "0.1"),
      about=DRAFT, scope="gpu-speed"),
    c(38, "§5.1", "c = 0.03-0.1 (a weight-quantized copy as draft).", "0.03-0.1",
      link=Link(SPEC, "draft cost ratio c is typically 0.03-0.1 (quantized)"), rule=Range("0.03", "0.1"),
      about=DRAFT, scope="gpu-speed"),
    c(39, "§5.1", "a = 0.7, k = 4, c = 0.05 give 2.77 tokens a round and about 2.3x.", "2.3x",
      link=Link(SPEC, "a=0.7, k=4, c=0.05", lab_pattern=r"speedup = (?P<v>[\d.]+)", evidence=ARITHMETIC),
      rule=Number("2.3"), about="the article's speedup formula at a = 0.7, k = 4, c = 0.05", scope="arithmetic"),
    c(40, "§5.1", "At a = 0.5 the round yields 1.94 tokens and about 1.6x.", "1.6x",
      link=Link(SPEC, "a=0.5: E = 1.94", lab_pattern=r"speedup = (?P<v>[\d.]+)", evidence=ARITHMETIC),
      rule=Number("1.6"), about="the article's speedup formula at a = 0.5, k = 4, c = 0.05", scope="arithmetic"),
    c(41, "§5.1", "Below a = 0.4 speculation is hardly worth it (「α 低于 0.4 基本没什么意思」).", "a < 0.4",
      link=Link(SPEC, "a below 0.4", lab_pattern=r"^(?P<v>[\d.]+), where its own formula", evidence=ARITHMETIC),
      rule=Range("0.4", None), assumptions=(HARDLY,),
      why="the a where its own formula falls to 1.1x (the notebooks' 'hardly worth it') against 0.4; this engine's "
          "verification costs more than one step (003-42)",
      about="the article's speedup formula, k = 4, c = 0.05 (verifying k drafts costing one step, as on a GPU at "
            "small batch)", scope="arithmetic"),
    c(42, "§5.1", "Verifying k drafts costs one target step (a round costs 1 + k c).", "1 + k c",
      link=Link(SPEC, "verifying k drafts costs one target step", lab_pattern=run_cell(r"measured v\(\d+\) = ")),
      rule=Bound("1.1", above=False), assumptions=(ONE_STEP,),
      why="v(k) is the target's (k + 1)-token forward whatever drafts it, measured once in each drafter's engine: "
          "judged on their median and min-max spread (it once read the layer-skip drafter's figure alone, while the "
          "notebook called it wrong when any drafter's exceeded 1.1)",
      about=SPEC_GPU, scope="gpu-speed"),
    c(43, "§5.1", "Acceptance decides everything.", "a decides",
      link=Link(SPEC, "acceptance decides everything", lab_figure=rows_outside),
      rule=Range(None, "0"), why="judged on the rows where the article's prediction from a alone misses the measured "
                                 "speedup by more than 10% (none, for a alone to decide), those whose interval "
                                 "reaches across 10% counted as either",
      about=SPEC_GPU, scope="gpu-speed"),
    c(44, "§5.1", "Code, rewriting, translation and summarization reach a >= 0.7; open-ended writing falls under 0.5 "
                  "(n-gram drafter).", "a >= 0.7 / < 0.5",
      link=Link(SPEC, "open-ended writing a < 0.5 (ngram)"), parts=by_task("ngram"),
      about="speculative decoding by task type, any drafter and device", scope="model-behaviour", model=A70_CLASS),
    c(45, "§5.1", "The same, for the layer-skip drafter.", "a >= 0.7 / < 0.5",
      link=Link(SPEC, "open-ended writing a < 0.5 (layerskip)"), parts=by_task("layerskip"),
      about="speculative decoding by task type, any drafter and device", scope="model-behaviour", model=A70_CLASS),
    c(46, "§5.1", "The same, for a quantized copy as drafter.", "a >= 0.7 / < 0.5",
      link=Link(SPEC, "open-ended writing a < 0.5 (quantized)"), parts=by_task("quantized"),
      about="speculative decoding by task type, any drafter and device", scope="model-behaviour", model=A70_CLASS),
    c(47, "§5.2", "N-gram drafts work wonders for rewriting and RAG at almost zero cost.", "near-zero cost",
      link=Link(SPEC, "n-gram drafts work wonders",
                lab_pattern=r"rewriting: a [\d.]+, (?P<v>[\d.]+) \[(?P<lo>[\d.]+), (?P<hi>[\d.]+)\]x"),
      rule=Bound("1"), why="judged on rewriting's speedup over plain decoding (its interval over prompts)",
      assumptions=(Assumption("the speedup that 'works wonders' (奇效)", 1.0, "x", "the lab's reading: any speedup",
                              1.0, 2.0, "from any gain to the 2x the article's section promises",
                              rule=lambda x: Bound(repr(x)), log=False),),
      about=SPEC_GPU + ", n-gram drafts, rewriting and RAG",
      scope="gpu-speed"),
    c(48, "§5.2", "A same-family small model drafts best.", "same family", link=Link(SPEC, "same-family small model"),
      about="draft models of the target's family against others, any device", scope="model-behaviour",
      model=A70_CLASS),
]

STRUCTURED = [
    c(49, "§5.3", "Constrained decoding makes the format absolutely correct.", "100% valid",
      link=Link(STRUCT, "makes the format absolutely correct", lab_pattern=r"^T=0\.0: \d+/\d+ = (?P<v>\d+)%"),
      rule=Number("100"), why="judged on greedy decoding's schema-valid share with the grammar",
      about=GRAMMAR, scope="behaviour"),
    c(50, "§5.3", "... and faster, through fewer retries.", "faster",
      link=Link(STRUCT, "and faster: a smaller", lab_pattern=r"tokens to a valid answer, with over without the "
                                                             r"grammar: (?P<v>[\d.]+)"),
      rule=Bound("1", above=False),
      why="decided by the work to a valid answer (the tokens with retries), not by the seconds of one run; how often "
          "a model's unconstrained output is invalid depends on the model",
      about=GRAMMAR + ", retried until valid", scope="model-behaviour", model=A70_CLASS),
    c(51, "§5.3", "Computing the full mask over a 100k+ vocabulary every step (「每步都全量算一遍掩码」) takes 20-30% "
                  "(「两三成」) of a step at small batch (「在小 batch 下」): measured here.", "20-30%",
      link=Link(STRUCT, "两三成): this machine", lab_pattern=NAIVE), rule=Range("20", "30"), readings=MASK_WAYS,
      about=MASK, scope="gpu-speed"),
    c(53, "§5.3", "The same, projected to a GPU with a 128K vocabulary.", "20-30%",
      link=Link(STRUCT, "(the same, projected)", lab_pattern=NAIVE, evidence=PROJECTED, setting=MASK_H100),
      rule=Range("20", "30"), readings=MASK_WAYS,
      about=MASK, scope="gpu-speed"),
    c(54, "§5.3", "Precompiling the state transitions reduces masking to a lookup and a bitwise AND.", "lookup",
      link=Link(STRUCT, "precompiling the state transitions", lab_pattern=r"\((?P<v>[\d.]+)x\)"), rule=Bound("1"),
      why="judged on the naive mask's time over the precompiled fill's",
      about=GRAMMAR + ", xgrammar-style token-mask cache",
      scope="behaviour"),
    c(55, "§5.3", "Deeply nested schemas make the state machine explode (「嵌套太深的状态机会爆炸」).", "explodes",
      link=Link(STRUCT, "deeply nested schemas"),
      about="a JSON schema compiled to a finite state machine (regex-based constrained decoding)", scope="behaviour"),
    c(56, "§5.3", "Vocabularies run to a hundred thousand tokens or more (「词表动辄十几万」).", "100k+",
      link=Link(STRUCT, "vocabularies run to a hundred thousand", evidence=ARITHMETIC),
      about="the LLMs in common use", scope="arithmetic"),
]

BENCHMARKING = [
    c(75, "§6.1", "Compiled engines give better first-token latency and throughput, at the cost of flexibility; "
                  "lightweight local ones cannot carry online traffic (the article's table).", "compiled: high / low",
      verdict=NOT_CHECKABLE, why="needs the engines themselves on the same GPU and load",
      about="serving frameworks (general, compiled, lightweight local) on one GPU", scope="gpu-speed"),
    c(57, "§6.2", "Fixed-length load tests seriously overestimate performance (「用固定长度压测会严重高估性能」).",
      "seriously overestimate", link=Link(SERVE, "fixed-length load tests seriously overestimate",
                                          lab_pattern=run_cell("x: ")),
      rule=Bound("1.2"), about="load tests of a continuous-batching engine, fixed against long-tailed lengths",
      assumptions=(Assumption("the overestimate 'seriously' (严重) means", 1.2, "x",
                              "the notebook's reading: by more than a fifth", 1.1, 1.5, "a tenth to a half",
                              rule=lambda x: Bound(repr(x))),),
      scope="behaviour"),
    c(78, "§6.2", "Raising concurrency, throughput rises to a knee where it flattens or falls while TPOT worsens fast "
                  "(「开始走平甚至下降同时 TPOT 快速恶化」).", "a knee",
      link=Link(SERVE, "raising concurrency, throughput flattens at a knee"),
      why="'flattens' read as under 10% more throughput for the ramp's top doubling of concurrency (notebook 06's "
          "knee rule), in every pass; a ramp that stops before its knee leaves it not checkable (a finite ramp "
          "cannot show that no knee exists), which the notebook's verdict says; TPOT's rise is in the row",
      about="a continuous-batching engine under rising concurrency, any device", scope="behaviour"),
    c(58, "§6.2", "Run production at about 70% of the throughput knee.", "70%", verdict=NOT_CHECKABLE,
      why=f"{SETTING} (notebook 06 applies it: its metrics.json gives the knee and the operating point)",
      about=SERVING, scope="behaviour"),
    c(59, "§6.2", "The sizing example's weights: 70B at 0.55 bytes/param are 35.8 GB.", "35.8 GB",
      link=arith("weights of 70B at 0.55 bytes/param"), rule=Number("35.8"),
      why="70e9 x 0.55 B = 35.86 GiB, which prints as 35.9 (the article's own code prints 35.9): a rounding slip, "
          "not a wrong figure", cause="rounded-down", about="70e9 weights at 0.55 bytes (INT4 with scales)",
      scope="arithmetic"),
    c(60, "§6.2", "Weights 35.8 + KV 32 + 3 GB reserve make seventy-some GB (「七十多GB」), just fitting an 80 GB card.",
      "70+ GB", link=arith("the example's total, 35.86 GiB"), rule=Range("70", "79"),
      about="the article's example: 70e9 weights at 0.55 B, 32 layers x 8 KV heads x 128, 32 requests of 8K",
      scope="arithmetic"),
    c(61, "§6.2", "Dropping to 24 requests or an FP8 KV cache both make the example fit (「两条路都能走通」).",
      "both fit (80 GB)", link=arith("the example at 24 requests or with an FP8"), rule=Bound("80", above=False),
      about="the article's example at 24 requests, or with FP8 KV, on an 80 GB card", scope="arithmetic"),
    c(76, "§6.2", "The example is a 70B model, and it just fits one 80 GB card (「单张 80GB 卡刚好卡在边缘」).",
      "fits 80 GB", link=arith("the example for a real 70B"), rule=Bound("80", above=False), cause="example-shape",
      why="with a real 70B's shape (Llama-3-70B: 80 layers), the example's own weights and reserve",
      about="a real 70B (Llama-3-70B: 80 layers x 8 KV heads x 128), INT4 weights, 32 requests of 8K in FP16",
      scope="arithmetic"),
    c(77, "§6.2", "For that 70B, 24 requests or an FP8 KV cache both make it fit.", "both fit (80 GB)",
      link=arith("a real 70B at 24 requests"), rule=Bound("80", above=False), cause="example-shape",
      why="the larger of the two totals must fit; with a real 70B's KV, 24 requests of 8K in FP16 do not",
      about="a real 70B (Llama-3-70B), 24 requests in FP16 KV or 32 in FP8, an 80 GB card", scope="arithmetic"),
]

CONFIGURATION = [
    c(79, "§6.3", "gpu_memory_utilization 0.90: leave a tenth for the framework and fragmentation, not 0.98.", "0.90",
      verdict=NOT_CHECKABLE, why=SETTING, about=CONFIG, scope="behaviour"),
    c(80, "§6.3", "max_num_seqs 24: the concurrency memory allows, less a fifth (「按显存反推后打八折」).", "24",
      verdict=NOT_CHECKABLE,
      why=f"{SETTING}: a template for a model the section does not name (the 80% rule itself is 003-29's)",
      about=CONFIG, scope="behaviour"),
    c(81, "§6.3", "For long-context QA turn on chunked prefill, prefix caching and an FP8 KV cache; max batched tokens "
                  "4096; block size 16.", "on", verdict=NOT_CHECKABLE,
      why=f"{SETTING}; the claims behind each are rows of §3.1-§3.3 and §2.3", about=CONFIG, scope="behaviour"),
    c(82, "§6.3", "Speculation per business line, draft length 4 as a start, off below an acceptance of 0.55 "
                  "(「draft_len: 4」, 「acceptance_threshold: 0.55」).", "4, 0.55",
      link=Link(SPEC, "acceptance_threshold 0.55 and draft_len 4"), about=CONFIG + ", speculative decoding",
      scope="model-behaviour", model=A70_CLASS),
]

TROUBLESHOOTING = [
    c(83, "§7.1", "GPU utilisation long under 40% means the bottleneck is not compute: mostly an unfilled batch or "
                  "queueing (「利用率长期低于四成…八成是批处理没跑满」).", "< 40%", verdict=NOT_CHECKABLE,
      why="a diagnosis on a GPU serving stack's utilisation counters, which this CPU has none of",
      about=SERVING, scope="gpu-speed"),
    c(84, "§7.1", "TP on a machine without fast links: communication eats most of the compute "
                  "(「通信开销能把大部分算力吃掉」).", "most",
      link=Link(PAR, "communication eats most of the compute", lab_pattern=r"^(?P<v>[\d.]+)% of the step",
                evidence=PROJECTED, setting=PCIE),
      rule=Bound("50", above=True), readings=(
          Reading("at the batch where the share is largest", r"^(?P<v>[\d.]+)% of the step"),
          Reading("at batch 1", r"\((?P<v>[\d.]+)% at batch 1\)")),
      why="'most' read as over half the step; at which batch the article does not say",
      assumptions=(Assumption("the share 'most of the compute' (大部分算力) means", 50, "% of the step",
                              "over half, the plain reading", 50, 67, "from half to two thirds",
                              rule=lambda x: Bound(repr(x))),),
      about="tensor parallelism on GPUs joined by PCIe only (no NVLink), a 70B model, decode", scope="gpu-speed"),
    c(85, "§7.2", "Too small a max_model_len silently truncates the front of long inputs (「超长输入被悄悄截掉前半部分」).",
      "silently", verdict=NOT_CHECKABLE,
      why="what a framework does with a prompt over max_model_len (reject it, or truncate it and warn) is its own "
          "choice, and the section names none",
      about="an unnamed serving framework, prompts over max_model_len", scope="behaviour"),
    c(86, "§7.3", "OOM comes mostly from a wrong concurrency estimate, not the weights; long-tail latency mostly from "
                  "preemption and queueing; one 32K request can burst the cache pool.", "mostly",
      verdict=NOT_CHECKABLE,
      why="a production operator's tally of causes, not a figure any run or input decides",
      about=SERVING, scope="behaviour"),
]

# Claims a skeptic's re-read of the article found without a row (issue 48 item 5); the quotes are its words.
UNROWED = [
    c(87, "§1.2", "Batching is the only way to raise throughput (「想提高吞吐唯一的出路是批处理」).", "the only way",
      verdict=BY_ARGUMENT, cause="only-batching",
      why="the article itself names two others: INT4 quantization, which it says often doubles throughput on the same "
          "card (§2, 003-13), and speculative decoding, which yields several tokens a target step (§5.1); 003-64 "
          "checks only that batching amortizes the weights' read",
      about="decode on a GPU, any model", scope="behaviour"),
    c(88, "§3", "Scheduling policy alone makes a 2-3x throughput difference on the same card and model "
                "(「调度策略好坏能带来两三倍的吞吐差距」).", "2-3x", verdict=NOT_YET,
      why="the lab's engine schedules continuously only; notebook 06's batch sweep varies a cap, not a policy",
      decider="one load run through static batching (wait for a full batch, run it to the end) and through the "
              "engine's continuous batching, output tokens per second of each on the same model and machine",
      about="a serving engine's scheduler, one GPU and model", scope="behaviour"),
    c(89, "§4.1", "Tiling with an online softmax brings both attention and its memory down from quadratic "
                  "(「这一改动让长上下文的注意力和显存占用都从平方级降下来」).", "quadratic -> lower",
      verdict=BY_ARGUMENT, cause="flash-compute",
      why="a tiled attention does the same arithmetic, 4 n^2 d FLOPs a head for n tokens: its compute stays quadratic; "
          "only the memory it holds falls to linear (its traffic to and from HBM stays quadratic in n with a smaller "
          "constant: FlashAttention, Dao et al. 2022, Theorem 2); 003-31 is the memory half",
      about="FlashAttention-style kernels against materialized scores, any device", scope="behaviour"),
    c(90, "§4.3", "Pipeline parallelism communicates far less than tensor parallelism (「通信量小很多」).", "far less",
      link=arith("bytes a token moves under TP=8"), rule=Bound("1"),
      about="a 70B (80 layers, d_model 8192, fp16) at TP=8 against PP=8, per token", scope="arithmetic"),
    c(91, "§7.3", "One 32K-context request can burst the cache pool (「一个 32K 上下文的请求进来直接把缓存池撑爆」).",
      "bursts the pool", link=arith("one 32K request's KV on its own model"),
      rule=Bound("1"), cause="pool-burst",
      about="its own model (128 KB of KV a token, fp16) and its §6.2 pool of 32 x 8K", scope="arithmetic"),
    c(92, "§7.3", "A P99 queueing time far above the mean means a traffic burst or an unhealthy instance "
                  "(「如果 P99 排队时间远大于平均那就是流量突刺或者某个实例不健康」).", "burst or unhealthy",
      verdict=BY_ARGUMENT, cause="queue-tail",
      why="a healthy queue's waiting time is already long-tailed: in an M/M/1 queue at 70% load the P99 wait is about "
          "ln(100 x 0.7) = 4.2 times the mean, and the long-tailed request lengths the article's own §6.2 asks load "
          "tests to use widen it further; a P99 far above the mean arises with neither a burst nor a sick instance",
      about="a serving instance's request queue under steady load", scope="behaviour"),
]

CLAIMS = [*KERNELS, *SPECULATIVE, *STRUCTURED, *BENCHMARKING, *CONFIGURATION, *TROUBLESHOOTING, *UNROWED]
