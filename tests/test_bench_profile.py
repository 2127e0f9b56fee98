"""`lab bench engine --profile`'s cProfile table sorts each entry by where its code lives."""
from pathlib import Path

import lab
from lab.bench.profile import _kind


def test_python_sources_are_classified_by_the_package_folder_not_by_a_folder_named_lab():
    pkg = Path(lab.__file__).resolve().parent
    assert _kind(str(pkg / "engine" / "llm.py"), "step") == ("the engine's step", "lab/engine/llm.py")
    assert _kind(str(pkg / "models" / "llama.py"), "forward") == ("the model's forward", "lab/models/llama.py")
    # a checkout that itself sits under a folder named lab, its venv inside it: torch is torch's
    torch_file = "/home/someone/lab/.venv/lib/python3.11/site-packages/torch/nn/modules/module.py"
    assert _kind(torch_file, "_call_impl") == ("torch's Python", "torch/nn/modules/module.py")
    assert _kind("~", "<built-in method torch.rms_norm>")[0].startswith("C functions")
