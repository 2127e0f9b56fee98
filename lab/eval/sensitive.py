"""A quantization-sensitive evaluation set: items whose answers break first when weights lose precision.

Why these categories: exact arithmetic, code that must run, rare names copied token by token, retrieval from
deep in a long context and non-English text are the tasks reported to degrade before perplexity moves
(Jin et al., 2024, "A Comprehensive Evaluation of Quantization Strategies for Large Language Models",
arXiv:2402.16775; Li et al., 2024, "Evaluating Quantized Large Language Models", arXiv:2402.18158; Marchisio
et al., 2024, "How Does Quantization Affect Multilingual LLMs?", arXiv:2407.03211). The long-context items
follow the needle-in-a-haystack layout (Kamradt, 2023, github.com/gkamradt/LLMTest_NeedleInAHaystack) with
filler from the CPython documentation (`pydoc_data.topics`), built at evaluation time from each item's seed.

The items are data, written for this project: `calibration_data/sensitive/<category>.jsonl`. Every item
carries a hand-written `reference` answer that passes its own check (tests/test_calibration_sensitive.py).
"""

from __future__ import annotations

import json
import random
import re
import subprocess
import sys
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from pathlib import Path

ITEMS_DIR = Path(__file__).resolve().parents[2] / "calibration_data" / "sensitive"
CATEGORIES = ("numbers", "code", "proper_nouns", "long_context", "multilingual")
# Generated code runs in a fresh interpreter; a model that writes `while True:` must not stall the sweep.
CODE_TIMEOUT_S = 5.0

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")
_CODE_BLOCK = re.compile(r"```(?:python|py)?\s*\n(.*?)```", re.DOTALL)


@dataclass
class Item:
    id: str
    category: str
    data: dict  # the whole JSON record; category-specific fields (answer, asserts, name, fact, keywords...)

    @property
    def reference(self) -> str:
        return self.data["reference"]


def load_items(categories: tuple[str, ...] = CATEGORIES, items_dir: Path = ITEMS_DIR) -> list[Item]:
    items = []
    for category in categories:
        with (items_dir / f"{category}.jsonl").open(encoding="utf-8") as f:
            items += [Item(r["id"], r["category"], r) for r in map(json.loads, f) if r]
    return items


def _filler(tokenizer, n_tokens: int, seed: int) -> list[int]:
    """n_tokens of documentation text: pydoc topics in a seeded order, concatenated and cut."""
    from pydoc_data.topics import topics

    keys = sorted(topics)
    random.Random(seed).shuffle(keys)
    ids: list[int] = []
    for key in keys:
        ids += tokenizer(topics[key] + "\n\n", add_special_tokens=False)["input_ids"]
        if len(ids) >= n_tokens:
            break
    return ids[:n_tokens]


def long_context_text(item: Item, tokenizer) -> str:
    """The haystack with the fact inserted at `depth` (a fraction of `length` tokens), at a line break so the
    fact is not spliced into the middle of a word."""
    filler = tokenizer.decode(_filler(tokenizer, item.data["length"], item.data["seed"]))
    cut = int(len(filler) * item.data["depth"])
    newline = filler.find("\n", cut)
    cut = newline + 1 if newline != -1 else cut
    return f"{filler[:cut]}\n{item.data['fact']}\n\n{filler[cut:]}"


def user_message(item: Item, tokenizer=None) -> str:
    if item.category == "long_context":
        if tokenizer is None:
            raise ValueError("long-context items need the tokenizer to size their filler")
        return f"{long_context_text(item, tokenizer)}\n\n{item.data['question']}"
    return item.data["prompt"]


def build_prompt(item: Item, tokenizer) -> str:
    """The chat-formatted prompt text, ready for generation."""
    return tokenizer.apply_chat_template([{"role": "user", "content": user_message(item, tokenizer)}],
                                         add_generation_prompt=True, tokenize=False)


def _check_numbers(item: Item, output: str) -> tuple[bool, str]:
    # The last number in the output: models that reason aloud end with their answer.
    numbers = _NUMBER.findall(output)
    if not numbers:
        return False, "no number in output"
    try:
        got = Decimal(numbers[-1].replace(",", ""))
    except InvalidOperation:
        return False, f"unparsable number {numbers[-1]!r}"
    want = Decimal(item.data["answer"])
    return (got == want), f"got {got}, expected {want}"


def extract_code(output: str) -> str:
    """The first fenced code block, else the whole output (small models often skip the fence)."""
    match = _CODE_BLOCK.search(output)
    return match.group(1) if match else output


def _check_code(item: Item, output: str) -> tuple[bool, str]:
    code = extract_code(output)
    try:
        compile(code, f"<{item.id}>", "exec")
    except SyntaxError as e:
        return False, f"does not compile: {e.msg} (line {e.lineno})"
    program = code + "\n\n" + "\n".join(f"assert {a}, {a!r}" for a in item.data["asserts"]) + "\n"
    # -I: isolated mode, so the generated code sees neither the user's site-packages nor the working directory.
    try:
        run = subprocess.run([sys.executable, "-I", "-c", program], capture_output=True, text=True,
                             timeout=CODE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return False, f"timed out after {CODE_TIMEOUT_S} s"
    if run.returncode != 0:
        last = (run.stderr.strip().splitlines() or ["(no stderr)"])[-1]
        return False, f"failed: {last}"
    return True, f"{len(item.data['asserts'])} asserts passed"


def _check_proper_nouns(item: Item, output: str) -> tuple[bool, str]:
    # Exact, case- and diacritic-sensitive: a quantized model that drops an accent or a letter fails.
    name = item.data["name"]
    return (name in output), (f"found {name!r}" if name in output else f"{name!r} not reproduced exactly")


def _check_long_context(item: Item, output: str) -> tuple[bool, str]:
    answer = item.data["answer"]
    found = answer.casefold() in output.casefold()
    return found, (f"retrieved {answer!r}" if found else f"{answer!r} not in output")


def _check_multilingual(item: Item, output: str) -> tuple[bool, str]:
    # Each keyword group lists accepted variants; every group needs one of them.
    text = output.casefold()
    missing = [group for group in item.data["keywords"] if not any(k.casefold() in text for k in group)]
    if missing:
        return False, "missing " + "; ".join("/".join(g) for g in missing)
    return True, "all keywords present"


CHECKS = {"numbers": _check_numbers, "code": _check_code, "proper_nouns": _check_proper_nouns,
          "long_context": _check_long_context, "multilingual": _check_multilingual}


def check(item: Item, output_text: str) -> tuple[bool, str]:
    """(passed, reason) for a model's output on `item`."""
    return CHECKS[item.category](item, output_text)
