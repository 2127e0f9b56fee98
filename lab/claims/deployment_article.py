"""Every numeric or testable claim of seeds/003 (LLM deployment: memory, quantization, scheduling), by section: §1-§3
here, §4-§7 in `deployment_article_serving`, which shares `CAUSES` and the helpers below.

Checked by notebook 01 (memory accounting, INT4 decode, and the article's own arithmetic recomputed:
`lab.claims.arithmetic.deployment_article`), 02 (weight quantization), 03 (KV-cache quantization), 05 (speculative decoding), 07
(structured output) and 08 (parallelism). Each claim names the setting it is about and its scope (issue 40): the
article speaks of 70B models on 80 GB GPUs, so its speed claims need a GPU or a projection to one, and its weight-
accuracy claims a 16-bit checkpoint; the lab's embedded model is already 4-bit. Where a row quotes the article, the
Chinese follows the English (「…」).

Its wrong verdicts come from fewer mistakes (`CAUSES`, which CLAIMS.md counts): its rounding, its sizing example's
shape, and its model of speculative decoding (a cut-off in a alone, acceptance by task alone), of KV formats and of TP
over slow links.
"""

from __future__ import annotations

from lab.claims.record import Assumption, Cause, Claim, Link, Part
from lab.claims.model_class import ModelClass
from lab.claims.rules import ARITHMETIC, BY_ARGUMENT, NOT_CHECKABLE, Bound, Number, Range, run_cell

MEM, QUANT, KV, SPEC, STRUCT, PAR = ("01_memory_accounting", "02_quantization_accuracy", "03_kv_quantization",
                                     "05_speculative_acceptance", "07_structured_output", "08_parallelism")
SETTING = "a recommended setting, not a statement with a truth value"
SERVE = "06_serving_ttft"
FOUR_BIT = ("the embedded model's weights are already 4-bit (a Q4_1 GGUF), so quantizing them again says nothing of "
            "quantizing a 16-bit model")
# The settings claims are about (`Claim.about`), where several rows share one.
A70 = "a 70B model (the article's: 32 layers x 8 KV heads x 128), 80 GB GPUs"
INT4_DECODE = "a GPU's INT4 (GPTQ/AWQ) decode kernels against FP16, a 70B-class model"
QUANT_16 = "4-bit GPTQ/AWQ of a 16-bit model, its calibration set, any device"
KV_ANY = "a KV cache quantized to FP8/INT8/INT4 in online serving, any model and device"
PAGED = "a paged KV cache (vLLM-style) against a contiguous reservation per request, real request lengths"
# The class of model the article speaks of (issue 48): its examples are 70B-class dense models on 80 GB GPUs, so a
# figure that depends on the model (KV error, acceptance, retries) measured on the embedded 135M model stands only in
# this setting.
A70_CLASS = ModelClass("10B-100B", "dense")
# notebook 02's paired intervals, "v (lo to hi)"
PAIRED = r"(?P<v>[\d.]+) \((?P<lo>[\d.]+) to (?P<hi>[\d.]+)\)"
PPL = r"^(?P<v>[-+]?[\d.]+) \[(?P<lo>[-+]?[\d.]+), (?P<hi>[-+]?[\d.]+)\]% perplexity"


# What the paging rows rest on that the article does not state: the traffic's request lengths and what a contiguous
# cache reserves for each, swept through notebook 01's own parameters.
TRAFFIC = (Assumption("the length a contiguous cache reserves per request (max_model_len)", 8192, "tokens",
                      "notebook 01's SEQ_LEN: the article does not say what it reserves", 4096, 32768,
                      "from its own §3.1 example's 4096 to the 32K long-context services reserve", param="SEQ_LEN"),
           Assumption("the median request length (prompt and output) of the traffic", 600, "tokens",
                      "notebook 01's log-normal (P90 2000, P99 6000): the article states none", 150, 1500,
                      "from chat turns to document questions", param="LENGTH_P50"))


def safe_line(above: bool) -> Assumption:
    """The perplexity change a KV format may cost and still be called safe: the article gives no number, the
    notebooks read it as 1% (notebook 03's SAFE_PPL_PCT); `above`: the claim is that the format costs more."""
    return Assumption("the perplexity change a 'safe' KV format may cost", 1.0, "%",
                      "notebook 03's SAFE_PPL_PCT: the article gives no number", 0.5, 2.0,
                      "from half a percent to two: the lines quantization papers and serving guides call lossless",
                      rule=lambda x: Bound(repr(x), above=above))

# The article's mistakes behind its wrong verdicts (a claim's `cause`), in the order they first appear.
CAUSES = (
    Cause("rounded-down", "§3.1", "Its prose rounds its own arithmetic down a digit: 1 - 500/4096 = 0.88 as eight "
                                  "tenths (八成, §3.1), 70e9 x 0.55 B = 35.86 GiB as 35.8 where its own code prints "
                                  "35.9 (§6.2)."),
    Cause("prefix-cache-all-or-nothing", "§3.3", "It treats the prefix cache as all or nothing for a prompt, when "
                                                 "a block-hashed cache (vLLM's) keeps every full block before the "
                                                 "first changed token: a timestamp halfway through the system prompt "
                                                 "costs the half after it, not all of it."),
    Cause("only-batching", "§1.2", "It calls batching the only way to raise throughput, when it names two others "
                                   "itself: INT4 weights (§2) and speculative decoding (§5.1)."),
    Cause("flash-compute", "§4.1", "It credits tiled attention with bringing attention's cost down from quadratic, "
                                   "when it does the same quadratic arithmetic and saves only the memory it holds."),
    Cause("example-shape", "§6.2", "Its sizing example gives a 70B model the 32 layers of an 8B one (8 KV heads x "
                                   "128, hidden 4096): a real 70B has 80 layers and holds 2.5x that KV cache, so the "
                                   "example that 'just fits' an 80 GB card does not fit it, nor do its remedies."),
    Cause("pool-burst", "§7.3", "It says one 32K request can burst the cache pool, when by its own model and §6.2 pool "
                                "the request takes an eighth of it."),
    Cause("queue-tail", "§7.3", "It reads a P99 queueing time far above the mean as a burst or a sick instance, when "
                                "a healthy queue under steady load has that tail by itself.")
)


def _prefill_seconds(tflops: float) -> float:
    """§1.2's prefill (5.73e14 FLOPs) at 40% of a GPU of `tflops` peak: what notebook 01's row computes."""
    import dataclasses

    from lab.machine import roofline
    from lab.machine.hardware import GPUS
    gpu = dataclasses.replace(GPUS["a100-sxm-80gb"], peak_flops=tflops * 1e12)
    flops = roofline.prefill_flops(roofline.ModelCost(0, 70e9, 0), 4096)
    return roofline.prefill_time_lower_bound(gpu, flops, 0, compute_efficiency=0.4).seconds


def c(n: int, section: str, claim: str, article: str, **kw) -> Claim:
    return Claim(f"003-{n:02d}", "003", section, claim, article, **kw)


def kv(claim: str) -> Link:
    return Link(KV, claim)


def arith(match: str) -> Link:
    """A row of notebook 01's claims table that recomputes the article's arithmetic (`lab.claims.arithmetic`)."""
    return Link(MEM, match, evidence=ARITHMETIC)


MEMORY = [
    c(1, "§1.1", "A 70B model stored in FP16 takes 140 GB and does not fit one 80 GB card.", "140 GB",
      link=Link(PAR, "a 70B model in FP16 takes 140 GB", lab_pattern=r"(?P<v>\d+(?:\.\d+)?) GB", evidence=ARITHMETIC),
      rule=Number("140", exact=False), about="a 70B model (Llama-3-70B), FP16 weights", scope="arithmetic"),
    c(62, "§1.1", "In INT4 the weights drop to about 35 GB (「换成 INT4 之后权重降到 35GB 左右」).", "about 35 GB",
      link=arith("70e9 weights at 4 bits"), rule=Number("35"), about="70e9 weights at 4 bits, before scales",
      scope="arithmetic"),
    c(2, "§1.1", "With group scales and zero points (「再加上 group scale 和 zero point 的额外开销」) a 70B model in INT4 "
                 "takes 38-42 GB.", "38-42 GB",
      link=arith("group scales and zero points"), rule=Range("38", "42"),
      why="zero points counted, as the claim says (notebook 01's row on symmetric INT4, scales only, leaves them out)",
      about="Llama-3-70B, INT4 group 128 with fp16 scales and zero points, embeddings and LM head unquantized",
      scope="arithmetic"),
    c(3, "§1.1", "KV per token for 32 layers, 8 KV heads, head_dim 128 in FP16 is 131,072 B (128 KB).", "131072 B",
      link=arith("KV per token, 32 layers x 8 KV heads"), rule=Number("131072"),
      about="32 layers x 8 KV heads x 128, FP16 KV", scope="arithmetic"),
    c(4, "§1.1", "One 8K-token request of that model holds 1 GB of KV.", "1 GB",
      link=arith("same model, one request of 8K tokens"), rule=Number("1"),
      about="32 layers x 8 KV heads x 128, FP16 KV, 8K tokens", scope="arithmetic"),
    c(5, "§1.1", "Thirty-two such requests hold 32 GB of KV (repeated in §6.2).", "32 GB",
      link=arith("KV of 8K x 32 requests"), rule=Number("32"),
      about="32 layers x 8 KV heads x 128, FP16 KV, 32 requests of 8K", scope="arithmetic"),
    c(63, "§1.1", "With MHA (32 KV heads) a token holds 512 KB of KV (「每 token 就是 512KB」).", "512 KB",
      link=arith("KV per token with MHA"), rule=Number("512"), about="32 layers x 32 KV heads x 128, FP16 KV",
      scope="arithmetic"),
    c(6, "§1.1", "With MHA (32 KV heads) an 8K-token request holds 4 GB of KV.", "4 GB",
      link=arith("MHA (32 KV heads)"), rule=Number("4"), about="32 layers x 32 KV heads x 128, FP16 KV, 8K tokens",
      scope="arithmetic"),
    c(7, "§1.1", "Activations need a 2-4 GB margin (「通常留 2~4GB 余量比较稳妥」).", "2-4 GB",
      link=arith("activation peak of a Llama-3-70B forward"), rule=Range(None, "4"),
      why="the forward's activation peak at the largest step the article names (8192 batched tokens, §3.2), "
          "estimated from the model's shape; a margin holds when the peak fits in it",
      about="a 70B model (Llama-3-70B), bf16 activations, up to 8192 batched tokens and 32 sequences",
      scope="behaviour"),
    c(8, "§1.2", "Decode reads 40 GB of INT4 weights at 2 TB/s in 20 ms: at most 50 tokens/s per request.", "20 ms",
      link=arith("decode lower bound for 40 GB"), rule=Number("20"),
      about="40 GB of weights at 2 TB/s, batch 1", scope="arithmetic"),
    c(9, "§1.2", "Real kernels reach 60-70% of that bound (「实际 kernel 效率打个六七折」): about 30 tokens/s per "
                 "request.", "about 30 tokens/s", verdict=NOT_CHECKABLE,
      why="a GPU kernel's share of its bandwidth bound: needs a 70B INT4 model on a 2 TB/s GPU, decoding at batch 1, "
          "against 20 ms a token; notebook 01 times this CPU's engine against its own roofline "
          "(roofline_vs_engine.csv), which says nothing of a GPU kernel's efficiency",
      about="a 70B INT4 model on a 2 TB/s GPU, batch 1, the serving stack's decode kernels", scope="gpu-speed"),
    c(10, "§1.2", "Prefill of 4096 tokens on a 70B model is about 5.7e14 FLOPs (573 TFLOPs).", "5.7e14",
      link=arith("prefill FLOPs of a 70B model on 4096 tokens"), rule=Number("5.73e14"),
      about="a 70B model, 4096 prompt tokens, 2 x params x tokens", scope="arithmetic"),
    c(11, "§1.2", "At 300+ TFLOP/s and 40% utilisation that prefill takes 4+ seconds (「四秒多」).", "4+ s",
      link=arith("prefill of 5.73e14 FLOPs at 40%"), rule=Range("4.0", "4.9"),
      assumptions=(Assumption("the GPU's peak, 'three hundred and some' TFLOP/s (三百多)", 312, "TFLOP/s",
                              "an A100's 312", 300, 399, "the span 三百多 names", figure=_prefill_seconds, log=False),),
      why="an A100's 312 TFLOP/s stands for the article's 'three hundred and some' (三百多)",
      about="5.73e14 FLOPs on a 300+ TFLOP/s GPU (an A100) at 40% utilisation", scope="arithmetic"),
    c(64, "§1.2", "Batching is the way to raise throughput: one read of the weights serves tens of requests "
                  "(「一次读权重同时算几十个请求把带宽成本摊薄」).", "amortized",
      link=Link(MEM, "batching amortizes the weight read over tens of requests (bfloat16", lab_pattern=run_cell(", x: ")),
      rule=Bound("2"),
      model=ModelClass(),  # any model whose decode step is bound by reading its weights
      assumptions=(Assumption("the gain that shows the weights' read 'amortized' (摊薄) over a batch of 32", 2, "x",
                              "the notebook's reading: at least twice batch 1's tokens/s", 1.5, 8,
                              "from half again to a quarter of the batch", rule=lambda x: Bound(repr(x))),),
      why="'amortized' read as tokens per second at batch 32 at least twice batch 1's, in every run: a step whose "
          "time grew in proportion to the batch would give 1x",
      about="decode while bandwidth-bound, any device, batch 1 to tens", scope="behaviour"),
    c(12, "§1.3", "A 50 ms TPOT is 20 tokens/s per request; 32 concurrent requests make 640 tokens/s.", "640 tokens/s",
      link=arith("32 requests at a TPOT of 50 ms"), rule=Number("640"), about="any: 32 requests at 50 ms TPOT",
      scope="arithmetic"),
]

QUANTIZATION = [
    c(13, "§2", "INT4 quantization often doubles throughput on the same card (「吞吐往往翻倍」).", "2x",
      verdict=NOT_CHECKABLE,
      why="a throughput on a GPU card, where INT4 also frees memory for a larger batch; this CPU's int4 kernel is "
          "timed against bf16 in notebook 01 (the INT4 decode rows, 003-16/17, with the bytes-read bound beside "
          "them); what would decide it: tokens per second of a 70B served in INT4 and in FP16 on the same GPU, each "
          "at the batch its memory allows",
      about=INT4_DECODE + ", served at the batch each fits", scope="gpu-speed"),
    c(14, "§2.1", "FP8 weights are nearly lossless and need no calibration (「几乎无损、无需校准」).", "nearly lossless",
      verdict=NOT_CHECKABLE,
      why=f"{FOUR_BIT}; what would decide it: notebook 02's pipeline with fp8 (e4m3) weights on a 16-bit checkpoint "
          "(its MODEL parameter), perplexity and the sensitive pass rate against bf16",
      about="FP8 weights of a 16-bit model, no calibration, any device", scope="weight-accuracy"),
    c(15, "§2.1", "AWQ is steadier on instruction and chat tasks; GPTQ is slightly better in perplexity; the gap is "
                  "small (「GPTQ 在纯语言建模的困惑度上略占优两者差距不大」).", "GPTQ <= AWQ in perplexity",
      link=Link(QUANT, "GPTQ is slightly better than AWQ in perplexity (w4g64, code)", lab_pattern=PAIRED),
      rule=Bound("1", above=False),
      why="the perplexity half, on held-out code at w4g64 (a paired interval over sequences); notebook 02's claims "
          "table has the prose domain and the sensitive-set half (AWQ against GPTQ) in rows of their own",
      about=QUANT_16, scope="weight-accuracy"),
    c(65, "§2.1", "AWQ is more sensitive to the calibration set's distribution (「AWQ 对校准集分布更敏感」).",
      "AWQ more sensitive", verdict=NOT_CHECKABLE,
      why=f"{FOUR_BIT}; what would decide it: notebook 02's calibration comparison (short Q&A against the stratified "
          "mix, 003-18) run for AWQ and for GPTQ on a 16-bit checkpoint, the KL change of each",
      about=QUANT_16, scope="weight-accuracy"),
    c(16, "§2.1", "INT4 decode is 2-2.5x faster than FP16 (batch 1).", "2-2.5x",
      link=Link(MEM, "INT4 decode is 2-2.5x faster than FP16 (batch 1)", bound=r"bytes read (?P<v>[\d.]+)x"),
      rule=Range("2", "2.5"), about=INT4_DECODE + ", batch 1", scope="gpu-speed"),
    c(17, "§2.1", "INT4 decode is 2-2.5x faster than FP16 (batch 32).", "2-2.5x",
      link=Link(MEM, "INT4 decode is 2-2.5x faster than FP16 (batch 32)", bound=r"bytes read (?P<v>[\d.]+)x"),
      rule=Range("2", "2.5"), about=INT4_DECODE + ", batch 32", scope="gpu-speed"),
    c(66, "§2.1", "INT4 cannot make decode 4x faster than FP16 (「谁跟你说 INT4 能带来四倍加速那大概率是没在真实负载上测过」).",
      "not 4x", link=arith("bytes a decode step reads, FP16 over INT4"), rule=Bound("4", above=False),
      why="the bytes a step reads bound its speedup while it is bandwidth-bound: the KV cache, the scales and the "
          "unquantized embeddings are read either way",
      about="Llama-3-70B, INT4 group 128 against FP16 weights, FP16 KV at 4096 tokens, batch 1", scope="behaviour"),
    c(18, "§2.2", "Calibrate on 256-512 samples of real traffic; a short-QA calibration set degrades long-document "
                  "summaries.", "degrades",
      link=Link(QUANT, "a short-Q&A calibration set degrades long-document summarization", lab_pattern=PAIRED),
      rule=Bound("1"),
      why="KL on held-out Spec-Bench summarization prompts, short-Q&A against the stratified mix, paired over prompts",
      about=QUANT_16, scope="weight-accuracy"),
    c(19, "§2.2", "Perplexity barely moves under quantization, up a few tenths (「涨个零点几」: +0.x in perplexity "
                  "itself, not +0.x%), while task metrics drop.", "perplexity +0.x",
      link=Link(QUANT, "perplexity barely moves under 4-bit weight quantization"),
      parts=tuple(Part(d, rf"{d} (?P<v>[-+][\d.]+)% \((?P<lo>[-+][\d.]+) to (?P<hi>[-+][\d.]+)\)",
                       Bound("1", above=False)) for d in ("code", "prose")),
      why="the best 4-bit method's perplexity rise on two held-out domains; notebook 02's claims table tests the "
          "task-metric half per method (the sensitive pass rate, paired over items)",
      about=QUANT_16, scope="weight-accuracy"),
    c(67, "§2.2", "Quantization's bad cases concentrate in numbers, code blocks, rare proper nouns and long context "
                  "(「量化后的 bad case 高度集中在这几类」).", "concentrated", verdict=NOT_CHECKABLE,
      why=f"{FOUR_BIT}; what would decide it: notebook 02's sensitive categories on a 16-bit checkpoint, the pass-"
          "rate drop of each against that of ordinary prompts",
      about=QUANT_16, scope="weight-accuracy"),
    c(20, "§2.3", "An FP8 KV cache is usually safe.", "safe",
      link=Link(KV, "FP8 (e4m3, calibrated per-tensor scale)", lab_pattern=PPL), rule=Bound("1.0", above=False),
      assumptions=(safe_line(above=False),),
      why="the perplexity half of notebook 03's safety rule; the other half, no sensitive item lost, is its note",
      about=KV_ANY, scope="model-behaviour", model=A70_CLASS),
    c(68, "§2.3", "An FP8 KV cache halves the 32 GB (「同样是 32GB 的缓存占用直接砍半」).", "16 GB",
      link=arith("an FP8 KV cache for 32 requests of 8K"), rule=Number("16"),
      about="32 layers x 8 KV heads x 128, FP8 KV with a per-tensor scale, 32 requests of 8K", scope="arithmetic"),
    c(21, "§2.3", "An INT8 KV cache needs care.", "needs care",
      link=Link(KV, "INT8 needs care", lab_pattern=PPL), rule=Bound("1.0", above=True),
      assumptions=(safe_line(above=True),),
      about=KV_ANY, scope="model-behaviour", model=A70_CLASS),
    c(22, "§2.3", "An INT4 KV cache is not for online serving.", "not safe",
      link=Link(KV, "INT4 is not safe", lab_pattern=PPL), rule=Bound("1.0", above=True),
      assumptions=(safe_line(above=True),), about=KV_ANY, scope="model-behaviour", model=A70_CLASS),
    c(23, "§2.3", "Keys are more sensitive to quantization than values.", "K > V",
      link=kv("keys are more sensitive than values (int4/per-token)"), rule=Bound("1"),
      about=KV_ANY, scope="model-behaviour", model=A70_CLASS),
    c(24, "§2.3", "Keys want finer (per-channel) scales.", "per-channel K", link=kv("keys want per-channel scales"),
      rule=Bound("1", above=False), about=KV_ANY, scope="model-behaviour", model=A70_CLASS),
    c(25, "§2.3", "Per-token dynamic scales beat a per-tensor static scale on long context.", "per-token",
      link=kv("per-token dynamic beats per-tensor static on long context (int8)"), rule=Bound("1", above=False),
      about=KV_ANY + ", long context", scope="model-behaviour", model=A70_CLASS),
    c(26, "§2.3", "KV quantization error grows with context, so short prompts hide it.", "grows",
      link=kv("the error grows with context"), rule=Bound("1"), about=KV_ANY + ", thousands of tokens",
      scope="model-behaviour", model=A70_CLASS),
]

PAGING = [
    c(27, "§3.1", "Reserving 4096 tokens for a 500-token request wastes about 80% (「浪费八成」).", "八成",
      link=arith("a 4096-token reservation for a 500-token request"), rule=Number("0.8"), cause="rounded-down",
      why="the article calls its figures orders of magnitude (「文中涉及具体数值的地方都是量级示意」), but this one is its "
          "own arithmetic on inputs it states (500 of 4096), which that disclaimer does not cover",
      about="any: 500 tokens of a 4096-token reservation", scope="arithmetic"),
    c(28, "§3.1", "Without paging over 60% of the KV memory is wasted (「显存浪费能从六成以上…」).", "> 60%",
      link=arith("a contiguous reservation's KV waste"), rule=Range("60", None),
      why="request lengths are the article's to state and it does not: notebook 01's log-normal (the lengths its "
          "paging table uses) stands in for real traffic",
      assumptions=TRAFFIC,
      about=PAGED, scope="behaviour"),
    c(69, "§3.1", "Paging cuts the waste to single digits (「…压到个位数百分比」).", "< 10%",
      link=arith("paged KV waste at block 16"), rule=Range(None, "9"),
      why="the same log-normal lengths; a paged cache wastes only the tail of each request's last block",
      assumptions=TRAFFIC,
      about=PAGED + ", block 16", scope="behaviour"),
    c(70, "§3.1", "The same card then carries several times the concurrency (「同样的卡能多扛好几倍并发」).",
      "several times", link=arith("paged at block 16 over contiguous"), rule=Range("3", None),
      why="sequences per unit of KV memory, from the same log-normal lengths; 'several' (好几) read as at least 3",
      assumptions=(*TRAFFIC,
                   Assumption("the smallest multiple 'several times' (好几倍) means", 3, "x",
                              "the lab's reading of 好几", 2, 5, "from 'a couple' to 'five or so'",
                              rule=lambda x: Range(repr(x), None))),
      about=PAGED + ", block 16, at most 8192 tokens a request", scope="behaviour"),
    c(71, "§3.1", "Block sizes 8, 16 and 32 make little difference (「差异不会特别大」).", "little difference",
      link=arith("block 8 over block 32"), rule=Bound("1.1", above=False),
      assumptions=(Assumption("the largest ratio 'little difference' (差异不会特别大) allows", 1.1, "x",
                              "the notebooks' reading of 'hardly' a difference", 1.05, 1.25,
                              "five to twenty-five percent", rule=lambda x: Bound(repr(x), above=False)),),
      why="in memory: the sequences the same KV memory holds; the block table's size and the addressing cost, which "
          "the article also weighs, are a kernel's and not counted",
      about=PAGED + ", block 8 to 32", scope="behaviour"),
    c(29, "§3.2", "Set max_num_seqs to about 80% of what memory allows; max batched tokens 2048-8192.", "80%",
      verdict=NOT_CHECKABLE, why=SETTING, about="a vLLM-style engine on one GPU", scope="behaviour"),
    c(72, "§3.2", "Too many batched tokens let one long prefill stall the running decodes (「打字突然停顿」); chunked "
                  "prefill slots it into their gaps.", "stall",
      link=Link(SERVE, "let one long prefill stall the running decodes", lab_pattern=run_cell("over on \\(\\d+\\), x: ")),
      rule=Bound("1"),
      assumptions=(Assumption("how much larger the largest inter-token gap must be to read as a stall (打字突然停顿)",
                              1.0, "x", "the notebook's reading: any growth", 1.0, 2.0,
                              "from any growth to a doubling, a pause a reader of the stream would notice",
                              rule=lambda x: Bound(repr(x)), log=False),),
      why="the running requests' largest inter-token gap with chunking off over on, in every run above 1 for a stall "
          "that chunking removes",
      about="a continuous-batching engine with long prompts among running decodes, any device", scope="behaviour"),
    c(30, "§3.3", "Prefix caching cuts TTFT by a big chunk with a long fixed system prompt (「首包时间能降一大截」).",
      "a big chunk", link=Link(SERVE, "prefix caching cuts TTFT by a big chunk",
                               lab_pattern=run_cell("% lower: ")),
      rule=Bound("25"), about="a GPU serving engine with prefix caching under load, a long shared system prompt",
      assumptions=(Assumption("the TTFT cut 'a big chunk' (一大截) means", 25, "% lower",
                              "the notebook's reading: more than a quarter off", 20, 50, "a fifth to a half",
                              rule=lambda x: Bound(repr(x))),),
      scope="gpu-speed"),
    c(73, "§3.3", "Dynamic content such as a timestamp inserted into the prompt defeats the prefix cache entirely "
                  "(「中间插入了动态内容比如时间戳就完全失效」).", "entirely", verdict=BY_ARGUMENT,
      cause="prefix-cache-all-or-nothing",
      why="the article's own rule, that a prefix matches from the first token (「前缀必须严格从第一个 token 开始匹配」), "
          "keeps everything before the inserted field: a cache that hashes each block with its parent's (vLLM's, "
          "the lab engine's) serves every full block before the change, so a timestamp halfway through a system "
          "prompt costs the half after it and only one at the very start costs all of it. Notebook 06 shows it "
          "(50% of a 512-token prompt served with the field at token 256), but that share is fixed by where the "
          "field was put, so it is an illustration, not a measurement that could have come out otherwise",
      about="a block-hashed prefix cache (vLLM-style), a shared system prompt with a changing field",
      scope="behaviour"),
]

CLAIMS = [*MEMORY, *QUANTIZATION, *PAGING]
