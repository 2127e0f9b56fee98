"""Every numeric or testable claim of seeds/003 (LLM deployment: memory, quantization, scheduling), by section.

Checked by notebook 01 (memory accounting and INT4 decode), 02 (weight quantization), 03 (KV-cache quantization),
05 (speculative decoding), 07 (structured output) and 08 (parallelism). Notebook 06 measures
several of its claims but writes no claims table yet; those rows say so.

Its wrong verdicts come from fewer mistakes (`CAUSES`, which CLAIMS.md counts), most of them in §5.1's model of
speculative decoding (the draft's cost, the verification's, acceptance by task) and §5.3's cost of the mask.
"""

from __future__ import annotations

from lab.ledger.record import Cause, Claim, Link
from lab.ledger.rules import NOT_CHECKABLE, NOT_YET, Number, Range

MEM, QUANT, KV, SPEC, STRUCT, PAR = ("01_memory_accounting", "02_quantization_accuracy", "03_kv_quantization",
                                     "05_speculative_acceptance", "07_structured_output", "08_parallelism")
SETTING = "a recommended setting, not a statement with a truth value"
NO_ROW_06 = "notebook 06 measures it but writes no claims table"
SECTION_6_2 = ("§6.2's worked example gives a 70B model 32 layers; a real 70B has 80 (KV 80 GiB, 119 GiB in all, per "
               "issue 23), which lab.memory would check; no notebook row recomputes the example that way")

# The article's mistakes behind its wrong verdicts (a claim's `cause`), in the order they first appear.
CAUSES = (
    Cause("gptq-over-awq", "§2.1", "It gives GPTQ a general edge over AWQ in perplexity, a ranking that depends on "
                                   "the model and its calibration, and that the lab's model at 4 bits reverses."),
    Cause("int4-speedup-fixed", "§2.1", "It gives INT4 decode a fixed 2-2.5x over FP16, when the speedup is what the "
                                        "saved weight bytes are worth in the step, which the kernel and the batch "
                                        "decide: fewer bytes read is not the same factor of time, and once the batch "
                                        "makes the step compute-bound INT4 can be slower."),
    Cause("perplexity-insensitive", "§2.2", "It takes perplexity to be insensitive to weight quantization (a rise of "
                                            "a few tenths), which depends on the model and the bit width: the best "
                                            "4-bit method raises the lab's 135M model's perplexity by over 10%."),
    Cause("kv-format-not-scale", "§2.3", "It ranks KV-cache formats by number type alone (FP8 usually safe, INT8 "
                                         "needs care), when the scale's granularity matters as much: INT8 with "
                                         "per-token scales keeps more precision than FP8 with one per-tensor scale, "
                                         "as its own advice on per-token scales later in §2.3 implies."),
    Cause("draft-cost-fixed", "§5.1", "It takes a draft's cost c to be 0.03-0.1 of a target step, when c is the "
                                      "drafter's time per step over the target's, which its kind sets: an n-gram "
                                      "lookup costs far less, and a draft that runs a model forward (layer-skip, a "
                                      "quantized copy) pays fixed per-step costs that do not shrink with its size."),
    Cause("acceptance-cut-off", "§5.1", "It puts speculation's break-even at an acceptance rate of 0.4 alone, when by "
                                        "its own formula a = 0.4 with c = 0.05 still gives 1.37x at k = 4 (1.42x at "
                                        "k = 2): where speculation stops paying depends on c and k too."),
    Cause("verify-one-step", "§5.1", "It prices verifying k drafts as one target step (a round costs 1 + k c), when "
                                     "verification is a (k+1)-token forward with k+1 LM-head rows, which costs more "
                                     "than a one-token step unless the step is wholly bound by reading weights."),
    Cause("acceptance-by-task", "§5.1", "It attaches acceptance rates to the task type (code, rewriting, translation "
                                        "and summarization at 0.7 or more, open-ended writing under 0.5), when "
                                        "acceptance depends as much on the drafter: on the same prompts the lab's "
                                        "three drafters fall on both sides of both lines."),
    Cause("mask-share", "§5.3", "It puts the vocabulary mask at 20-30% of a step at small batch, when its share "
                                "depends on how the mask is computed (a precompiled one is a few percent at batch 1, "
                                "one tried token by token nearly the whole step) and grows with the batch, one mask "
                                "per row, rather than being a small-batch cost."),
    Cause("nesting-explodes", "§5.3", "It expects deep nesting to blow up the state machine a JSON schema compiles "
                                      "to, as it would a finite automaton, when constrained decoders compile schemas "
                                      "to a pushdown automaton whose stack takes nesting and recursion at a cost "
                                      "that grows slower than the depth."),
    Cause("rounded-down", "§6.2", "Its prose prints 70e9 x 0.55 B = 35.86 GiB as 35.8, where its own code prints "
                                  "35.9."),
)


def c(n: int, section: str, claim: str, article: str, **kw) -> Claim:
    return Claim(f"003-{n:02d}", "003", section, claim, article, **kw)


def kv(claim: str) -> Link:
    return Link(KV, claim)


CLAIMS = [
    c(1, "§1.1", "A 70B model stored in FP16 takes 140 GB and does not fit one 80 GB card.", "140 GB",
      link=Link(PAR, "a 70B model in FP16 takes 140 GB", lab_pattern=r"(?P<v>\d+(?:\.\d+)?) GB"),
      rule=Number("140", exact=False)),
    c(2, "§1.1", "In INT4 with group scales and zero points a 70B model takes 38-42 GB.", "38-42 GB",
      link=Link(MEM, "70B in INT4 with group scales"), rule=Range("38", "42")),
    c(3, "§1.1", "KV per token for 32 layers, 8 KV heads, head_dim 128 in FP16 is 131,072 B (128 KB).", "131072 B",
      link=Link(MEM, "KV per token, 32 layers x 8 KV heads"), rule=Number("131072")),
    c(4, "§1.1", "One 8K-token request of that model holds 1 GB of KV.", "1 GB",
      link=Link(MEM, "same model, one request of 8K tokens"), rule=Number("1")),
    c(5, "§1.1", "Thirty-two such requests hold 32 GB of KV (repeated in §6.2).", "32 GB",
      link=Link(MEM, "KV of 8K x 32 requests"), rule=Number("32")),
    c(6, "§1.1", "With MHA (32 KV heads) an 8K-token request holds 4 GB of KV.", "4 GB",
      link=Link(MEM, "MHA (32 KV heads)"), rule=Number("4")),
    c(7, "§1.1", "Activations need a 2-4 GB margin.", "2-4 GB", verdict=NOT_CHECKABLE,
      why="a safety margin that depends on the batch's token budget, not one number"),
    c(8, "§1.2", "Decode reads 40 GB of INT4 weights at 2 TB/s in 20 ms: at most 50 tokens/s per request.", "20 ms",
      link=Link(MEM, "decode lower bound for 40 GB"), rule=Number("20")),
    c(9, "§1.2", "Real kernels reach 60-70% of that bound: about 30 tokens/s per request.", "about 30 tokens/s",
      verdict=NOT_CHECKABLE, why="needs a 2 TB/s GPU and a 70B INT4 model (notebook 01 measures the CPU engine at "
                                 "3.2x its own bound)"),
    c(10, "§1.2", "Prefill of 4096 tokens on a 70B model is about 5.7e14 FLOPs (573 TFLOPs).", "5.7e14",
      link=Link(MEM, "prefill FLOPs of a 70B model on 4096 tokens"), rule=Number("5.73e14")),
    c(11, "§1.2", "At 300+ TFLOP/s and 40% utilisation that prefill takes 4+ seconds.", "4+ s", verdict=NOT_YET,
      why="arithmetic on the row above (lab.roofline's prefill time at 40% of an A100's 312 TFLOP/s); no row "
          "computes it",
      decider="arithmetic: 5.73e14 FLOPs at 40% of an A100's 312 TFLOP/s (lab.roofline), against 4+ s"),
    c(12, "§1.3", "A 50 ms TPOT is 20 tokens/s per request; 32 concurrent requests make 640 tokens/s.", "640 tokens/s",
      verdict=NOT_YET, why="arithmetic no notebook row states (1000/50 x 32 = 640)",
      decider="arithmetic: 1000 / 50 x 32, against 640"),
    c(13, "§2", "INT4 quantization often doubles throughput on the same card.", "2x", verdict=NOT_YET,
      why="notebook 01's int4_decode table measures INT4 against bf16 at batch 1 and 32 but has no row for "
          "throughput",
      decider="notebook 01's int4_decode table as a claims row: tokens per second, INT4 against bf16 at batch 32, "
              "against 2x"),
    c(14, "§2.1", "FP8 weights are nearly lossless and need no calibration.", "nearly lossless", verdict=NOT_YET,
      why="notebook 02 quantizes weights to int8, int4 and int3, not fp8",
      decider="notebook 02's accuracy pipeline with fp8 (e4m3) weights: perplexity and the sensitive pass rate "
              "against bf16"),
    c(15, "§2.1", "AWQ is steadier on instruction and chat tasks; GPTQ is slightly better in perplexity; the gap is "
                  "small.", "GPTQ <= AWQ in perplexity",
      link=Link(QUANT, "GPTQ is slightly better than AWQ in perplexity (w4g64, code)"),
      why="the perplexity half, on held-out code at w4g64 (a paired interval over sequences); notebook 02's claims "
          "table has the prose domain and the sensitive-set half (AWQ against GPTQ) in rows of their own",
      cause="gptq-over-awq"),
    c(16, "§2.1", "INT4 decode is 2-2.5x faster than FP16 (batch 1).", "2-2.5x",
      link=Link(MEM, "INT4 decode is 2-2.5x faster than FP16 (batch 1)"), rule=Range("2", "2.5")),
    c(17, "§2.1", "INT4 decode is 2-2.5x faster than FP16 (batch 32).", "2-2.5x",
      link=Link(MEM, "INT4 decode is 2-2.5x faster than FP16 (batch 32)"), rule=Range("2", "2.5"),
      cause="int4-speedup-fixed"),
    c(18, "§2.2", "Calibrate on 256-512 samples of real traffic; a short-QA calibration set degrades long-document "
                  "summaries.", "degrades",
      link=Link(QUANT, "a short-Q&A calibration set degrades long-document summarization"),
      why="KL on held-out Spec-Bench summarization prompts, short-Q&A against the stratified mix, paired over prompts"),
    c(19, "§2.2", "Perplexity barely moves under quantization while task metrics drop.", "perplexity +0.x",
      link=Link(QUANT, "perplexity barely moves under 4-bit weight quantization"),
      why="the best 4-bit method's perplexity rise on two held-out domains; notebook 02's claims table tests the "
          "task-metric half per method (the sensitive pass rate, paired over items)", cause="perplexity-insensitive"),
    c(20, "§2.3", "An FP8 KV cache is usually safe.", "safe", link=kv("FP8 (e4m3, calibrated per-tensor scale)")),
    c(21, "§2.3", "An INT8 KV cache needs care.", "needs care", link=kv("INT8 needs care"),
      cause="kv-format-not-scale"),
    c(22, "§2.3", "An INT4 KV cache is not for online serving.", "not safe", link=kv("INT4 is not safe")),
    c(23, "§2.3", "Keys are more sensitive to quantization than values.", "K > V",
      link=kv("keys are more sensitive than values (int4/per-token)")),
    c(24, "§2.3", "Keys want finer (per-channel) scales.", "per-channel K", link=kv("keys want per-channel scales")),
    c(25, "§2.3", "Per-token dynamic scales beat a per-tensor static scale on long context.", "per-token",
      link=kv("per-token dynamic beats per-tensor static on long context (int8)")),
    c(26, "§2.3", "KV quantization error grows with context, so short prompts hide it.", "grows",
      link=kv("the error grows with context")),
    c(27, "§3.1", "Reserving 4096 tokens for a 500-token request wastes about 80%.", "about 80%", verdict=NOT_YET,
      why="notebook 01's paging_waste table computes waste per allocation policy but has no claims row "
          "(1 - 500/4096 is 88%)",
      decider="arithmetic: 1 - 500/4096 (notebook 01's paging_waste table), against about 80%"),
    c(28, "§3.1", "Paging cuts KV waste from over 60% to single digits.", "> 60% -> < 10%", verdict=NOT_YET,
      why="notebook 01's paging_waste table, no claims row",
      decider="notebook 01's paging_waste table as a claims row: a static reservation's waste against > 60%, "
              "paging's against < 10%"),
    c(29, "§3.2", "Set max_num_seqs to about 80% of what memory allows; max batched tokens 2048-8192.", "80%",
      verdict=NOT_CHECKABLE, why=SETTING),
    c(30, "§3.3", "Prefix caching cuts TTFT substantially with a long fixed system prompt.", "substantially",
      verdict=NOT_YET, why=f"{NO_ROW_06}: TTFT P50 2.6x lower with a 512-token shared prompt",
      decider="notebook 06's prefix_caching table as a claims row: TTFT P50 with and without a long shared system "
              "prompt"),
    c(31, "§4.1", "Tiled attention with an online softmax keeps the scores on chip, so attention memory grows linearly "
                  "rather than quadratically with context.", "quadratic -> linear", verdict=NOT_YET,
      why="the lab's Triton paged attention kernels (kernels/paged_attention.py) are of that kind and their traffic "
          "is checked against formulas, but no notebook row measures memory against context",
      decider="peak attention memory of the lab's tiled (Triton) attention against an eager one, swept over the "
              "context length"),
    c(32, "§4.2", "Kernel launches take about 20% of decode time; CUDA graphs remove it.", "about 20%",
      verdict=NOT_CHECKABLE, why="needs a GPU (CUDA graphs)"),
    c(33, "§4.3", "TP without fast links: communication eats the gain, even slower than one card.", "slower",
      link=Link(PAR, "TP without fast links")),
    c(34, "§4.3", "In PP, micro-batches at least 4x the stages fill most of the bubble.", "m >= 4p",
      link=Link(PAR, "PP: micro-batches at least 4x")),
    c(35, "§4.3", "TP inside a node of at most 8 cards; PP across nodes.", "TP <= 8",
      link=Link(PAR, "TP inside a node of at most 8 cards")),
    c(36, "§5.1", "A small draft model costs c = 0.03-0.1 of the target (the n-gram drafter).", "0.03-0.1",
      link=Link(SPEC, "draft cost ratio c is typically 0.03-0.1 (ngram)"), rule=Range("0.03", "0.1"),
      why="c = 0.001 is far below the range: the range does not describe this drafter", cause="draft-cost-fixed"),
    c(37, "§5.1", "c = 0.03-0.1 (the lab's layer-skip drafter).", "0.03-0.1",
      link=Link(SPEC, "draft cost ratio c is typically 0.03-0.1 (layerskip)"), rule=Range("0.03", "0.1"),
      cause="draft-cost-fixed"),
    c(38, "§5.1", "c = 0.03-0.1 (a weight-quantized copy as draft).", "0.03-0.1",
      link=Link(SPEC, "draft cost ratio c is typically 0.03-0.1 (quantized)"), rule=Range("0.03", "0.1"),
      cause="draft-cost-fixed"),
    c(39, "§5.1", "a = 0.7, k = 4, c = 0.05 give 2.77 tokens a round and about 2.3x.", "2.3x",
      link=Link(SPEC, "a=0.7, k=4, c=0.05", lab_pattern=r"speedup = (?P<v>[\d.]+)"), rule=Number("2.3")),
    c(40, "§5.1", "At a = 0.5 the round yields 1.94 tokens and about 1.6x.", "1.6x",
      link=Link(SPEC, "a=0.5: E = 1.94", lab_pattern=r"speedup = (?P<v>[\d.]+)"), rule=Number("1.6")),
    c(41, "§5.1", "Below a = 0.4 speculation is hardly worth it.", "a < 0.4", link=Link(SPEC, "a below 0.4"),
      cause="acceptance-cut-off"),
    c(42, "§5.1", "Verifying k drafts costs one target step (a round costs 1 + k c).", "1 + k c",
      link=Link(SPEC, "verifying k drafts costs one target step"), cause="verify-one-step"),
    c(43, "§5.1", "Acceptance decides everything.", "a decides", link=Link(SPEC, "acceptance decides everything")),
    c(44, "§5.1", "Code, rewriting, translation and summarization reach a >= 0.7; open-ended writing falls under 0.5 "
                  "(n-gram drafter).", "a >= 0.7 / < 0.5",
      link=Link(SPEC, "open-ended writing a < 0.5 (ngram)"), cause="acceptance-by-task"),
    c(45, "§5.1", "The same, for the layer-skip drafter.", "a >= 0.7 / < 0.5",
      link=Link(SPEC, "open-ended writing a < 0.5 (layerskip)"), cause="acceptance-by-task"),
    c(46, "§5.1", "The same, for a quantized copy as drafter.", "a >= 0.7 / < 0.5",
      link=Link(SPEC, "open-ended writing a < 0.5 (quantized)"), cause="acceptance-by-task"),
    c(47, "§5.2", "N-gram drafts work wonders for rewriting and RAG at almost zero cost.", "near-zero cost",
      link=Link(SPEC, "n-gram drafts work wonders")),
    c(48, "§5.2", "A same-family small model drafts best.", "same family", link=Link(SPEC, "same-family small model")),
    c(49, "§5.3", "Constrained decoding makes the format absolutely correct.", "100% valid",
      link=Link(STRUCT, "makes the format absolutely correct")),
    c(50, "§5.3", "... and faster, through fewer retries.", "faster", link=Link(STRUCT, "and faster: a smaller")),
    c(51, "§5.3", "Masking a 100k+ vocabulary takes 20-30% of a step at small batch (batch 1).", "20-30%",
      link=Link(STRUCT, "at small batch (batch 1)", lab_pattern=r"(?P<v>[\d.]+)% of a"), rule=Range("20", "30"),
      cause="mask-share"),
    c(52, "§5.3", "The same at batch 64.", "20-30%",
      link=Link(STRUCT, "at small batch (batch 64)", lab_pattern=r"(?P<v>[\d.]+)% of a"), rule=Range("20", "30"),
      cause="mask-share"),
    c(53, "§5.3", "The same, projected to a GPU with a 128K vocabulary.", "20-30%",
      link=Link(STRUCT, "(the same, projected)", lab_pattern=r"(?P<v>[\d.]+)% at batch 1\b"),
      rule=Range("20", "30"), cause="mask-share"),
    c(54, "§5.3", "Precompiling the state transitions reduces masking to a lookup and a bitwise AND.", "lookup",
      link=Link(STRUCT, "precompiling the state transitions")),
    c(55, "§5.3", "Deeply nested schemas make the state machine explode.", "explodes",
      link=Link(STRUCT, "deeply nested schemas"), cause="nesting-explodes"),
    c(56, "§5.3", "Vocabularies run to a hundred thousand tokens or more.", "100k+",
      link=Link(STRUCT, "vocabularies run to a hundred thousand")),
    c(57, "§6.2", "Fixed-length load tests seriously overestimate performance.", "overestimate", verdict=NOT_YET,
      why=f"{NO_ROW_06}: fixed lengths at the P50 report 1.46x the log-normal's goodput",
      decider="notebook 06's goodput with fixed against log-normal request lengths, as a claims row"),
    c(58, "§6.2", "Run production at about 70% of the throughput knee.", "70%", verdict=NOT_CHECKABLE,
      why=f"{SETTING} (notebook 06 applies it: knee 8, operating point 6)"),
    c(59, "§6.2", "The sizing example's weights: 70B at 0.55 bytes/param are 35.8 GB.", "35.8 GB",
      link=Link(MEM, "weights of 70B at 0.55 bytes/param"), rule=Number("35.8"),
      why="70e9 x 0.55 B = 35.86 GiB, which prints as 35.9 (the article's own code prints 35.9): a rounding slip, "
          "not a wrong figure; the notebook held this one row to 0.05% and called it wrong", cause="rounded-down"),
    c(60, "§6.2", "Weights 35.8 + KV 32 + 3 GB reserve make about 71 GB, just fitting an 80 GB card.", "70+ GB",
      verdict=NOT_YET, why=SECTION_6_2,
      decider="lab.memory's weights + KV of the §6.2 example with 80 layers, against 71 GB on an 80 GB card"),
    c(61, "§6.2", "Dropping to 24 requests or an FP8 KV cache both make the example fit.", "both fit",
      verdict=NOT_YET, why=SECTION_6_2,
      decider="lab.memory's totals of the §6.2 example with 80 layers, at 24 requests and with an FP8 KV cache, "
              "against 80 GB"),
]
