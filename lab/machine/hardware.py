"""Accelerators as three numbers a roofline needs: peak FLOP/s, memory bandwidth, memory capacity.

A roofline bound (see `lab.machine.roofline`) is only as good as its ceilings, so every entry of `GPUS`
names the vendor document its numbers come from, and `probe()` measures the same three numbers on
the machine the lab is running on, so a model's estimate can be checked against a real run here.

Conventions, chosen to match how the numbers are published and how the devices report themselves:

- `peak_flops` is the *dense* BF16/FP16 tensor-core rate with FP32 accumulation. NVIDIA's
  datasheets print the 2:4 structured-sparsity figure first (marked with an asterisk, "specifications
  1/2 lower without sparsity"); a dense LLM never gets it, so the tables below hold half of it.
- FLOP/s and bytes/s are decimal, as vendors print them: 3.35 TB/s is 3.35e12 B/s.
- `memory_bytes` is the marketed capacity read as GiB (1024**3 bytes), because that is what the
  device reports and what `torch.cuda.mem_get_info` returns: an "80GB" H100 reports about
  79.6 GiB total (the driver keeps a little back), which 80 GiB approximates within 1 %, whereas
  80e9 bytes (74.5 GiB) would understate it by 6 %. GDDR parts with ECC on keep more back (an L40S
  reports about 45 GiB of its 48). Capacity planning should still start from the
  measured total, as vLLM does, and take its headroom from there.

Sources (NVIDIA datasheets and whitepapers, cross-checked against their reproductions on public
spec pages): A100 datasheet (nvidia-a100-datasheet-us-nvidia-1758950-r4), H100 and H200 Tensor
Core GPU datasheets, L40S datasheet, and "NVIDIA Ada GPU Architecture" whitepaper, appendix A, for
the GeForce RTX 4090, whose BF16 rate with FP32 accumulation is half its FP16-accumulate rate.
"""

from __future__ import annotations

import datetime
import math
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch



def _first_cpu() -> dict[str, str] | None:
    """The first processor's fields in Linux's /proc/cpuinfo (every core reports the same); None where there is
    none."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    fields = {}
    for line in text.splitlines():
        if not line.strip():
            break
        key, _, value = line.partition(":")
        fields[key.strip()] = value.strip()
    return fields


def cpu_model() -> str:
    return (_first_cpu() or {}).get("model name") or platform.processor() or platform.machine()


# The CPU flags (Linux /proc/cpuinfo) that decide how fast this CPU multiplies bfloat16, float16 and int8
# matrices: Intel AMX (Sapphire Rapids and later); AVX512-BF16 (Intel Cooper Lake and later, AMD Zen 4 and later);
# AVX512-FP16 (Intel Sapphire Rapids and later); VNNI (int8 dot products).
MATRIX_FLAGS = ("amx_bf16", "amx_fp16", "amx_int8", "avx512_bf16", "avx512_fp16", "avx512_vnni", "avx_vnni")


def cpu_signature() -> dict | None:
    """This CPU's family and model numbers and which of MATRIX_FLAGS it has, from /proc/cpuinfo (None where there is
    none). The model name does not tell machines apart under a hypervisor: two Xeons this project ran on both read
    "Intel(R) Xeon(R) Processor", one with AMX (bf16 matmul 1,331-1,592 GFLOP/s on 2 cores) and one without
    (84-169)."""
    first = _first_cpu()
    if first is None:
        return None
    flags = set(first.get("flags", "").split())
    return {"family": first.get("cpu family"), "model": first.get("model"),
            "matrix_flags": [f for f in MATRIX_FLAGS if f in flags]}


def describe_cpu(name: str, signature: dict | None) -> str:
    """One line naming a CPU: its model name, family and model, and its matrix flags ("none of" them, where it
    has none: that too sets its speed)."""
    if not signature:
        return name
    flags = " ".join(signature["matrix_flags"]) or f"none of {', '.join(MATRIX_FLAGS)}"
    return f"{name} (family {signature['family']} model {signature['model']}; {flags})"


GiB = 1024**3
TERA = 1e12


@dataclass(frozen=True)
class Hardware:
    name: str
    memory_bytes: int            # device memory (GiB convention, see the module docstring)
    peak_flops: float            # dense BF16/FP16 tensor FLOP/s, no sparsity
    mem_bandwidth: float         # bytes/s, decimal
    source: str                  # where the numbers come from
    peak_fp8_flops: float | None = None  # dense FP8 FLOP/s where the device has FP8 tensor cores
    interconnect: str = ""       # free-text notes for multi-GPU estimates; no arithmetic uses it

    def __post_init__(self):
        for field_name in ("memory_bytes", "peak_flops", "mem_bandwidth"):
            value = getattr(self, field_name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{self.name}: {field_name} must be positive and finite, got {value!r}")


_A100_DATASHEET = "NVIDIA A100 Tensor Core GPU datasheet (nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf)"

GPUS: dict[str, Hardware] = {
    "a100-sxm-80gb": Hardware(
        "NVIDIA A100 SXM4 80GB", 80 * GiB, 312 * TERA, 2.039e12,
        f"{_A100_DATASHEET}: BF16 tensor 312 TFLOPS (624 sparse), 80GB HBM2e, 2,039 GB/s",
        interconnect="NVLink 3: 600 GB/s; PCIe Gen4: 64 GB/s"),
    "a100-pcie-80gb": Hardware(
        "NVIDIA A100 PCIe 80GB", 80 * GiB, 312 * TERA, 1.935e12,
        f"{_A100_DATASHEET}: BF16 tensor 312 TFLOPS (624 sparse), 80GB HBM2e, 1,935 GB/s",
        interconnect="NVLink bridge for 2 GPUs: 600 GB/s; PCIe Gen4: 64 GB/s"),
    "h100-sxm": Hardware(
        "NVIDIA H100 SXM5 80GB", 80 * GiB, 989.4 * TERA, 3.35e12,
        "NVIDIA H100 Tensor Core GPU datasheet: BF16 tensor 1,979 TFLOPS sparse (989.4 dense), "
        "FP8 3,958 sparse, 80GB HBM3, 3.35 TB/s",
        peak_fp8_flops=1978.9 * TERA,
        interconnect="NVLink 4: 900 GB/s; PCIe Gen5: 128 GB/s"),
    "h200": Hardware(
        "NVIDIA H200 SXM 141GB", 141 * GiB, 989.4 * TERA, 4.8e12,
        "NVIDIA H200 Tensor Core GPU datasheet (SXM): BF16 tensor 1,979 TFLOPS sparse (989.4 dense), "
        "FP8 3,958 sparse, 141GB HBM3e, 4.8 TB/s; same GH100 compute as the H100 SXM",
        peak_fp8_flops=1978.9 * TERA,
        interconnect="NVLink 4: 900 GB/s; PCIe Gen5: 128 GB/s"),
    "l40s": Hardware(
        "NVIDIA L40S 48GB", 48 * GiB, 362.05 * TERA, 0.864e12,
        "NVIDIA L40S datasheet: BF16 tensor 362.05 TFLOPS (733 sparse), FP8 733 (1,466 sparse), "
        "48GB GDDR6 with ECC, 864 GB/s",
        peak_fp8_flops=733 * TERA,
        interconnect="PCIe Gen4 x16: 64 GB/s bidirectional; no NVLink"),
    "rtx-4090": Hardware(
        "NVIDIA GeForce RTX 4090 24GB", 24 * GiB, 165.2 * TERA, 1.008e12,
        "NVIDIA Ada GPU Architecture whitepaper, appendix A: BF16 tensor with FP32 accumulate "
        "165.2 TFLOPS (330.4 sparse), FP8 with FP32 accumulate 330.3, 24GB GDDR6X, 1,008 GB/s",
        peak_fp8_flops=330.3 * TERA,
        interconnect="PCIe Gen4 x16; no NVLink"),
}


def get_gpu(name: str) -> Hardware:
    try:
        return GPUS[name.lower()]
    except KeyError:
        raise ValueError(f"unknown GPU {name!r}; known GPUs: {', '.join(sorted(GPUS))}") from None


# --- measuring this machine ---------------------------------------------------------------------

def _best_rate(fn: Callable[[], object], work: float, budget_s: float, sync: Callable[[], None]) -> float:
    """Best work/second over repeated calls of `fn` within `budget_s`.

    The best, not the mean, because a ceiling is wanted: slower repetitions are interference from
    other processes or frequency ramps, not the hardware's limit. The first call is a warm-up
    (allocation, kernel selection, page faults) and is not timed.
    """
    fn()
    sync()
    best = 0.0
    deadline = time.perf_counter() + budget_s
    repetitions = 0
    while repetitions < 2 or time.perf_counter() < deadline:
        start = time.perf_counter()
        fn()
        sync()
        best = max(best, work / (time.perf_counter() - start))
        repetitions += 1
    return best


def _host_memory_bytes() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024  # the kernel's "kB" is KiB
    raise RuntimeError("MemTotal not found in /proc/meminfo")


def probe(seconds_budget: float = 4.0, device: str | None = None) -> Hardware:
    """Measure this machine's matmul FLOP/s and memory bandwidth and return them as a `Hardware`.

    On CUDA the matmuls are BF16 (what the GPU table holds); on CPU they are FP32, the dtype the
    lab runs its models in there. Bandwidth is the best of a large copy (read + write bytes counted,
    as STREAM counts them; caches that allocate on write move more, so this understates a little)
    and a large sum (reads only, like decode reading weights). Buffers are far larger than any
    last-level cache so the timing is of DRAM/HBM, not cache. Half the budget goes to each.
    """
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    on_gpu = device.startswith("cuda")
    sync = (lambda: torch.cuda.synchronize(device)) if on_gpu else (lambda: None)  # that device, not cuda:0
    dtype = torch.bfloat16 if on_gpu else torch.float32
    # Big enough to reach the tensor-core/BLAS plateau, small enough to time several per budget.
    sizes = (2048, 4096, 8192) if on_gpu else (256, 512, 1024)

    matmul_budget = seconds_budget / 2 / len(sizes)
    peak = 0.0
    for n in sizes:
        a = torch.randn(n, n, device=device, dtype=dtype)
        b = torch.randn(n, n, device=device, dtype=dtype)
        peak = max(peak, _best_rate(lambda: a @ b, 2.0 * n**3, matmul_budget, sync))
        del a, b

    if on_gpu:
        free, total = torch.cuda.mem_get_info(device)
        memory_bytes = total
        buffer_bytes = min(1 * GiB, free // 8)
        name = torch.cuda.get_device_name(device)
    else:
        memory_bytes = _host_memory_bytes()
        buffer_bytes = min(256 * 1024**2, memory_bytes // 16)  # 256 MiB: well past any CPU's L3
        name = cpu_model()
    src = torch.ones(buffer_bytes // 4, device=device, dtype=torch.float32)
    dst = torch.empty_like(src)
    stream_budget = seconds_budget / 4
    bandwidth = max(_best_rate(lambda: dst.copy_(src), 2.0 * buffer_bytes, stream_budget, sync),
                    _best_rate(lambda: src.sum(), float(buffer_bytes), stream_budget, sync))

    today = datetime.datetime.now(datetime.timezone.utc).date().isoformat()
    precision = str(dtype).removeprefix("torch.")
    return Hardware(f"this machine ({name})", int(memory_bytes), peak, bandwidth,
                    f"measured by lab.machine.hardware.probe on {today} ({device}, {precision} matmul)")


PROBE_SECONDS = 3.0  # the inference probe's default budget, half to the GEMV and half to the matmul


def probe_inference(dtype: torch.dtype, device: str | None = None, gemv_shape: tuple[int, int] = (49152, 576),
                    gemm_n: int = 1024, seconds_budget: float = PROBE_SECONDS) -> Hardware:
    """This machine's ceilings for a model served in `dtype`, measured the way inference uses it.

    Bandwidth: a weight-shaped GEMV, x [1, K] times a [N, K] matrix stored as the model stores its weights
    (default: SmolLM2's LM head, 49152 x 576, larger than the last-level cache), reads the matrix once:
    its bytes over the best time is the rate at which a decode step can read weights, which is what bounds it
    (a STREAM copy measures another access pattern). Compute: the best FLOP/s of an `gemm_n`^3 matmul in
    `dtype`, what a prefill's matmuls can reach. Half the budget goes to each."""
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    sync = (lambda: torch.cuda.synchronize(device)) if device.startswith("cuda") else (lambda: None)
    n, k = gemv_shape
    w = torch.randn(n, k, device=device, dtype=dtype)
    x = torch.randn(1, k, device=device, dtype=dtype)
    bandwidth = _best_rate(lambda: torch.nn.functional.linear(x, w), float(w.nbytes), seconds_budget / 2, sync)
    a = torch.randn(gemm_n, gemm_n, device=device, dtype=dtype)
    b = torch.randn(gemm_n, gemm_n, device=device, dtype=dtype)
    peak = _best_rate(lambda: a @ b, 2.0 * gemm_n**3, seconds_budget / 2, sync)
    on_gpu = device.startswith("cuda")
    name = torch.cuda.get_device_name(device) if on_gpu else cpu_model()
    memory = torch.cuda.mem_get_info(device)[1] if on_gpu else _host_memory_bytes()
    precision = str(dtype).removeprefix("torch.")
    today = datetime.datetime.now(datetime.timezone.utc).date().isoformat()
    return Hardware(f"this machine ({name})", int(memory), peak, bandwidth,
                    f"measured by lab.machine.hardware.probe_inference on {today} ({device}, {precision}: {n}x{k} GEMV "
                    f"read, {gemm_n}^3 matmul, {torch.get_num_threads()} threads)")


def model_ceilings(model, seconds: float = PROBE_SECONDS) -> Hardware:
    """This machine's ceilings in the dtype and on the device `model` runs in (`probe_inference`), shaped like
    the model: the GEMV like its LM head, the largest matrix a decode step reads (past a CPU's last-level cache
    for SmolLM2, past a GPU's L2 for an 8B model), the square matmul as wide as its hidden size (an 8B model's
    4096 reaches a GPU's tensor-core plateau, the probe's default 1024 does not). Smaller models keep the
    probe's defaults, which SmolLM2's head and width meet."""
    weight, c = model.embed_tokens.weight, model.config
    gemv = max((c.vocab_size, c.hidden_size), (49152, 576), key=lambda s: s[0] * s[1])
    return probe_inference(weight.dtype, str(weight.device), gemv_shape=gemv, gemm_n=max(1024, c.hidden_size),
                           seconds_budget=seconds)
