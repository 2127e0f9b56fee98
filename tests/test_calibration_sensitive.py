"""Calibration sets (lab.quant.calibration) and the quantization-sensitive eval set (lab.eval.sensitive)."""

import re
from collections import Counter

import pytest

datasets = pytest.importorskip("datasets")

from lab.eval.sensitive import CATEGORIES, build_prompt, check, load_items  # noqa: E402
from lab.quant.calibration import CHAT_PROMPTS, SPEC_BENCH_PATH, build_calibration_set, manifest  # noqa: E402


@pytest.fixture(scope="module")
def tok():
    from lab.models.loader import load_tokenizer, resolve_model_dir

    return load_tokenizer(resolve_model_dir("smollm2-135m"))


@pytest.fixture(scope="module")
def local_set(tok):
    return build_calibration_set(tok, n_samples=128, max_tokens=256, seed=0, spec_bench=None)


def test_stratified_counts_and_lengths(tok, local_set):
    per_task = Counter(local_set["task"])
    assert set(per_task) == {"docs", "code", "chat"}
    assert sum(per_task.values()) == 128
    # Equal shares, except chat, which is capped by its prompt list; the others absorb the rest evenly.
    assert per_task["chat"] == min(len(CHAT_PROMPTS), 128 // 3)
    assert abs(per_task["docs"] - per_task["code"]) <= 1
    assert all(len(ids) <= 256 and len(ids) == n for ids, n in zip(local_set["input_ids"], local_set["n_tokens"]))
    assert {"short", "medium", "long"} <= set(local_set["bucket"])


def test_seed_determinism(tok, local_set):
    again = build_calibration_set(tok, n_samples=128, max_tokens=256, seed=0, spec_bench=None)
    other = build_calibration_set(tok, n_samples=128, max_tokens=256, seed=1, spec_bench=None)
    assert manifest(again)["token_ids_sha256"] == manifest(local_set)["token_ids_sha256"]
    assert manifest(other)["token_ids_sha256"] != manifest(local_set)["token_ids_sha256"]


def test_short_qa_differs(tok, local_set):
    # 512: the short bucket (1/8 of max_tokens) must hold the chat template's system prompt plus a question.
    qa = build_calibration_set(tok, n_samples=128, max_tokens=512, mix="short_qa", seed=0, spec_bench=None)
    assert set(qa["bucket"]) == {"short"} and max(qa["n_tokens"]) <= 64
    assert not {"code", "docs"} & set(qa["task"])
    assert sum(qa["n_tokens"]) < sum(local_set["n_tokens"]) / 2


@pytest.mark.skipif(not SPEC_BENCH_PATH.exists(), reason=f"Spec-Bench questions not found at {SPEC_BENCH_PATH}")
def test_spec_bench_used_when_present(tok):
    ds = build_calibration_set(tok, n_samples=128, max_tokens=256, seed=0)
    tasks = set(ds["task"])
    assert any(t.startswith("spec_bench/") for t in tasks) and {"docs", "code", "chat"} <= tasks
    assert any("spec_bench" in s for s in manifest(ds)["sources"])


class _Counting:
    """A tokenizer that counts the texts it is asked to tokenize."""

    def __init__(self, tok):
        self.tok, self.calls = tok, 0

    def __call__(self, text, **kw):
        self.calls += 1
        return self.tok(text, **kw)

    def apply_chat_template(self, *args, **kw):
        return self.tok.apply_chat_template(*args, **kw)


def test_a_source_is_tokenized_once_per_tokenizer_and_text(tok, monkeypatch, tmp_path):
    """Calibration sets drawn again, or at another length cap, tokenize nothing again and come out the same; a
    question added to the Spec-Bench file is tokenized (it alone) and appears; another tokenizer starts afresh."""
    import json

    from lab.quant import calibration

    # a small stand-in for the stdlib and docs texts: the test is about what is tokenized when, not what
    monkeypatch.setattr(calibration, "_stdlib_texts", lambda: [(f"stdlib:{i}.py", f"def f{i}(x):\n    return x\n" * 60)
                                                                for i in range(30)])
    monkeypatch.setattr(calibration, "_docs_texts", lambda: [(f"docs:{i}", f"Lists, part {i}. " * 80)
                                                              for i in range(30)])
    questions = tmp_path / "question.jsonl"
    questions.write_text(json.dumps({"question_id": 1, "category": "qa", "turns": ["Name a prime number."]}) + "\n")
    counting = _Counting(tok)
    first = build_calibration_set(counting, n_samples=40, max_tokens=200, spec_bench=questions)
    tokenized = counting.calls
    assert tokenized == 30 + 30 + len(CHAT_PROMPTS) + 1
    again = build_calibration_set(counting, n_samples=40, max_tokens=200, spec_bench=questions)
    fresh = build_calibration_set(tok, n_samples=40, max_tokens=200, spec_bench=questions)
    assert manifest(first) == manifest(again) == manifest(fresh)
    build_calibration_set(counting, n_samples=40, max_tokens=120, spec_bench=questions)
    assert counting.calls == tokenized
    with questions.open("a") as f:
        f.write(json.dumps({"question_id": 2, "category": "math", "turns": ["What is 2 + 2?"]}) + "\n")
    grown = build_calibration_set(counting, n_samples=40, max_tokens=200, spec_bench=questions)
    assert counting.calls == tokenized + 1 and "spec_bench/math" in set(grown["task"])
    other = _Counting(tok)
    build_calibration_set(other, n_samples=40, max_tokens=200, spec_bench=questions)
    assert other.calls == tokenized + 1


@pytest.fixture(scope="module")
def items():
    return load_items()


def test_sensitive_set_size(items):
    assert len(items) >= 200
    assert set(Counter(i.category for i in items)) == set(CATEGORIES)
    assert len({i.id for i in items}) == len(items)


def _wrong(item):
    """A plausible but wrong answer for each category."""
    d = item.data
    if item.category == "numbers":
        return f"The answer is {int(d['answer']) + 1}."
    if item.category == "code":
        return f"```python\ndef {d['entry_point']}(*args):\n    return None\n```"
    if item.category == "proper_nouns":
        return item.reference.replace(d["name"], d["name"][:-1])  # one letter dropped
    return {"long_context": "The passphrase is unknown.", "multilingual": "I cannot translate that."}[item.category]


def test_every_check_passes_reference_and_fails_wrong(items):
    for item in items:
        ok, reason = check(item, item.reference)
        assert ok, (item.id, reason)
        bad, reason = check(item, _wrong(item))
        assert not bad, (item.id, reason)


def test_code_check_rejects_syntax_error_and_hang(items, monkeypatch):
    import lab.eval.sensitive as sensitive

    item = next(i for i in items if i.category == "code")
    assert not check(item, "def broken(:\n")[0]
    monkeypatch.setattr(sensitive, "CODE_TIMEOUT_S", 0.5)
    ok, reason = check(item, "while True:\n    pass\n")
    assert not ok and "timed out" in reason


def test_long_context_prompt(tok, items):
    item = next(i for i in items if i.category == "long_context")
    prompt = build_prompt(item, tok)
    assert item.data["fact"] in prompt
    n = len(tok(prompt, add_special_tokens=False)["input_ids"])
    assert item.data["length"] <= n <= item.data["length"] + 200
    # the fact sits near its requested depth
    assert re.search(re.escape(item.data["fact"]), prompt).start() / len(prompt) == pytest.approx(
        item.data["depth"], abs=0.1)
