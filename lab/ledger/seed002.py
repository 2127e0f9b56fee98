"""Every numeric or testable claim of seeds/002 (first-token latency on Kubernetes/ACK), by section.

Notebook 09 (`lab.studies.ttft_claims`) checks its first-token compute, INT8 memory, prefix-cache hit-rate and
cold-start claims; notebook 08 its memory-per-GPU figures. The rest are beyond a CPU machine (cluster scheduling,
70B models on A100s) or not yet checked (with what would check them). Sections follow the article's headings:
§1.2 is 一.2, §2.3 is 二.3.

Its wrong verdicts come from fewer mistakes (`CAUSES`, which CLAIMS.md counts); half of them from one, §4's
account of what a KV cache saves.
"""

from __future__ import annotations

from lab.ledger.record import Cause, Claim, Link
from lab.ledger.rules import NOT_CHECKABLE, NOT_YET, Number, Range

PAR = "08_parallelism"
NB09 = "09_ttft_claims"
CLUSTER = "needs a Kubernetes cluster with GPU nodes"
GPUS_70B = "needs a 70B checkpoint on A100/H100 GPUs"
SETTING = "a recommended setting or procedure, not a statement with a truth value"
ITEM2 = "issue 23 item 2"
COLD = f"{ITEM2}: the cold-start decomposition (process start, imports, weight load from a cold and a warm file, " \
       "first request with and without warm-up)"
HIT_RATE = f"{ITEM2}: TTFT against the prefix-cache hit rate swept from 0 to 100%"
# notebook 09's INT8 rows judge the 70B's weights, embeddings in bf16; "about" is within 5 points
INT8_70B = r"llama-3-70b (?P<v>[\d.]+)%"
PREFIX_06 = "notebook 06's prefix_caching table measures TTFT with a shared 512-token prompt (P50 2.6x lower at an " \
            "83% hit rate) but has no claims row"

# The article's mistakes behind its wrong verdicts (a claim's `cause`), in the order they first appear.
CAUSES = (
    Cause("warm-up-share", "§3.2", "It gives an 8-token warm-up request a fixed 30-50% cut in the first real "
                                   "request's TTFT, when a warm-up removes only one-time start-up costs (lazy "
                                   "initialisation, kernel loading, graph capture), whose share of TTFT depends on "
                                   "the runtime and the request."),
    Cause("cache-shrinks-each-token", "§4", "It takes a KV cache to make each token's forward cheaper (down to its "
                                            "attention scores; the first token's compute from O(L^2) to O(L)), when "
                                            "a cache only lets tokens already computed be skipped: a new prompt's "
                                            "first token costs the same with or without it, and each token not "
                                            "cached still runs every linear layer."),
    Cause("int8-saving", "§5.2", "It puts INT8's memory saving against FP16 at about 30% (about 50% in §6.2), when "
                                 "one byte per weight instead of two halves the weights (49% for a 70B with 16-bit "
                                 "embeddings), and 30% holds only where a 16-bit KV cache takes much of the memory."),
    Cause("hit-rate-line", "§5.3", "It gives a KV-cache hit rate under 60% a fixed 40-70% TTFT penalty, when prefill "
                                   "time follows the uncached share of the prompt (1 - h), so the penalty depends on "
                                   "both hit rates and on prefill's share of TTFT, with nothing special at 60%."),
)


def c(n: int, section: str, claim: str, article: str, **kw) -> Claim:
    return Claim(f"002-{n:02d}", "002", section, claim, article, **kw)


CLAIMS = [
    c(1, "§0", "Under high concurrency TTFT climbs from hundreds of milliseconds to seconds while GPU utilisation "
               "stays under 30%.", "< 30%", verdict=NOT_CHECKABLE, why=CLUSTER),
    c(2, "§1.1", "Loading a 70B model on a cold start can take over 10 s.", "> 10 s",
      link=Link(NB09, "70B model on a cold start can take over 10 s", lab_pattern=r"take (?P<v>\d+) s of reading"),
      rule=Range("10", None),
      why="a projection: a 70B's bf16 bytes over this machine's measured cold-read rate"),
    c(3, "§1.1", "A P99 TTFT of 500 ms is the common SLA line.", "500 ms", verdict=NOT_CHECKABLE,
      why="a convention, not a measurable claim"),
    c(4, "§1.2", "Dynamic KV management such as PagedAttention lowers TTFT by 30-50%.", "30-50%",
      verdict=NOT_YET, why="no notebook compares TTFT with paged and with static pre-allocated KV; notebook 01's "
                           "paging_waste table gives the memory side only",
      decider="TTFT on the lab engine with paged KV against a static pre-allocation per request, at high "
              "concurrency, against 30-50%"),
    c(5, "§2", "Without affinity about 15% of inference pods land on CPU nodes, multiplying TTFT by 5 or more.",
      "15%, > 5x", verdict=NOT_YET,
      why="the 15% needs a cluster; the factor can be bounded here: a roofline prefill of a 70B on a server CPU "
          "against an A100 (lab.roofline, lab.hardware) would say whether 5x is anywhere near",
      decider="lab.roofline's prefill time of a 70B on a server CPU (lab.hardware) over that on an A100, against 5x"),
    c(6, "§2.1", "Preferred affinity (weight 80, nodes under 70% utilisation) cuts TTFT fluctuation by about 40%.",
      "about 40%", verdict=NOT_CHECKABLE, why=CLUSTER),
    c(7, "§2.2", "A 70B model in FP16 needs about 140 GB of GPU memory.", "about 140 GB",
      link=Link(PAR, "a 70B model in FP16 takes 140 GB", lab_pattern=r"(?P<v>\d+(?:\.\d+)?) GB"),
      rule=Number("140", exact=False)),
    c(8, "§2.2", "With TP=8 on 8 A100s each card holds about 17.5 GB (repeated in §6.1).", "17.5 GB",
      link=Link(PAR, "over 8 A100s with TP: 17.5 GB", lab_pattern=r"(?P<v>\d+(?:\.\d+)?) GB \("),
      rule=Number("17.5", exact=False), why="weights only: the KV cache and activations come on top"),
    c(9, "§2.2", "Sharded parallel loading at TP=8 cuts a 70B cold start from 15 s to about 4 s.", "15 -> 4 s",
      verdict=NOT_YET, why=f"{COLD}; the TP=8 figure itself {GPUS_70B}",
      decider="notebook 09's cold_start table: load time against checkpoint bytes, projected to a 70B over 8 "
              "parallel readers, against 15 -> 4 s"),
    c(10, "§2.2", "Request 1.2x the model's peak memory per pod.", "1.2x", verdict=NOT_CHECKABLE, why=SETTING),
    c(11, "§2.3", "A new node takes 40 s to 2 min to come up.", "40 s - 2 min", verdict=NOT_CHECKABLE,
      why="needs a cloud provider's node pool"),
    c(12, "§2.3", "A warm pool of 2-3 loaded idle pods cuts cold-start TTFT anomalies from 3 s to under 300 ms.",
      "3 s -> < 300 ms", link=Link(NB09, "warm pool of loaded idle pods", lab_pattern=r": (?P<v>\d+)x$"),
      rule=Range("10", None),
      why="in kind: a request meeting a cold process against a warm one; the 3 s and 300 ms are the deployment's"),
    c(13, "§2.3", "8-card TP across nodes adds 10-15% to TTFT.", "10-15%", link=Link(PAR, "8-card TP across nodes")),
    c(14, "§3", "Sharded loading on 8 A100s cuts initialisation to about 1/8 of a single-card load.", "1/8",
      verdict=NOT_CHECKABLE, why="needs 8 GPUs (and a load bound by one disk's bandwidth would not shrink 8x)"),
    c(15, "§3.1", "Creating the torch.distributed process groups at container start saves 200-500 ms of handshake.",
      "200-500 ms", verdict=NOT_YET,
      why="lab.parallel's spawned workers could time process-group setup (gloo here; NCCL needs GPUs)",
      decider="lab.parallel's spawned workers timing torch.distributed process-group setup (gloo), against "
              "200-500 ms"),
    c(16, "§3.1", "Beyond a parallel degree of 4 the all-reduce wait can exceed compute: for 70B, 4 cards usually "
                  "beat 8 unless inputs exceed 4096 tokens.", "TP 4 > TP 8",
      verdict=NOT_YET, why="notebook 08's alpha-beta projection of Llama-3-70B could compare TP=4 with TP=8 on "
                           "NVLink; it projects TP=8 only",
      decider="notebook 08's alpha-beta projection of Llama-3-70B at TP=4 and TP=8 on NVLink, at inputs below and "
              "above 4096 tokens"),
    c(17, "§3.2", "Caching weights in /dev/shm or tmpfs brings disk I/O from seconds to milliseconds.",
      "seconds -> milliseconds", link=Link(NB09, "/dev/shm or tmpfs")),
    c(18, "§3.2", "An 8-token warm-up request at start lowers real requests' TTFT by 30-50%.", "30-50%",
      link=Link(NB09, "8-token warm-up request", lab_pattern=r"(?P<v>-?\d+(?:\.\d+)?)% lower"), rule=Range("30", "50"),
      why="on a CPU; a GPU's first request also pays kernel loading and graph capture", cause="warm-up-share"),
    c(19, "§3.2", "A warm-up far shorter than typical inputs (64 vs 1024 tokens) leaves KV pre-allocation short "
                  "and raises latency.", "64 vs 1024 tokens", verdict=NOT_CHECKABLE,
      why="about a framework's pre-allocation; the lab's engine allocates KV blocks on demand"),
    c(20, "§4", "On a cache hit a token's compute shrinks to the attention scores alone.", "attention only",
      link=Link(NB09, "compute shrinks to the attention scores alone", lab_pattern=r"attention (?P<v>[\d.]+)% of it"),
      rule=Number("100", exact=False), why="'attention only': all of what a hit still computes in attention",
      cause="cache-shrinks-each-token"),
    c(21, "§4", "KV cache reuse lowers TTFT by 30-50% under high concurrency, more for prompts over 1024 tokens.",
      "30-50%", verdict=NOT_YET, why=f"{PREFIX_06}; {HIT_RATE}",
      decider="notebook 09's hit_rate_sweep and notebook 06's prefix_caching table as claims rows: TTFT with and "
              "without reuse, against 30-50%"),
    c(22, "§4.1", "The KV cache cuts the first token's compute from O(L^2) to O(L) in the input length L.",
      "O(L^2) -> O(L)", link=Link(NB09, "from O(L^2) to O(L)"), cause="cache-shrinks-each-token"),
    c(23, "§4.1", "For a 70B model at 512 input tokens, the first token takes about 2.5x longer without the cache.",
      "2.5x", link=Link(NB09, "2.5x longer without the cache", lab_pattern=r"(?P<v>[\d.]+)x with no cached prefix"),
      rule=Number("2.5", exact=False), cause="cache-shrinks-each-token"),
    c(24, "§4.2", "Tuning vLLM's --max-num-seqs serves 2-3x more requests per node without hurting the hit rate.",
      "2-3x", verdict=NOT_CHECKABLE, why="depends on the starting value and the deployment; not a number to check"),
    c(25, "§5.1", "Past the optimum a batch step raises TTFT over 20% while throughput gains under 10%.",
      "+20% / +10%", verdict=NOT_CHECKABLE,
      why=f"{SETTING} (notebook 06's batch_sweep applies it: it stops at 16 and keeps 8)"),
    c(26, "§5.1", "A 70B on an A100 80GB balances at batch 8-16, and at 16-32 with INT8.", "8-16, 16-32",
      verdict=NOT_CHECKABLE, why=GPUS_70B),
    c(27, "§5.2", "INT8 cuts memory use by about 30% against FP16.", "about 30%",
      link=Link(NB09, "INT8 cuts memory use by about 30%", lab_pattern=INT8_70B), rule=Number("30", False, 5 / 30),
      why="weights only, embeddings in bf16; weights plus a bf16 KV cache come nearer 30% for an 8B",
      cause="int8-saving"),
    c(28, "§5.2", "INT8 cuts matrix time by about 20% and TTFT by 15-25%.", "20%, 15-25%", verdict=NOT_CHECKABLE,
      why="needs a GPU with int8 tensor cores (the lab's CPU int8 kernels measure something else)"),
    c(29, "§5.2", "Beyond 8K tokens an INT8 KV cache loses enough precision to hurt output quality.", "8K+",
      verdict=NOT_YET, why="notebook 03 runs to 8,192 tokens (int8 per-token KV: perplexity +0.02%, no sensitive item "
                           "lost; per-tensor int8: 9.5x that KL in the last position bucket) but has no row for this "
                           "claim, and the run stops at 8K",
      decider="notebook 03's int8 per-token KV error by position, run past 8K tokens, as a claims row"),
    c(30, "§5.2", "vLLM introduced an FP8 KV cache mode in version 2.5.", "vLLM 2.5", verdict=NOT_CHECKABLE,
      why="a version-history fact, not a measurement; issue 23 notes no vLLM 2.5 exists (vLLM's releases were 0.x "
          "when FP8 KV arrived)"),
    c(31, "§5.3", "With a KV-cache hit rate under 60%, TTFT is 40-70% higher than at a high hit rate.", "40-70%",
      link=Link(NB09, "hit rate under 60% raises TTFT",
                lab_pattern=r"\+(?P<v>-?\d+)% \((?P<lo>-?\d+) to (?P<hi>-?\d+)%\)"), rule=Range("40", "70"),
      cause="hit-rate-line"),
    c(32, "§5.3", "Alert at P99 TTFT > 500 ms for 1 min (scale out) and > 1 s (page an operator).", "500 ms, 1 s",
      verdict=NOT_CHECKABLE, why=SETTING),
    c(33, "§6.1", "TP=8 with parallel initialisation brings cold-start loading from 10+ s to 3-4 s.", "10+ -> 3-4 s",
      verdict=NOT_YET, why=f"{COLD}; the TP=8 figure itself {GPUS_70B}",
      decider="notebook 09's cold_start table: load time against checkpoint bytes, projected to a 70B at TP=8, "
              "against 10+ -> 3-4 s"),
    c(34, "§6.2", "Scheduling alone lowers P99 TTFT fluctuation by 40-60% under high concurrency.", "40-60%",
      verdict=NOT_CHECKABLE, why=CLUSTER),
    c(35, "§6.2", "Preloading plus INT8 cuts memory by about 50% against FP16.", "about 50%",
      link=Link(NB09, "INT8 cuts memory by about 50%", lab_pattern=INT8_70B), rule=Number("50", False, 5 / 50)),
    c(36, "§6.2", "Preloading plus INT8 cuts model load time by about 60% and TTFT by 30-45%.", "60%, 30-45%",
      verdict=NOT_YET, why=f"{COLD} (load time against checkpoint bytes); the TTFT part needs a GPU",
      decider="notebook 09's cold_start table: load time of an int8 checkpoint against a bf16 one, against 60%"),
    c(37, "§6.2", "KV reuse with a fixed system prompt lowers TTFT a further 30-50%; with random inputs 10-20%.",
      "30-50%, 10-20%", verdict=NOT_YET, why=f"{PREFIX_06}; {HIT_RATE}",
      decider="notebook 06's prefix_caching table (a fixed system prompt) and notebook 09's hit_rate_sweep at 0% "
              "(random inputs) as claims rows, against 30-50% and 10-20%"),
]
