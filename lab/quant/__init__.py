"""Weight-only post-training quantization: round-to-nearest (`rtn`), GPTQ (`gptq`), AWQ (`awq`), llama.cpp's GGUF
block grids (`gguf_grids`: Q4_0, Q4_1, Q8_0, and a detector of weights already on a grid) and the ladder from
Q4_1 to 2 bits (`ladder`)."""

from .gguf_grids import already_quantized, fake_quantize_gguf, quantize_gguf
from .gptq import GPTQConfig, GPTQResult, GPTQStats, HessianAccumulator, gptq_quantize, gptq_quantize_model
from .rtn import QuantSpec, dequantize, fake_quantize, quantize

__all__ = ["GPTQConfig", "GPTQResult", "GPTQStats", "HessianAccumulator", "QuantSpec", "already_quantized",
           "dequantize", "fake_quantize", "fake_quantize_gguf", "gptq_quantize", "gptq_quantize_model", "quantize",
           "quantize_gguf"]
