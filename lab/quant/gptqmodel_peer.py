"""GPTQModel as a peer: its quantizer and its own loader and dequantizer, run on what the lab has, in a child process.

GPTQModel (ModelCloud, github.com/ModelCloud/GPTQModel; 7.3.6 here) is the maintained successor of AutoGPTQ and
writes the GPTQ checkpoints found on model hubs. `run` executes a list of tasks in one child process:

- `quantize_task`: GPTQModel quantizes a Hugging Face model directory on given calibration token ids and saves its
  checkpoint (`GPTQModel.load(dir, QuantizeConfig(...)).quantize(...)`, then `.save`): the hub format as GPTQModel
  writes it, for the interchange tests and the side by side in `lab bench quant` (`lab.quant.gptqmodel_compare`);
- `dequantize_task`: GPTQModel's loader, or transformers' with GPTQModel installed, loads a GPTQ checkpoint (its
  own or the lab's) with GPTQModel's torch kernel (TorchLinear, the one that runs on a CPU) and writes every
  quantized linear's weight as its `dequantize_weight()` computes it, plus greedy tokens from that model: what
  GPTQModel reads from a checkpoint, not what the lab thinks it wrote.

`available()` says whether it is installed at the pinned version, else why not.

Why a child process (`python -m lab.quant.gptqmodel_peer TASK.json`): importing gptqmodel patches other libraries
for the whole process (safetensors' `save_file`, transformers' GPTQ quantizer, its own thread pools and several
environment variables), which must not leak into the lab's process or the test session.

Two things this CPU machine needs, both set only in the child:
- GPTQModel 7.3.6 imports torchvision when it is imported (for its InternVL model definition). The torchvision
  wheels on the package index are CUDA builds: beside the CPU build of torch their operators do not load
  ("operator torchvision::nms does not exist"), and without torchvision the import fails. So when torchvision does
  not import, a stand-in for that one module (`gptqmodel.models.definitions.internvl_chat`, a vision-language model
  the lab never loads) is registered before gptqmodel is imported.
- Its CPU thread pool has (cores + 1) // 2 workers unless GPTQMODEL_CPU_WORKERS says otherwise, and its model
  loader asks that pool for 2: on a 2-core machine the loader is refused ("Virtual pool 'model_loader:cpu' requests
  2 workers but parent 'cpu' only has 1"). GPTQMODEL_CPU_WORKERS defaults to 2 in the child.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

VERSION = "7.3.6"  # the release pinned in the Makefile (the newest whose torch floor the lab's torch 2.13 meets)
_INTERNVL = "gptqmodel.models.definitions.internvl_chat"


def available() -> str:
    """Empty when GPTQModel is installed at the pinned version, else why not (nothing is imported here)."""
    from importlib import metadata

    try:
        have = metadata.version("gptqmodel")
    except metadata.PackageNotFoundError:
        return f"GPTQModel is not installed (`make setup` installs gptqmodel=={VERSION})"
    if have != VERSION:
        return f"GPTQModel {have} is installed; the lab's peer code is written against {VERSION}"
    return ""


def run(tasks: list[dict], timeout: float = 1800.0) -> list[dict]:
    """Run `tasks` (from `quantize_task` and `dequantize_task`) in order in one child process (GPTQModel is
    imported once); their JSON results. A failure in the child raises RuntimeError with the end of its output."""
    missing = available()
    if missing:
        raise RuntimeError(missing)
    env = dict(os.environ)
    env.setdefault("GPTQMODEL_CPU_WORKERS", "2")  # see the module docstring
    # Its TorchLinear wraps dequantize_weight in torch.compile on load; on a CPU that is a C++ build of
    # inductor kernels (~10 s on 2 cores for the tiny test model). Eager runs the same function.
    env.setdefault("TORCHDYNAMO_DISABLE", "1")
    with tempfile.TemporaryDirectory(prefix="gptqmodel-task-") as tmp:
        task_file, result_file = Path(tmp) / "tasks.json", Path(tmp) / "results.json"
        task_file.write_text(json.dumps({"tasks": tasks, "result_file": str(result_file)}))
        # cwd: GPTQModel writes a log file per quantization under ./logs, which belongs in the task's folder,
        # not in whatever directory the caller (a test, a notebook) runs from.
        proc = subprocess.run([sys.executable, "-m", "lab.quant.gptqmodel_peer", str(task_file)], env=env,
                              capture_output=True, text=True, timeout=timeout, cwd=tmp)
        if proc.returncode or not result_file.exists():
            tail = (proc.stdout + proc.stderr)[-3000:]
            raise RuntimeError(f"GPTQModel failed in its child process (exit {proc.returncode}):\n{tail}")
        return json.loads(result_file.read_text())


def quantize_task(model_dir, out_dir, calibration: list[list[int]], bits: int, group_size: int | None,
                  symmetric: bool = False, act_order: bool = False, damp: float = 0.01, group_aware: bool = False,
                  layers: tuple[int, ...] | None = None, device: str = "cpu") -> dict:
    """GPTQModel quantizes the Hugging Face directory `model_dir` on `calibration` (token id lists, one sample
    each) and saves its checkpoint to `out_dir`. Settings as the lab's GPTQ takes them (`GPTQConfig`): dampening
    `damp` of mean(diag H), act-order or not. `group_aware`: GPTQModel's group-aware reordering (GAR, its 7.x
    default; off here unless asked, so both run the same algorithm). `layers`: only those decoder layers (the
    others skipped through its `dynamic` rules). Result: {"seconds": the quantize call alone, "quantize_config":
    as saved, "version"}."""
    # absolute paths: the child runs in its own folder (see `run`)
    model_dir, out_dir = Path(model_dir).resolve(), Path(out_dir).resolve()
    return {"task": "quantize", "model_dir": str(model_dir), "out_dir": str(out_dir), "calibration": calibration,
            "bits": bits, "group_size": group_size or -1, "sym": symmetric, "desc_act": act_order,
            "act_group_aware": group_aware, "damp_percent": damp, "device": device,
            "layers": None if layers is None else list(layers)}


def dequantize_task(checkpoint, weights_file, prompt: list[int] | None = None, max_new_tokens: int = 0,
                    loader: str = "gptqmodel") -> dict:
    """GPTQModel loads the GPTQ `checkpoint` with its torch kernel (TorchLinear, on the CPU, in float16: it refuses
    float32), through `loader`: "gptqmodel" (`GPTQModel.load`, BACKEND.TORCH) or "transformers"
    (`AutoModelForCausalLM.from_pretrained` with GPTQModel and optimum installed, as a transformers user loads a hub
    checkpoint; backend "torch" asked for, since its default on a CPU, TorchAtenLinear, repacks the codes for
    torch's int4 kernel and has no dequantize_weight then). It writes each quantized linear's `dequantize_weight()` to `weights_file` (safetensors, Hugging Face
    module names, [out, in], float16 values as float32). Result: {"tokens": its greedy continuation of `prompt`,
    "kernels"}. Its dequantization is scales[g] * (q - zero[g]) in float16: the exact product (an fp16 scale
    times a small integer, exact in float32) rounded once, so it equals the lab's float32 weight `.half()`."""
    checkpoint, weights_file = Path(checkpoint).resolve(), Path(weights_file).resolve()  # as in quantize_task
    return {"task": "dequantize", "checkpoint": str(checkpoint), "weights_file": str(weights_file),
            "prompt": prompt or [], "max_new_tokens": max_new_tokens, "loader": loader}


def quantize(*args, **kwargs) -> dict:
    """`quantize_task` run on its own."""
    return run([quantize_task(*args, **kwargs)])[0]


# --------------------------------------------------------------------------- the child process

def _import_gptqmodel():
    """Import gptqmodel on this machine (see the module docstring for the stand-in and why)."""
    import types

    try:
        import torchvision.transforms  # noqa: F401
    except Exception:  # absent, or a CUDA build whose operators do not load beside CPU torch
        stand_in = types.ModuleType(_INTERNVL)

        class InternVLChatQModel:  # never used: InternVL needs torchvision, which cannot run here
            pass

        stand_in.InternVLChatQModel = InternVLChatQModel
        sys.modules.setdefault(_INTERNVL, stand_in)
    import gptqmodel

    return gptqmodel


def _skip_rule(layers: list[int] | None) -> dict:
    """GPTQModel's `dynamic` rules that leave every decoder layer but `layers` unquantized ("-:" = skip)."""
    if layers is None:
        return {}
    keep = "|".join(str(i) for i in sorted(layers))
    return {rf"-:model\.layers\.(?!({keep})\.).*": {}}


def _child_quantize(task: dict) -> dict:
    import torch

    gm = _import_gptqmodel()
    qc = gm.QuantizeConfig(bits=task["bits"], group_size=task["group_size"], sym=task["sym"],
                           desc_act=task["desc_act"], act_group_aware=task["act_group_aware"], damp_percent=task["damp_percent"],
                           dynamic=_skip_rule(task["layers"]) or None)
    model = gm.GPTQModel.load(task["model_dir"], qc, device=task["device"], dtype=torch.float32)
    calib = [{"input_ids": torch.tensor([ids]), "attention_mask": torch.ones(1, len(ids), dtype=torch.long)}
             for ids in task["calibration"]]
    start = time.perf_counter()
    model.quantize(calib, batch_size=1)
    seconds = time.perf_counter() - start
    model.save(task["out_dir"])
    saved = json.loads((Path(task["out_dir"]) / "config.json").read_text())["quantization_config"]
    return {"seconds": seconds, "quantize_config": saved, "version": gm.__version__}


def _child_dequantize(task: dict) -> dict:
    import torch
    from safetensors.torch import save_file

    gm = _import_gptqmodel()
    from gptqmodel.nn_modules.qlinear import BaseQuantLinear

    # TorchLinear takes float16 or bfloat16 only; float16 holds the checkpoint's fp16 scales as they are
    if task["loader"] == "gptqmodel":
        model = gm.GPTQModel.load(task["checkpoint"], device="cpu", backend=gm.BACKEND.TORCH,
                                  dtype=torch.float16).model
    else:
        from transformers import AutoModelForCausalLM, GPTQConfig

        bits = json.loads((Path(task["checkpoint"]) / "config.json").read_text())["quantization_config"]["bits"]
        model = AutoModelForCausalLM.from_pretrained(task["checkpoint"], device_map="cpu", dtype=torch.float16,
                                                     quantization_config=GPTQConfig(bits=bits, backend="torch"))
    quantized = {name: m for name, m in model.named_modules() if isinstance(m, BaseQuantLinear)}
    with torch.inference_mode():
        # dequantize_weight returns [in, out]
        save_file({name: m.dequantize_weight().t().float().contiguous() for name, m in quantized.items()},
                  task["weights_file"])
        tokens = []
        if task["max_new_tokens"]:
            ids, n = torch.tensor([task["prompt"]]), task["max_new_tokens"]
            out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                       max_new_tokens=n, min_new_tokens=n)
            tokens = out[0, ids.shape[1]:].tolist()
    return {"tokens": tokens, "kernels": sorted({type(m).__name__ for m in quantized.values()})}


def main(task_file: str) -> None:
    spec = json.loads(Path(task_file).read_text())
    handlers = {"quantize": _child_quantize, "dequantize": _child_dequantize}
    results = [handlers[task["task"]](task) for task in spec["tasks"]]
    Path(spec["result_file"]).write_text(json.dumps(results))


if __name__ == "__main__":
    main(sys.argv[1])
