"""The KV cache's formats in one package: the store protocol, one module per format, and the registry.

- `protocol`: `KVStore` (write, gather, `bytes_per_token`, `staging_bytes`, the Triton kernels' view) and
  `KVCapabilities` (what a store supports: the Triton kernels, speculation, sliding windows, parallelism);
- `format`: the arithmetic of the quantized formats (`KVCacheFormat`, quantize/dequantize, packing, which
  positions read exactly) and the one reading of a `kv_cache_dtype` string; the kernels share it;
- one module per format, each with its store, its calibration default and its kernel entry point:
  `plain` ("auto", the model's dtype), `fp8` (fp8_e4m3, fp8_e5m2), `integer` (int8, int4, int2), on the pool
  the quantized ones share (`quantized`) and its exact copies (`staging`);
- `calibration`: static scales from calibration data, and the contiguous reference cache;
- `registry`: `kv_cache_dtype` name -> store class (`STORES`), and what is asked of a format before its store
  exists (`capabilities`, `bytes_per_block`, `staging_bytes`, `build_store`).

Adding a format: one module and one line in `registry.STORES` (docs/engine.md, "Adding a KV format"). lab.kv
imports no engine and no kernel: the engine asks it, the kernels read `format`.
"""

from .format import KV_CACHE_DTYPES, KVCacheFormat, parse_format, parse_kv_cache_dtype
from .protocol import KVCapabilities, KVStore
from .registry import STORES, build_store, bytes_per_block, capabilities, staging_bytes, store_class

__all__ = ["KV_CACHE_DTYPES", "KVCacheFormat", "KVCapabilities", "KVStore", "STORES", "build_store",
           "bytes_per_block", "capabilities", "parse_format", "parse_kv_cache_dtype", "staging_bytes", "store_class"]
