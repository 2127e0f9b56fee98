"""Task categories for acceptance-rate studies.

Two sources, one record type (`TaskPrompt`):

- the lab's own prompt set, `calibration_data/spec_prompts.jsonl` (written for this project; one JSON object a
  line with `id`, `category`, `prompt`), covering the deployment article's categories (seeds/003 section 5:
  code completion, rewriting, translation and summarization expected "above 0.7", open-ended writing "often
  below 0.5");
- Spec-Bench's `question.jsonl` (Xia et al., 2024, "Unlocking Efficiency in Large Language Model Inference",
  arXiv:2401.07851; one object a line with `question_id`, `category`, `turns`), read from wherever it is given,
  never copied. Its first 80 questions are MT-bench's eight categories, which Spec-Bench reports together as
  multi-turn conversation; the lab runs their first turn only (a second turn needs the model's own first
  answer), and says so in the record's category. Any other category in that format (a user's own file) keeps
  its label.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from lab.quant.calibration import REPO_ROOT, SPEC_BENCH_PATH

LAB_PROMPTS = REPO_ROOT / "calibration_data" / "spec_prompts.jsonl"
MT_BENCH = {"writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities"}
SPEC_BENCH_CATEGORIES = {"translation": "translation", "summarization": "summarization", "qa": "question answering",
                         "math_reasoning": "math reasoning", "rag": "retrieval-augmented generation"}
MULTI_TURN = "multi-turn conversation (first turn)"


@dataclass(frozen=True)
class TaskPrompt:
    id: str
    category: str
    text: str  # the user message, before the chat template


def _record(rec: dict, where: str) -> TaskPrompt:
    if "turns" in rec:  # Spec-Bench's format; a user's own categories keep their labels
        cat, turns = rec.get("category"), rec["turns"]
        if not isinstance(cat, str) or not cat:
            raise ValueError(f"{where}: category must be a non-empty string, got {cat!r}")
        if not isinstance(turns, list) or not turns or not isinstance(turns[0], str):
            raise ValueError(f"{where}: turns must be a non-empty list of strings, got {turns!r}")
        label = MULTI_TURN if cat in MT_BENCH else SPEC_BENCH_CATEGORIES.get(cat, cat)
        return TaskPrompt(f"spec_bench:{rec.get('question_id', where)}", label, turns[0])
    if {"id", "category", "prompt"} <= rec.keys():
        return TaskPrompt(str(rec["id"]), rec["category"], rec["prompt"])
    raise ValueError(f"{where}: a record needs either Spec-Bench's question_id/category/turns or the lab's "
                     f"id/category/prompt, got keys {sorted(rec)}")


def load_prompts(path: str | Path | None = None, per_category: int | None = None) -> list[TaskPrompt]:
    """The prompts of a JSONL file in either format (default: the lab's set), in file order, the first
    `per_category` of each category when given."""
    path = Path(path) if path else LAB_PROMPTS
    if not path.is_file():
        hint = f" (Spec-Bench is expected at {SPEC_BENCH_PATH})" if "spec_bench" in str(path) else ""
        raise FileNotFoundError(f"prompt file {path} does not exist{hint}")
    if per_category is not None and per_category < 1:
        raise ValueError(f"per_category must be a positive int or None, got {per_category}")
    prompts, taken = [], defaultdict(int)
    with path.open(encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{i}: not JSON ({e})") from None
            p = _record(rec, f"{path}:{i}")
            if per_category is None or taken[p.category] < per_category:
                taken[p.category] += 1
                prompts.append(p)
    return prompts

