"""Every numeric or testable claim of seeds/002 (first-token latency on Kubernetes/ACK), by section.

Notebook 09 (`lab.studies.ttft_claims`) checks its first-token compute, INT8 memory, prefix-cache hit-rate and
cold-start claims; notebook 06 (`lab.studies.serving.claims`) what prefix caching does under load; notebook 08 its
memory-per-GPU figures; notebook 03 its FP8-against-INT8 KV claim; notebook 01 what its own figures settle against a datasheet (`lab.claims.arithmetic.ttft_article`).
The rest need a cluster or GPUs, are settings, or are not yet checked (with what would check them). Sections follow
the article's headings: §1.2 is 一.2, §2.3 is 二.3. A claim quotes the article's phrase in 「」, as the article
prints it with its pinyin glosses dropped ("時(shí)" is "時").

Scope (issue 40): most of the article is about GPU serving, TTFT in milliseconds and load times in seconds on
A100s and H100s: those rows are "gpu-speed", so what the lab measures of them on its CPU shows as the verdict in
this setting, and the verdict is "not checkable here" unless a GPU measurement or the arithmetic refutes them;
counts of FLOPs and bytes are "behaviour", the article's figures set against datasheets "arithmetic".

Its wrong verdicts come from fewer mistakes (`CAUSES`, which CLAIMS.md counts): three from §4's account of what a
KV cache saves, the rest one row each.
"""

from __future__ import annotations

from lab.claims.record import Assumption, Cause, Claim, Link, Reading
from lab.claims.model_class import ModelClass
from lab.claims.rules import ARGUMENT, ARITHMETIC, BY_ARGUMENT, NOT_CHECKABLE, NOT_YET, Bound, Number, Range, run_cell

MEM, KV, NB06, PAR, NB09 = ("01_memory_accounting", "03_kv_quantization", "06_serving_ttft", "08_parallelism",
                             "09_ttft_claims")
CLUSTER = "needs a Kubernetes cluster with GPU nodes"
GPUS_70B = "needs a 70B checkpoint on A100/H100 GPUs"
SETTING = "a recommended setting or procedure, not a statement with a truth value"
GPU, ARITH, BEHAVIOUR = "gpu-speed", "arithmetic", "behaviour"
# notebook 09's INT8 rows judge the 70B's weights, embeddings in bf16; "about" is within 5 points
INT8_70B = r"llama-3-70b (?P<v>[\d.]+)%"
# The readings of 「顯存占用」 (memory use) that INT8 cuts: the weights alone, or the weights and a KV cache.
W70 = Reading("weights only, 70B", INT8_70B)
W70_KV = Reading("weights and a 32K bf16 KV cache, 70B", r"llama-3-70b [\d.]+% \(all int8 [\d.]+%, with 32768 bf16 KV "
                                                        r"tokens (?P<v>[\d.]+)%")
W8_KV = Reading("weights and a 32K bf16 KV cache, 8B", r"llama-3-8b [\d.]+% \(all int8 [\d.]+%, with 32768 bf16 KV "
                                                      r"tokens (?P<v>[\d.]+)%")


# The article's mistakes behind its wrong verdicts (a claim's `cause`), in the order they first appear.
CAUSES = (
    Cause("load-bound-by-hbm", "§3.1", "It puts the limit of loading a model on GPU memory bandwidth, when the "
                                       "weights come from storage and over PCIe, each far slower than HBM: by its own "
                                       "10 s for a 70B, writing the A100's memory is under 1% of the load."),
    Cause("warm-up-does-startup", "§3.2", "It has a warm-up request load the weights, initialise the KV cache and "
                                          "compile CUDA graphs, which the engines it names do at start-up, before "
                                          "the server takes its first request."),
    Cause("cache-shrinks-each-token", "§4", "It takes a KV cache to make each token's forward cheaper (down to its "
                                            "attention scores; the first token's compute from O(L^2) to O(L)), when "
                                            "a cache only lets tokens already computed be skipped: a new prompt's "
                                            "first token costs the same with or without it, and each token not "
                                            "cached still runs every linear layer."),
    Cause("truncation-helps-prefix", "§4.2", "It expects normalising prompts to a fixed window to raise prefix-cache "
                                             "matches, when a prefix cache matches from the first token and a window "
                                             "over a growing chat moves the first token every turn."),
    Cause("batch-fill-wait", "§5.1", "It has the first request wait for a large batch to fill under continuous "
                                     "batching, which admits a waiting request at the next step whatever the batch "
                                     "limit; a larger batch costs TTFT through longer steps, not by waiting."),
    Cause("vllm-version", "§5.2", "It dates vLLM's FP8 KV cache to a version 2.5, which vLLM never had: its releases "
                                  "are numbered 0.x, and the FP8 KV cache came in early 2024."),
    Cause("calibration-length-cost", "§5.2", "It has dequantization cost more once inputs pass the calibration length, "
                                             "when dequantizing costs the same per weight and per token at any "
                                             "length: the calibration length sets the scales, not their cost."),
    Cause("tmp-shm", "§2.2", "It calls /tmp/model_cache shared memory, when /tmp is an ordinary directory of the "
                             "container's own filesystem; Linux shared memory is /dev/shm."),
    Cause("utilisation-reading", "§5.3", "It reads GPU utilisation above 80% as compute fully used, when the counter "
                                         "is the share of time any kernel runs: a bandwidth-bound decode shows near "
                                         "100% at a few percent of peak FLOPs."),
    Cause("static-oom-gc", "§6.2", "It has a static KV reservation cause OOM or frequent GC, when a static reservation "
                                   "fails at admission, which is what keeps a running request from an OOM, and GPU "
                                   "memory has no garbage collector.")
)


def _miss_memory_over_compute(prompt: float) -> float:
    """A miss's prefill of `prompt` tokens on its 70B and A100: roofline memory over compute time, by the calls
    notebook 01's row makes (`lab.claims.arithmetic.ttft_article.miss_bound`, which the ledger may not import: a cycle)."""
    from lab.machine import roofline as rl
    from lab.machine.hardware import get_gpu
    from lab.memory import ModelShape

    cost = rl.model_cost(ModelShape.preset("llama-3-70b"), "bf16", "bf16")
    t = rl.prefill_time_lower_bound(get_gpu("a100-sxm-80gb"), rl.prefill_flops(cost, int(prompt)),
                                    rl.prefill_bytes(cost, int(prompt)))
    return t.memory_s / t.compute_s


def c(n: int, section: str, claim: str, article: str, **kw) -> Claim:
    return Claim(f"002-{n:02d}", "002", section, claim, article, **kw)


CLAIMS = [
    c(1, "§0", "Under high concurrency TTFT climbs from hundreds of milliseconds to seconds while GPU utilisation "
               "stays under 30% (「GPU利用率卻長期低于30%」).", "< 30%", verdict=NOT_CHECKABLE, why=CLUSTER,
      about="a GPU inference service on Kubernetes (ACK) under high concurrency", scope=GPU),
    c(2, "§1.1", "Loading a 70B model on a cold start can take over 10 s (「70B模型冷啟動時，模型加載時長可超10秒」; "
                 "again in §3).", "> 10 s",
      link=Link(NB09, "70B model on a cold start can take over 10 s"),
      about="70B, bf16 weights, loaded on a GPU server from its own storage", scope=GPU),
    c(3, "§1.1", "A P99 TTFT of 500 ms is the common SLA line (「500ms是常見SLA紅線」).", "500 ms",
      verdict=NOT_CHECKABLE, why="a convention, not a measurable claim", about="any online LLM service", scope=GPU),
    c(38, "§1.1", "On a KV-cache miss each request recomputes K and V and memory bandwidth becomes the bottleneck "
                  "(「顯存帶寬反而成為瓶頸」).", "memory-bound",
      link=Link(MEM, "002 §1.1: on a KV-cache miss memory bandwidth", evidence=ARITHMETIC), rule=Bound("1"),
      assumptions=(Assumption("the prompt a miss prefills", 1024, "tokens",
                              "its §6.1 example's 1024; the sentence states none", 50, 4096,
                              "from a chat turn to a long document", figure=_miss_memory_over_compute),),
      about="70B, bf16 weights and KV, a prefill on one A100, the prompt's length unstated", scope=GPU),
    c(4, "§1.2", "Dynamic KV management such as PagedAttention lowers TTFT by 30-50% "
                 "(「PagedAttention等動態KV Cache管理可降低30%-50%首字延遲」).", "30-50%", verdict=NOT_CHECKABLE,
      why="a TTFT cut on GPU serving: paging admits more requests into GPU memory and so shortens queues, by how much "
          "the GPU's memory and the load decide; decided by TTFT P99 on a GPU server with paged and with statically "
          "pre-allocated KV at high concurrency (the lab's engine on this CPU would give a verdict in this setting "
          "only)", about="vLLM-class GPU serving at high concurrency, paged against static KV", scope=GPU),
    c(5, "§2", "Without affinity about 15% of inference pods land on CPU nodes, multiplying TTFT by 5 or more "
               "(「約有15%被分配至CPU節點兜底，導致TTFT激增5倍以上」).", "15%, > 5x", verdict=NOT_CHECKABLE,
      why=f"the 15% {CLUSTER}; 'over 5x' holds by construction for a CPU node against a GPU node (the CPU's FLOP/s "
          "and memory bandwidth are far below a datacenter GPU's), so only the 15% carries information",
      about="a Kubernetes cluster without node affinity; a 70B-class model on CPU nodes against GPU nodes", scope=GPU),
    c(6, "§2.1", "Preferred affinity (weight 80, nodes under 70% utilisation) cuts TTFT fluctuation by about 40% "
                 "(「可將TTFT波動降低約40%」).", "about 40%", verdict=NOT_CHECKABLE, why=CLUSTER,
      about="GPU nodes of a Kubernetes cluster under load", scope=GPU),
    c(45, "§2.1", "Put no more than two inference containers on one GPU node: past a threshold, contention for "
                  "memory bandwidth degrades TTFT (「避免同一GPU節點上部署超過兩個推理容器」).", "<= 2 per node",
      verdict=NOT_CHECKABLE, why=SETTING, about="GPU nodes shared by inference pods", scope=GPU),
    c(7, "§2.2", "A 70B model in FP16 needs about 140 GB of GPU memory (「需要約140GB顯存」).", "about 140 GB",
      link=Link(PAR, "a 70B model in FP16 takes 140 GB", lab_pattern=r"(?P<v>\d+(?:\.\d+)?) GB", evidence=ARITHMETIC),
      rule=Number("140", exact=False), about="70B, fp16 weights", scope=ARITH),
    c(39, "§2.2", "On a single card a 70B model in FP16 runs short of GPU memory and swaps, and TTFT soars "
                  "(「若僅單卡推理，TTFT會因顯存不足頻繁觸發swap而飆升」).", "short of memory",
      link=Link(MEM, "002 §2.2: a 70B model in FP16 runs short of memory", evidence=ARITHMETIC), rule=Bound("1"),
      why="the shortfall is checked; the swap is the notebook's note", about="70B, fp16 weights, one A100 80GB",
      scope=ARITH),
    c(8, "§2.2", "With TP=8 on 8 A100s each card holds about 17.5 GB (「每卡17.5GB」; repeated in §6.1).", "17.5 GB",
      link=Link(PAR, "over 8 A100s with TP: 17.5 GB", lab_pattern=r"(?P<v>\d+(?:\.\d+)?) GB \(", evidence=ARITHMETIC),
      rule=Number("17.5", exact=False), why="weights only: the KV cache and activations come on top",
      about="70B, fp16 weights, TP=8 over 8 A100s", scope=ARITH),
    c(9, "§2.2", "Sharded parallel loading at TP=8 cuts a 70B cold start from 15 s to about 4 s "
                 "(「TP=8時70B模型冷啟動加載時間從15秒降至4秒左右」).", "15 -> 4 s (3.75x)",
      link=Link(NB09, "sharded parallel loading at TP=8", lab_pattern=run_cell("x faster: ")), rule=Bound("3.75"),
      about="70B, bf16 checkpoint, a cold start, TP=8 over 8 A100s on one node", scope=GPU),
    c(10, "§2.2", "Request 1.2x the model's peak memory per pod (「模型峰值值的1.2倍」).", "1.2x", verdict=NOT_CHECKABLE,
      why=SETTING, about="a GPU pod's memory request, KV buffer included", scope=BEHAVIOUR),
    c(11, "§2.3", "A new node takes 40 s to 2 min to come up (「新建節點平均需40秒至2分鐘」).", "40 s - 2 min",
      verdict=NOT_CHECKABLE, why="needs a cloud provider's node pool", about="a cloud provider's GPU node pool (ACK)",
      scope=GPU),
    c(46, "§2.3", "Scale out (HPA) when TTFT P99 exceeds 500 ms for 10 s (「當該指標超過500ms且持續10秒時觸發擴容」).",
      "500 ms, 10 s", verdict=NOT_CHECKABLE, why=SETTING, about="HPA on a GPU serving deployment", scope=GPU),
    c(12, "§2.3", "A warm pool of 2-3 loaded idle pods cuts cold-start TTFT anomalies from 3 s to under 300 ms "
                  "(「該方案可將冷啟動導致的TTFT異常從平均3秒降至300ms以內」).", "3 s -> < 300 ms",
      link=Link(NB09, "warm pool of loaded idle pods"),
      about="70B-class GPU pods on a cluster with an autoscaler, 2-3 loaded idle pods", scope=GPU),
    c(13, "§2.3", "8-card TP across nodes adds 10-15% to TTFT (「跨節點通信延遲可導致TTFT增加10%-15%」).", "10-15%",
      link=Link(PAR, "8-card TP across nodes"), about="70B, TP=8 across nodes against within one node", scope=GPU),
    c(14, "§3.1", "Sharded loading on 8 A100s cuts initialisation to about 1/8 of a single-card load "
                  "(「分片加載可將初始化時間壓縮至 1/8 左右」).", "1/8", verdict=NOT_CHECKABLE,
      why="needs 8 GPUs; 8 loaders share what a load reads (one disk, the host's memory), so 8x needs every part of "
          "a load to split (notebook 09's sharded-loading rows give this machine's ceiling); decided by a 70B's "
          "initialisation timed on 1 and on 8 A100s from the same storage, against 1/8",
      about="70B, bf16, sharded loading on 8 A100s against one", scope=GPU),
    c(40, "§3.1", "On one machine loading a large model is bound by GPU memory bandwidth "
                  "(「單機加載大模型受限于顯存帶寬」).", "bound by GPU memory bandwidth",
      link=Link(MEM, "002 §3.1: loading a large model on one machine is bound by GPU memory", evidence=ARITHMETIC),
      rule=Bound("0.5"), cause="load-bound-by-hbm",
      assumptions=(Assumption("the share of a load a resource must take to 'bound' it (受限于)", 0.5, "of the load",
                              "the notebook's reading: over half", 0.3, 0.8, "from a large part to most of it",
                              rule=lambda x: Bound(repr(x))),),
      about="70B, bf16 weights, loaded onto an A100", scope=GPU),
    c(15, "§3.1", "Creating the torch.distributed process groups at container start saves 200-500 ms of handshake "
                  "(「能再節省 200–500ms 的握手開銷」).", "200-500 ms", verdict=NOT_CHECKABLE,
      why="a GPU communicator's setup (NCCL over 8 GPUs); lab.parallel's gloo workers on this CPU would time "
          "something else; decided by NCCL process-group creation timed on 8 GPUs at container start and lazily, "
          "against 200-500 ms", about="torch.distributed (NCCL) process groups for TP=8 on GPUs", scope=GPU),
    c(16, "§3.1", "Beyond a parallel degree of 4 the all-reduce wait can exceed compute: for 70B, 4 cards usually "
                  "beat 8 unless inputs exceed 4096 tokens (「4 卡通常好于 8 卡」).", "TP 4 > TP 8",
      verdict=NOT_YET, why="notebook 08's alpha-beta projection of Llama-3-70B could compare TP=4 with TP=8 on "
                           "NVLink; it projects TP=8 only",
      decider="notebook 08's alpha-beta projection of Llama-3-70B at TP=4 and TP=8 on NVLink, at inputs below and "
              "above 4096 tokens", about="70B on 4 against 8 GPUs over NVLink, inputs below and above 4096 tokens",
      scope=GPU),
    c(17, "§3.2", "Caching weights in /dev/shm or tmpfs brings disk I/O from seconds to milliseconds "
                  "(「使磁盤 I/O 從秒級降至毫秒級」).", "seconds -> milliseconds",
      link=Link(NB09, "/dev/shm or tmpfs", lab_pattern=run_cell("from memory ")), rule=Bound("1", above=False),
      about="70B, bf16 weights read on a GPU server from disk and from /dev/shm (tmpfs)", scope=GPU),
    c(18, "§3.2", "An 8-token warm-up request at start lowers real requests' TTFT by 30-50% "
                  "(「將后續真實請求的首字延遲降低 30%–50%」).", "30-50%",
      link=Link(NB09, "8-token warm-up request", lab_pattern=run_cell("% lower: ")), rule=Range("30", "50"),
      about="a GPU serving engine (vLLM-class, CUDA graphs); the first requests after start", scope=GPU),
    c(41, "§3.2", "The warm-up request triggers weight loading and KV-cache initialisation and completes the CUDA "
                  "graph compilation (「觸發模型權重加載和 KV Cache 初始化，同時完成 CUDA Graph 的編譯」).",
      "loads, initialises, compiles", verdict=BY_ARGUMENT, cause="warm-up-does-startup",
      why="the engines the article names do all three at start-up, before the server takes a request: vLLM loads "
          "the weights, profiles memory and allocates its KV pool, then captures its CUDA graphs while the engine "
          "initialises (and logs each), and TensorRT-LLM builds its engine ahead of time; a warm-up request can only "
          "pay what is still lazy (library handles, kernels compiled on first use), which notebook 09's warm-up row "
          "times", about="vLLM and TensorRT-LLM at start-up", scope=BEHAVIOUR),
    c(19, "§3.2", "A warm-up far shorter than typical inputs (64 vs 1024 tokens) leaves KV pre-allocation short "
                  "and raises latency (「預熱時使用 64 tokens」).", "64 vs 1024 tokens", verdict=NOT_CHECKABLE,
      why="about a framework that sizes its KV pre-allocation from the warm-up request: vLLM sizes its KV pool at "
          "start-up from the memory budget, and the lab's engine takes blocks on demand from a fixed pool; the "
          "claim would need the framework named", about="a serving framework's KV pre-allocation after a warm-up",
      scope=BEHAVIOUR),
    c(20, "§4", "On a cache hit a token's compute shrinks to the attention scores alone (「將每token生成的計算量壓縮至僅需注意力」…).",
      "attention only", link=Link(NB09, "compute shrinks to the attention scores alone",
                                  lab_pattern=r"attention (?P<v>[\d.]+)% of it", evidence=ARITHMETIC),
      rule=Number("100", exact=False), why="'attention only': all of what a hit still computes in attention",
      cause="cache-shrinks-each-token", about="70B, bf16, a 512-token prompt with 448 tokens cached (FLOP counts)",
      scope=BEHAVIOUR),
    c(21, "§4", "KV cache reuse lowers TTFT by 30-50% under high concurrency, more for prompts over 1024 tokens "
                "(「KV Cache復用能將TTFT降低30%–50%」).", "30-50%",
      link=Link(NB09, "KV cache reuse lowers TTFT by 30-50%", lab_pattern=run_cell("% lower: ")), rule=Range("30", "50"),
      about="GPU serving under high concurrency, prompts of 1024+ tokens, prefix-cache reuse against none",
      scope=GPU),
    c(22, "§4.1", "The KV cache cuts the first token's compute from O(L^2) to O(L) in the input length L "
                  "(「首字生成時的計算量從O(L2)降至O(L)」).", "O(L^2) -> O(L)",
      link=Link(NB09, "from O(L^2) to O(L)", evidence=ARGUMENT), cause="cache-shrinks-each-token",
      about="any transformer's first token (FLOP counts)", scope=BEHAVIOUR),
    c(23, "§4.1", "For a 70B model at 512 input tokens, the first token takes about 2.5x longer without the cache "
                  "(「約2.5倍于啟用后的耗時」).", "2.5x", verdict=BY_ARGUMENT, cause="cache-shrinks-each-token",
      why="a first token has nothing cached unless an earlier request shared its prefix, so with the cache on and "
          "without it the same 512 tokens are prefilled: 1.00x by construction, which notebook 09 prints but which no "
          "measurement could move (the evidence-level mutation test finds it so). What a cache changes is how much "
          "of the prompt a prefix hit covers: 2.5x is what about 60% of the prompt cached gives (notebook 09's "
          "prefill FLOPs), a property of the traffic, not of the cache",
      about="70B, bf16, a 512-token prompt (FLOP counts)", scope=BEHAVIOUR),
    c(24, "§4.2", "Tuning vLLM's --max-num-seqs serves 2-3x more requests per node without hurting the hit rate "
                  "(「可使單節點同時服務的請求數增加2–3倍而不顯著降低命中率」).", "2-3x", verdict=NOT_YET,
      why="what the scheduler and the prefix cache do, which the lab's engine does the same way on a CPU; no run "
          "sweeps max_num_seqs with a shared prefix",
      decider="notebook 06's shared-system-prompt load with KV_BLOCKS fixed, at max_num_seqs = the operating "
              "concurrency and 2-3x it: requests running at once (2-3x) and the prefix hit rate (within 5 points)",
      about="vLLM-class --max-num-seqs on one node with prefix caching", scope=BEHAVIOUR),
    c(47, "§4.2", "If dynamic KV management beats pre-allocation by more than 25%, cache reuse is exhausted "
                  "(「若動態方案相比預分配方案延遲降低超過25%」).", "> 25%", verdict=NOT_CHECKABLE,
      why=f"{SETTING}: a criterion for reading a load test", about="a GPU load test of pre-allocated against dynamic "
                                                                   "KV", scope=GPU),
    c(48, "§4.2", "Normalising prompt length (truncating to a fixed window) raises the chance that repeated context "
                  "matches the cache, above all in real-time chat (「長度歸一化處理」).", "higher hit rate",
      verdict=BY_ARGUMENT, cause="truncation-helps-prefix",
      why="a prefix cache matches a prompt from its first token; a chat kept to a fixed window of its newest tokens "
          "starts at a different token every turn once it outgrows the window, so truncation turns its hits into "
          "misses, and a window that kept the oldest tokens would drop the newest turn; no truncation makes more "
          "of a prompt match than the whole history does", about="prefix caching (vLLM-class) in multi-turn chat",
      scope=BEHAVIOUR),
    c(25, "§5.1", "Past the optimum a batch step raises TTFT over 20% while throughput gains under 10% "
                  "(「若TTFT上升超過20%而吞吐量提升不足10%」).", "+20% / +10%", verdict=NOT_CHECKABLE,
      why=f"{SETTING} (notebook 06's batch_sweep applies it: it stops at 16 and keeps 8)",
      about="a batch-size sweep on GPU serving (vLLM, TGI)", scope=GPU),
    c(42, "§5.1", "Under continuous batching, an initial batch that is too large makes the first request wait for "
                  "later ones to fill it (「首條請求仍需等待后續請求湊齊batch」).", "waits for the batch",
      verdict=BY_ARGUMENT, cause="batch-fill-wait",
      why="continuous batching, which the sentence names, admits a waiting request at the next step whatever the "
          "batch limit: max_num_seqs caps how many run together and never holds a request for others to arrive "
          "(the lab's scheduler, like vLLM's, schedules what waits at every step); a larger batch raises TTFT "
          "through longer steps and prefills sharing them, as notebook 06's batch_sweep shows, not by waiting",
      about="continuous batching (vLLM, TGI)", scope=BEHAVIOUR),
    c(26, "§5.1", "A 70B on an A100 80GB balances at batch 8-16, and at 16-32 with INT8 "
                  "(「動態batch的平衡點通常落在8-16之間」).", "8-16, 16-32", verdict=NOT_CHECKABLE, why=GPUS_70B,
      about="70B on one A100 80GB, fp16 and INT8", scope=GPU),
    c(27, "§5.2", "INT8 cuts memory use by about 30% against FP16 (「INT8量化通常能降低30%左右的顯存占用」).",
      "about 30%", link=Link(NB09, "INT8 cuts memory use by about 30%", lab_pattern=INT8_70B, evidence=ARITHMETIC),
      rule=Number("30", False, 5 / 30), readings=(W70, W70_KV, W8_KV),
      why="「顯存占用」 read three ways, each judged: the weights alone, or the weights and a 32K bf16 KV cache, of the "
          "70B and of an 8B (the article says 'usually', of no one model)",
      about="70B (and 8B), int8 per-channel weights against fp16, embeddings in 16 bits", scope=BEHAVIOUR),
    c(28, "§5.2", "INT8 cuts matrix time by about 20% and TTFT by 15-25% "
                  "(「減少約20%的矩陣運算時間，從而使首字延遲下降15%-25%」).", "20%, 15-25%", verdict=NOT_CHECKABLE,
      why="needs a GPU with int8 tensor cores (the lab's CPU int8 kernels measure something else)",
      about="INT8 weights on GPUs with int8 tensor cores (TensorRT-LLM, vLLM)", scope=GPU),
    c(29, "§5.2", "Beyond 8K tokens an INT8 KV cache loses enough precision to hurt output quality "
                  "(「8K token以上」).", "8K+", verdict=NOT_CHECKABLE,
      why="the lab's model ends at 8,192 tokens of context (SmolLM2's limit), so 'beyond 8K' cannot be reached here "
          "(notebook 03 measures int8 KV error by position up to 8K); decided by int8 per-token KV error past 8K "
          "tokens on a long-context model", about="an INT8 KV cache past 8K tokens of context", scope=BEHAVIOUR),
    c(51, "§5.2", "For the KV cache FP8 is a finer format than INT8 (「對KV Cache則保留FP16或采用更精細的FP8」).",
      "FP8 finer", link=Link(KV, "for the KV cache FP8 is a finer format than INT8 (per-token scales)"),
      rule=Bound("1", above=False),
      why="mean KL of fp8_e4m3 over int8, both per-token, paired over blocks of one 8K text (below 1 for the claim "
          "to hold); per-tensor scales give the same verdict (notebook 03's claims table)",
      about="a KV cache in fp8 (e4m3) against int8 at the same scale granularity, the article's 70B",
      scope="model-behaviour", model=ModelClass("10B-100B", "dense")),
    c(30, "§5.2", "vLLM introduced an FP8 KV cache mode in version 2.5 (「vLLM在2.5版本中引入的“FP8 KV Cache”模式」).",
      "vLLM 2.5", verdict=BY_ARGUMENT, cause="vllm-version",
      why="vLLM has had no version 2.5: its releases are numbered 0.x (0.11 in late 2025), and its FP8 KV cache came "
          "in early 2024 (FP8 E5M2, vllm-project/vllm#2279; FP8 E4M3 with scales in the v0.4 docs)",
      about="vLLM's release history", scope=ARITH),
    c(43, "§5.2", "When inputs exceed the model's calibration length, TTFT can rise from dequantization overhead "
                  "(「首字延遲反而可能因反量化開銷上升」).", "dequantization overhead", verdict=BY_ARGUMENT,
      cause="calibration-length-cost",
      why="dequantizing costs the same per weight read and, for activations, per token, at any input length: static "
          "scales are fixed numbers, dynamic ones are computed per token alike below and above any length; the "
          "calibration length decides how well the scales fit (accuracy), not what they cost",
      about="INT8/FP8 quantization in a serving framework, inputs past the calibration length", scope=BEHAVIOUR),
    c(31, "§5.3", "With a KV-cache hit rate under 60%, TTFT is 40-70% higher than at a high hit rate "
                  "(「首字延遲通常會比高命中率場景高40%-70%」).", "40-70%",
      link=Link(NB09, "hit rate under 60% raises TTFT", lab_pattern=run_cell("% higher: ")), rule=Range("40", "70"),
      about="GPU serving; a prefix-cache hit rate under 60% against a high one", scope=GPU),
    c(32, "§5.3", "Alert at P99 TTFT > 500 ms for 1 min (scale out) and > 1 s (page an operator) "
                  "(「P99 TTFT>500ms且持續1分鐘」).", "500 ms, 1 s", verdict=NOT_CHECKABLE, why=SETTING,
      about="alerting on a GPU serving deployment", scope=GPU),
    c(49, "§6.1", "The worked example: reserve at least 80 GB per pod, --max-model-len 2048 and --max-num-seqs 16 "
                  "(「為每個Pod預留至少80GB顯存」, 「--max-num-seqs為16」).", "80 GB, 2048, 16",
      verdict=NOT_CHECKABLE, why=SETTING, about="70B with vLLM on A100/H100 nodes, 1024-token inputs",
      scope=BEHAVIOUR),
    c(33, "§6.1", "TP=8 with preloaded weights and parallel initialisation brings cold-start loading from 10+ s to "
                  "3-4 s (「從行業常見的10秒以上壓縮至3-4秒」).", "10+ -> 3-4 s (at least 2.5x)",
      link=Link(NB09, "TP=8 with preloaded weights", lab_pattern=run_cell("x faster: ")), rule=Bound("2.5"),
      about="70B, bf16, weights preloaded on the node, TP=8 over 8 A100/H100s", scope=GPU),
    c(34, "§6.2", "Scheduling alone lowers P99 TTFT fluctuation by 40-60% under high concurrency "
                  "(「高并發下首字延遲的P99波動可降低約40%-60%」).", "40-60%", verdict=NOT_CHECKABLE, why=CLUSTER,
      about="a Kubernetes GPU cluster under high concurrency", scope=GPU),
    c(35, "§6.2", "Preloading plus INT8 cuts memory by about 50% against FP16 (「顯存占用減少約50%」).", "about 50%",
      link=Link(NB09, "INT8 cuts memory by about 50%", lab_pattern=INT8_70B, evidence=ARITHMETIC),
      rule=Number("50", False, 5 / 50), readings=(W70, W70_KV),
      why="「顯存占用」 read two ways, each judged: the 70B's weights alone, or with a 32K bf16 KV cache",
      about="70B, int8 weights against fp16, embeddings in 16 bits",
      scope=BEHAVIOUR),
    c(36, "§6.2", "Preloading plus INT8 cuts model load time by about 60% and TTFT by 30-45% "
                  "(「模型加載時間縮短約60%，首字延遲的整體下降幅度在30%-45%之間」).", "60%, 30-45%",
      link=Link(NB09, "preloading plus INT8 cuts model load time", lab_pattern=run_cell("in %: ")),
      rule=Number("60", False, 5 / 60), why="the load-time part; the TTFT part needs a GPU",
      about="70B, INT8 against FP16 weights, preloaded on a GPU server", scope=GPU),
    c(37, "§6.2", "KV reuse with a fixed system prompt lowers TTFT a further 30-50% (「首字延遲進一步降低30%-50%」).",
      "30-50%", link=Link(NB06, "KV reuse with a fixed system prompt", lab_pattern=run_cell("% lower: ")),
      rule=Range("30", "50"), about="GPU serving, a fixed system prompt, prefix caching on against off", scope=GPU),
    c(44, "§6.2", "With random inputs, paging still lowers TTFT about 10-20% "
                  "(「仍能通過Page管理減少顯存碎片，延遲降低約10%-20%」).", "10-20%",
      link=Link(NB06, "with random inputs, enabling KV reuse", lab_pattern=run_cell("% lower: ")),
      rule=Range("10", "20"), about="GPU serving, random prompts, KV reuse on against off", scope=GPU),
    c(50, "§6.2", "Close the loop: scale out when latency stays over 500 ms with low bandwidth use, and reset "
                  "max-model-len hourly to the P90 input length x 1.2 (「當延遲持續超過500ms」, "
                  "「將其乘以1.2作為新閾值」).", "500 ms, P90 x 1.2", verdict=NOT_CHECKABLE, why=SETTING,
      about="a GPU serving deployment's control loop", scope=GPU),
    # Claims a skeptic's re-read found without a row (issue 48 item 5); the quotes are its words.
    c(52, "§2.2", "Pre-cache the model weights in the image in shared memory, such as /tmp/model_cache "
                  "(「預緩存模型權重至共享內存（如/tmp/model_cache）」).", "/tmp is shared memory",
      verdict=BY_ARGUMENT, cause="tmp-shm",
      why="/tmp is an ordinary directory (the container's writable layer, on most distributions not even a tmpfs), "
          "shared with no other pod; Linux shared memory is /dev/shm, which the article's §3.2 itself names",
      about="a Linux container image on a Kubernetes node", scope=BEHAVIOUR),
    c(53, "§4", "The TTFT cut from KV reuse is larger for prompts over 1024 tokens "
                "(「尤其是在prompt長度超過1024 token的請求中收益更為顯著」).", "> 1024 tokens", verdict=NOT_YET,
      why="notebook 09's hit-rate sweep runs 1024-token prompts only",
      decider="notebook 09's hit-rate sweep at 256, 1024 and 4096-token prompts at one hit rate: the TTFT cut of each",
      about="prefix caching, prompts of a few hundred to a few thousand tokens", scope=BEHAVIOUR),
    c(54, "§5.3", "GPU utilisation above 80% means compute is fully used, while TTFT can still soar from queueing "
                  "(「高利用率（>80%）往往意味著計算資源被充分使用」).", "> 80% = fully used",
      verdict=BY_ARGUMENT, cause="utilisation-reading",
      why="GPU utilisation (nvidia-smi, DCGM's GPU_UTIL) is the share of time any kernel runs, not of the compute "
          "used: a bandwidth-bound decode shows near 100% at a few percent of peak FLOPs; the queueing half holds "
          "(an M/M/1 queue at 80% load waits 4 service times on average)",
      about="a GPU serving deployment's utilisation counters", scope=BEHAVIOUR),
    c(55, "§6.2", "Static pre-allocation (4096 tokens, say) wastes memory and causes OOM or frequent GC "
                  "(「靜態預分配（如固定為4096 tokens）會造成顯存浪費，導致OOM或頻繁GC」).", "OOM or GC",
      verdict=BY_ARGUMENT, cause="static-oom-gc",
      why="the waste holds (seed 003's paging rows, 003-28); but a static reservation fails when a request is "
          "admitted, which is what keeps a running request from an OOM, and GPU memory has no garbage collector",
      about="a serving engine reserving 4096 tokens of KV per request", scope=BEHAVIOUR),
]
