"""Shared fixtures: the real model is loaded once per test session (it converts on first use)."""

import pytest
import torch

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
