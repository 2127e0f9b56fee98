"""The lab's model (the Llama block and the families of `families.FAMILIES`) and how to load it; see
`loader.load_model`."""

from . import prepack
from .config import SUPPORTED_ARCHITECTURES, ModelConfig
from .llama import AttentionContext, LlamaModel
from .loader import default_device, default_dtype, load_model, preset_config, preset_names, resolve_model_dir

__all__ = ["SUPPORTED_ARCHITECTURES", "AttentionContext", "LlamaModel", "ModelConfig", "default_device",
           "default_dtype", "load_model", "prepack", "preset_config", "preset_names", "resolve_model_dir"]
