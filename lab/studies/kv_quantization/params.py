"""Notebook 03's parameters and its format names: `KVStudyParams` (presets quick, reference, smoke, gpu) and
`study_format`, which reads a `lab.kv.format` name with this study's own suffix, "/unit-scale" (static scales
of 1.0, vLLM's default, instead of calibrated ones)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from lab.engine import EngineConfig
from lab.kv.calibration import KVScales
from lab.kv.format import KVCacheFormat, parse_format
from lab.workflow.run import as_tuple, check_choice, check_device, check_model, check_range


UNIT_SCALE = "unit-scale"  # a format-name suffix of this study: static scales of 1.0 (vLLM's default)
ENGINE_BLOCK_SIZE = EngineConfig.block_size  # the engine's default block size, which the study's engines use


@dataclass
class KVStudyParams:
    PRESET: str = "quick"
    INTERACTIVE: bool = False
    DEVICE: str = "auto"  # auto: CUDA when present, else the CPU; the model stays float32 on either
    MODEL: str = "smollm2-135m"
    CONTEXT: int = 8192  # tokens of held-out text for the position study (SmolLM2's context limit)
    FIRST_BUCKET: int = 256
    ATTENTION_STRIDE: int = 8  # attention error measured at every 8th query position
    BLOCK_TOKENS: int = 32  # positions per block the intervals resample on the one long text
    # The reference runs the formats the ledger's rows are judged on (docs/studies/03_kv_quantization.md, "How the
    # reference is sized"): each claim's pair in the position study, KIVI's int4 keys, the three formats of the
    # safety claims end to end. fp8_e5m2, int2 and KIVI's int2 with a window are a parameter away.
    GROWTH_FORMATS: tuple = ("fp8_e4m3/per-tensor", f"fp8_e4m3/per-tensor/{UNIT_SCALE}", "fp8_e4m3/per-token",
                             "int8/per-tensor", "int8/per-token", "int4/per-tensor", "int4/per-token",
                             "int4/per-channel/group16")
    ROLE_FORMATS: tuple = ("int4/per-token/k-only", "int4/per-token/v-only", "int4/per-channel/group16/k-only")
    E2E_FORMATS: tuple = ("fp8_e4m3/per-tensor", "int8/per-token", "int4/per-token")
    CALIB_SAMPLES: int = 32  # calibration sequences for static scales (stratified mix)
    CALIB_TOKENS: int = 512
    CALIB_METHOD: str = "max"
    HELDOUT_SEQUENCES: int = 16
    HELDOUT_TOKENS: int = 512
    MAX_TOKENS: int = 64
    ITEMS_PER_CATEGORY: int = 0  # sensitive items per category (long context aside); 0: all of them
    LONG_CONTEXT_ITEMS: int = 4  # ~28 s each per format on 2 cores
    POOL_MIB: float = 16.0  # KV pool for the concurrency measurement
    CONCURRENCY_LEN: int = 256  # tokens per sequence there
    SAFE_PPL_PCT: float = 1.0  # "safe": perplexity within this many percent and no sensitive item lost
    SEED: int = 0
    # quick: 1K tokens of context, one format per family and the claims' pairs, fewer evaluation tokens, no
    # long context (minutes instead of 56); smoke: the tests' seconds.
    PRESETS: ClassVar[dict] = {
        "quick": {"CONTEXT": 1024, "GROWTH_FORMATS": ("fp8_e4m3/per-tensor", f"fp8_e4m3/per-tensor/{UNIT_SCALE}",
                                                      "int8/per-tensor", "int8/per-token", "int4/per-token",
                                                      "int4/per-channel/group16", "int2/per-token"),
                  "ROLE_FORMATS": ("int4/per-token/k-only", "int4/per-token/v-only"),
                  "E2E_FORMATS": ("fp8_e4m3/per-tensor", "int8/per-token", "int4/per-token"),
                  "CALIB_SAMPLES": 4, "CALIB_TOKENS": 256, "HELDOUT_SEQUENCES": 6, "HELDOUT_TOKENS": 256,
                  "MAX_TOKENS": 24, "ITEMS_PER_CATEGORY": 2, "LONG_CONTEXT_ITEMS": 0, "POOL_MIB": 4.0},
        "smoke": {"CONTEXT": 192, "FIRST_BUCKET": 32, "BLOCK_TOKENS": 8, "CALIB_SAMPLES": 2, "CALIB_TOKENS": 64,
                  "GROWTH_FORMATS": ("fp8_e4m3/per-tensor", f"fp8_e4m3/per-tensor/{UNIT_SCALE}",
                                     "int2/per-channel/group16/window32"),
                  "ROLE_FORMATS": ("int4/per-token/k-only", "int4/per-token/v-only"),
                  "E2E_FORMATS": ("fp8_e4m3/per-tensor", "int4/per-token"), "HELDOUT_SEQUENCES": 2, "HELDOUT_TOKENS": 64,
                  "MAX_TOKENS": 8, "ITEMS_PER_CATEGORY": 1, "LONG_CONTEXT_ITEMS": 0, "POOL_MIB": 2.0,
                  "CONCURRENCY_LEN": 64},
        # gpu: the long-context questions a CPU can only sample. Every reference format on SmolLM2's whole
        # 8K context with the attention error at every query position (stride 1, not every 8th); end to end, the
        # three formats of the safety claims on held-out sequences of 2K tokens instead of 512 (the error
        # accumulates with context) and every one of the 30 long-context items; static scales on twice the
        # sequences. ~34 s on one H200: 16 formats x 8K attention ~8 s, 4 sensitive runs of ~330 steps ~13 s,
        # scoring ~2 s, calibration and concurrency ~2.5 s, 8 s start.
        "gpu": {"ATTENTION_STRIDE": 1, "CALIB_SAMPLES": 64, "HELDOUT_SEQUENCES": 16, "HELDOUT_TOKENS": 2048,
                "LONG_CONTEXT_ITEMS": 30},
    }

    def __post_init__(self):
        check_device("DEVICE", self.DEVICE)
        check_model("MODEL", self.MODEL, self.DEVICE, "float32",
                    needs_tokenizer="perplexity is over text, and the sensitive items are text prompts")
        for name in ("GROWTH_FORMATS", "ROLE_FORMATS", "E2E_FORMATS"):
            setattr(self, name, as_tuple(name, getattr(self, name)))
            for f in getattr(self, name):
                study_format(f)
        for f in self.E2E_FORMATS:
            if study_format(f)[1] != "kv":
                raise ValueError(f"E2E_FORMATS entry {f!r}: the engine quantizes keys and values together")
        for f in self.E2E_FORMATS + self.GROWTH_FORMATS:  # the engine serves these (concurrency, end to end)
            fmt = study_format(f)[0]
            if fmt.granularity == "per-channel" and ENGINE_BLOCK_SIZE % fmt.token_group:
                raise ValueError(f"{f!r}: per-channel key groups must divide the engine's block size "
                                 f"{ENGINE_BLOCK_SIZE} (use e.g. group16)")
        check_choice("CALIB_METHOD", self.CALIB_METHOD, ("max", "percentile"))
        for name, lo, hi in (("CONTEXT", 64, 8192), ("FIRST_BUCKET", 16, 8192), ("ATTENTION_STRIDE", 1, 1024),
                             ("CALIB_SAMPLES", 1, 512), ("CALIB_TOKENS", 16, 2048), ("HELDOUT_SEQUENCES", 1, 256), ("HELDOUT_TOKENS", 16, 2048),
                             ("MAX_TOKENS", 1, 512), ("LONG_CONTEXT_ITEMS", 0, 30), ("ITEMS_PER_CATEGORY", 0, 1000), ("CONCURRENCY_LEN", 16, 8192),
                             ("SEED", 0, None)):
            check_range(name, getattr(self, name), lo, hi, int)
        check_range("POOL_MIB", self.POOL_MIB, 0.5, 4096)
        check_range("SAFE_PPL_PCT", self.SAFE_PPL_PCT, 0, 100)
        if self.FIRST_BUCKET >= self.CONTEXT:
            raise ValueError(f"FIRST_BUCKET={self.FIRST_BUCKET} must be below CONTEXT={self.CONTEXT}")
        check_range("BLOCK_TOKENS", self.BLOCK_TOKENS, 1, 1024, int)
        if self.BLOCK_TOKENS % self.ATTENTION_STRIDE or self.FIRST_BUCKET < 4 * self.BLOCK_TOKENS:
            raise ValueError(f"BLOCK_TOKENS={self.BLOCK_TOKENS} must be a multiple of ATTENTION_STRIDE="
                             f"{self.ATTENTION_STRIDE} (every block measured alike) and at most FIRST_BUCKET / 4 "
                             f"(at least four blocks to resample in the first bucket)")


def study_format(name: str) -> tuple[KVCacheFormat, str, bool]:
    """A format name of `parse_format`, optionally ending in "/unit-scale" (static scales of 1.0 instead of
    calibrated ones) -> (format, roles, unit scale?)."""
    unit = isinstance(name, str) and name.endswith("/" + UNIT_SCALE)
    fmt, roles = parse_format(name[:-len(UNIT_SCALE) - 1] if unit else name)
    if unit and not fmt.static:
        raise ValueError(f"{name!r}: {UNIT_SCALE} applies to static granularities (per-tensor, per-head)")
    return fmt, roles, unit


def scales_for(name: str, model, calibrated: KVScales) -> KVScales | None:
    fmt, _, unit = study_format(name)
    return (KVScales.unit(model, fmt) if unit else calibrated) if fmt.static else None
