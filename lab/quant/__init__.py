"""Weight-only post-training quantization: round-to-nearest (`rtn`) and GPTQ (`gptq`)."""

from .gptq import GPTQConfig, GPTQResult, GPTQStats, HessianAccumulator, gptq_quantize, gptq_quantize_model
from .rtn import QuantSpec, dequantize, fake_quantize, quantize

__all__ = ["GPTQConfig", "GPTQResult", "GPTQStats", "HessianAccumulator", "QuantSpec", "dequantize",
           "fake_quantize", "gptq_quantize", "gptq_quantize_model", "quantize"]
