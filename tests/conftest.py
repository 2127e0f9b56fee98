"""Shared fixtures: the real model is loaded once per test session (it converts on first use).

`make test` runs the suite in two pytest-xdist workers, one per core. Each worker and every process it spawns
(notebook kernels, servers, ranks) keeps one OpenMP thread: two processes of two spinning threads each on two
cores made every step 30-80x slower (see `one_thread`), while one thread each keeps both cores busy with
the many tests that are too small to split across threads."""

import os

if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = "1"  # before torch starts its pool

import pytest
import torch

if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)

import lab  # noqa: F401  first: on a machine without CUDA it sets TRITON_INTERPRET before triton is imported

torch.manual_seed(0)

QUESTIONS = [
    "What is the capital of France?",
    "Write a short story about a robot who learns to paint.",
    "List three uses of copper and explain each.",
    "Explain how a bicycle stays upright.",
]


@pytest.fixture(scope="module")
def one_thread():
    """One intra-op thread for modules of tiny-model tests: their ops are too small to split, and with
    another process on the two cores OpenMP's spinning threads made each step 30-80x slower (measured:
    ~1 ms a step with one thread, 30-80 ms with two)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def smollm():
    from lab.models import load_model

    return load_model("smollm2-135m", dtype=torch.float32, device="cpu")


@pytest.fixture(scope="session")
def chat_prompts(smollm):
    """Token ids of chat-formatted questions, as the engine receives them."""
    _, tok = smollm
    return [tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False)
            for q in QUESTIONS]


@pytest.fixture(scope="session")
def chat_prompt_ids(smollm, chat_prompts):
    _, tok = smollm
    return [tok.encode(p, add_special_tokens=False) for p in chat_prompts]


# Short prompts for quantization tests: calibration inputs and captured layer activations.
QUANT_PROMPTS = [
    "The capital of France is",
    "Copper is used in electrical wiring because",
    "A bicycle stays upright when",
    "Write a haiku about the sea.",
    "The recipe calls for two cups of flour and",
    "In 1969, astronauts landed on",
    "Photosynthesis converts sunlight into",
    "def fibonacci(n):\n    if n < 2:",
]


@pytest.fixture(scope="session")
def quant_prompt_ids(smollm):
    _, tok = smollm
    return [tok.encode(p) for p in QUANT_PROMPTS]


@pytest.fixture(scope="session")
def layer3_inputs(smollm, quant_prompt_ids):
    """Inputs of layer 3's qkv_proj, gate_up_proj and down_proj over QUANT_PROMPTS, from the float model."""
    from lab.models.reference import forward_logits

    model, _ = smollm
    layer = model.layers[3]
    linears = {"qkv": layer.self_attn.qkv_proj, "gate_up": layer.mlp.gate_up_proj, "down": layer.mlp.down_proj}
    seen = {k: [] for k in linears}
    hooks = [lin.register_forward_hook(lambda m, a, o, acc=seen[k]: acc.append(a[0])) for k, lin in linears.items()]
    try:
        for ids in quant_prompt_ids:
            forward_logits(model, ids)
    finally:
        for h in hooks:
            h.remove()
    return {k: torch.cat(v).clone() for k, v in seen.items()}


def rtn_quantized_copy(model, layers, spec):
    """A copy of `model` with every linear of `layers` round-to-nearest quantized (the baseline)."""
    import copy

    from lab.quant import fake_quantize

    rtn = copy.deepcopy(model)
    for i in layers:
        for lin in rtn.layers[i].modules():
            if isinstance(lin, torch.nn.Linear):
                lin.weight.data.copy_(fake_quantize(lin.weight, spec))
    return rtn


@pytest.fixture(scope="session")
def rtn_copy():
    return rtn_quantized_copy


def pytest_terminal_summary(terminalreporter):
    """The size review (tests/test_structure.py `oversized`): what is over the line hints, for a reviewer."""
    from test_structure import MAX_FILE_LINES, MAX_FUNCTION_LINES, oversized

    found = oversized()
    if found:
        terminalreporter.section(f"size review: over {MAX_FILE_LINES} lines a file or {MAX_FUNCTION_LINES} a "
                                 f"function (hints, not limits)")
        for line in found:
            terminalreporter.write_line(line)


@pytest.fixture
def gpu_memory(monkeypatch):
    """A study's model check sized against one H200's 141 GB instead of this machine's memory: the gpu presets'
    8B and 70B shapes pass their validation here as they would on the GPU they are for."""
    import lab.workflow.run

    monkeypatch.setattr(lab.workflow.run, "_device_memory", lambda device: (141e9, "an H200's memory (a test's)"))


@pytest.fixture(scope="session")
def user16(tmp_path_factory):
    """A small random-weight 16-bit checkpoint with the embedded model's tokenizer (`lab.models.random_checkpoint`,
    from transformers' own config class: no download): the user's own model of issue 51, on which the study notebooks'
    smoke runs are made (tests/test_notebooks.py). A Qwen3, not the embedded model's Llama family: its q/k norms and
    explicit head_dim take the family's own paths through the engine (00), quantization's walks over the linears (02),
    the KV formats per head (03), the drafters (05) and tensor-parallel sharding (08), which the embedded model's
    runs never reach."""
    from lab.models.random_checkpoint import write_random_checkpoint

    return write_random_checkpoint(tmp_path_factory.mktemp("ck") / "qwen16", family="qwen3")
