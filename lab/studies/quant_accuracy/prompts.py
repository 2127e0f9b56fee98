"""Notebook 02's prompts beyond the calibration sets: Spec-Bench's questions (Xia et al., 2024, Apache-2.0, read
from `lab.quant.calibration.SPEC_BENCH_PATH`), chosen so that no calibration set has seen them.

- `summarization_prompts`: long articles to summarize, for the calibration-mismatch study (seeds/003 section 2:
  a short-Q&A calibration set damages long summarization);
- `checkpoint_prompts`: one first turn per category, to show a saved checkpoint's outputs.
"""

from __future__ import annotations


def summarization_prompts(tokenizer, n: int, exclude_sources: set[str]) -> tuple[list[str], list[str]]:
    """Chat prompts asking for a summary of Spec-Bench summarization articles that no calibration set in
    `exclude_sources` used; (prompts, question ids). Empty when the Spec-Bench file is absent."""
    import json

    from lab.quant.calibration import SPEC_BENCH_PATH

    if not SPEC_BENCH_PATH.exists():
        return [], []
    prompts, ids = [], []
    with SPEC_BENCH_PATH.open(encoding="utf-8") as f:
        for rec in map(json.loads, filter(str.strip, f)):
            if rec["category"] != "summarization" or f"spec_bench:{rec['question_id']}" in exclude_sources:
                continue
            chat = [{"role": "user", "content": rec["turns"][0]}]
            prompts.append(tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False))
            ids.append(f"spec_bench:{rec['question_id']}")
            if len(prompts) == n:
                break
    return prompts, ids


def checkpoint_prompts(tokenizer, n: int) -> list[str]:
    """`n` chat prompts to show checkpoint outputs on: Spec-Bench first turns, one category after another,
    when the file is present; else the project's own chat prompts."""
    import json

    from lab.quant.calibration import CHAT_PROMPTS, SPEC_BENCH_PATH

    questions = list(CHAT_PROMPTS)
    if SPEC_BENCH_PATH.exists():
        by_cat: dict[str, list[str]] = {}
        with SPEC_BENCH_PATH.open(encoding="utf-8") as f:
            for rec in map(json.loads, filter(str.strip, f)):
                if rec["category"] not in ("summarization", "rag"):  # long articles: kept for the mismatch study
                    by_cat.setdefault(rec["category"], []).append(rec["turns"][0])
        questions = [q for group in zip(*by_cat.values()) for q in group]
    if n > len(questions):
        raise ValueError(f"N_PROMPTS={n} but only {len(questions)} prompts are available")
    return [tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False)
            for q in questions[:n]]
