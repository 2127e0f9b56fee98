"""Calibration sets for weight quantization (GPTQ, AWQ) and static activation/KV scales, from local text only.

Why a mixed set: GPTQ (Frantar et al., 2022, arXiv:2210.17323) and AWQ (Lin et al., 2023, arXiv:2306.00978)
fit their corrections to the activations of the calibration data, and AWQ's authors report that the choice of
calibration distribution matters (AWQ §5, "data efficiency and generalization"); Williams & Aletras (2024,
arXiv:2311.09755, "On the impact of calibration data in post-training quantization and pruning") measure
downstream swings from the calibration source alone. So the default set mixes task types and lengths, and a
deliberately narrow "short_qa" set exists to measure that mismatch.

Sources, all on this machine (nothing is downloaded):
- docs: the help texts of the Python documentation shipped with CPython (`pydoc_data.topics.topics`);
- code: standard-library `.py` files under `os.path.dirname(os.__file__)`, chosen by a hash of their path;
- chat: the prompts in `CHAT_PROMPTS` below, formatted with the tokenizer's chat template;
- spec_bench/<category>: the questions of `../shared/data/spec_bench/question.jsonl` (Spec-Bench, Xia et al.,
  2024, arXiv:2401.07851) when that file exists; it is read in place, never copied into the repository.

`build_calibration_set` returns a `datasets.Dataset` (Hugging Face `datasets`, https://huggingface.co/docs/datasets)
of token ids labelled with task and length bucket; `save_calibration_set` stores it with `save_to_disk` in the
git-ignored cache and writes a small manifest to `calibration_data/` that is committed.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import sys
import weakref
from array import array
from collections import Counter
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import datasets

from lab.models.loader import cache_dir

REPO_ROOT = Path(__file__).resolve().parents[2]
SPEC_BENCH_PATH = REPO_ROOT.parent / "shared" / "data" / "spec_bench" / "question.jsonl"
MANIFEST_DIR = REPO_ROOT / "calibration_data"

# Length buckets as fractions of max_tokens: (name, upper bound inclusive). A sample of n tokens falls in the
# first bucket whose bound * max_tokens >= n.
BUCKETS = (("short", 1 / 8), ("medium", 1 / 2), ("long", 1.0))
# Pieces of one document kept in the pool: enough to give each bucket a few pieces from long texts without
# letting one long file (e.g. a 5,000-line module) dominate its task.
PIECES_PER_DOCUMENT = 3
# Standard-library files read for the code pool: reading all ~700 costs seconds and adds nothing to a
# 128-512 sample set.
STDLIB_FILES = 200
# Samples drawn when blocks are packed (`pack_blocks`): the top of the 128-512 range, ~80K tokens stratified.
PACK_POOL_SAMPLES = 512
# Fixed seed for how documents are cut, so the pool is the same for every sampling seed and only the
# selection varies with `seed`.
CUT_SEED = 1234

CHAT_PROMPTS = [
    "What is the difference between a list and a tuple in Python?",
    "Summarize the plot of a heist movie in three sentences.",
    "How do I convert Celsius to Fahrenheit? Give the formula and one example.",
    "Write a haiku about autumn rain.",
    "Explain what a hash table is to a twelve-year-old.",
    "Give me three tips for a job interview.",
    "What causes the seasons on Earth?",
    "Plan a one-day itinerary for a rainy day in a small coastal town.",
    "Why is the sky blue?",
    "Write a polite email declining a meeting invitation.",
    "What is 17 multiplied by 23? Show your steps.",
    "Translate 'good morning, how are you?' into Spanish.",
    "List the planets of the solar system in order from the Sun.",
    "What are the main differences between TCP and UDP?",
    "Suggest a name for a bakery that specializes in sourdough.",
    "How does compound interest work?",
    "Write a limerick about a cat who loves to code.",
    "Explain recursion with a simple example.",
    "What should I pack for a three-day hiking trip?",
    "Describe the water cycle briefly.",
    "What is the capital of Australia, and why is it not Sydney?",
    "Give a short pep talk to someone starting to learn the violin.",
    "What is a prime number? Name the first five.",
    "Rewrite this sentence to be more formal: 'gonna be late, sorry'.",
    "Explain the difference between weather and climate.",
    "How do vaccines train the immune system?",
    "Write a two-line dialogue between a pirate and a robot.",
    "What is the Pythagorean theorem?",
    "Recommend a strategy for learning vocabulary in a new language.",
    "Why do we have leap years?",
    "Explain what an API is, in one paragraph.",
    "What are three ways to reduce household energy use?",
]

# Questions about the documentation topics, for the short Q&A pool (each template once per topic key).
TOPIC_QUESTIONS = ("In Python, what does '{key}' refer to?", "Give a one-line example of Python {key}.",
                   "What is a common mistake with Python {key}?", "When would I use Python {key}?")


@dataclass
class Sample:
    input_ids: list[int]
    task: str
    bucket: str
    source: str


def bucket_of(n_tokens: int, max_tokens: int) -> str:
    return next(name for name, frac in BUCKETS if n_tokens <= frac * max_tokens)


def _bucket_range(name: str, max_tokens: int) -> tuple[int, int]:
    bounds = [0] + [int(frac * max_tokens) for _, frac in BUCKETS]
    i = [b for b, _ in BUCKETS].index(name)
    return bounds[i] + 1, bounds[i + 1]


def _path_key(path: str) -> str:
    return hashlib.sha256(path.encode()).hexdigest()


def _docs_texts() -> list[tuple[str, str]]:
    from pydoc_data.topics import topics

    return [(f"pydoc_data.topics[{key!r}]", topics[key]) for key in sorted(topics)]


STDLIB_SKIPPED = frozenset({"test", "tests", "idle_test", "site-packages"})  # folders of fixtures, or not the stdlib


def stdlib_root() -> Path:
    return Path(os.path.dirname(os.__file__))


@cache
def stdlib_files() -> tuple[str, ...]:
    """Every `.py` file of the standard library outside `STDLIB_SKIPPED` folders, relative to `stdlib_root()`, in
    order of a hash of the path: deterministic, but spread over packages. The calibration pool reads the first
    `STDLIB_FILES` (`_stdlib_texts`); the held-out code domain (`lab.eval.harness.heldout_stdlib_files`) the rest.
    Listed once a process, skipped folders pruned from the walk."""
    root, rels = stdlib_root(), []
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d not in STDLIB_SKIPPED]
        rels += [Path(folder, f).relative_to(root).as_posix() for f in files if f.endswith(".py")]
    return tuple(sorted(rels, key=_path_key))


@cache
def _stdlib_texts() -> list[tuple[str, str]]:
    """The first `STDLIB_FILES` of `stdlib_files()` with their text, read once a process."""
    root = stdlib_root()
    return [(f"stdlib:{rel}", (root / rel).read_text(encoding="utf-8", errors="replace"))
            for rel in stdlib_files()[:STDLIB_FILES]]


def _spec_bench_records(path: Path) -> list[dict]:
    with path.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def chat_token_ids(tokenizer, text: str) -> list[int]:
    # Template to text, then tokenize: apply_chat_template(tokenize=True) returns an Encoding object in
    # recent transformers releases, plain ids in older ones.
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                           tokenize=False)
    return tokenizer(prompt, add_special_tokens=False)["input_ids"]


# Token ids of the pools' sources already tokenized in this process, per tokenizer object (held weakly: a tokenizer
# let go takes its entries with it), keyed by the text itself and whether it went through the chat template.
_TOKENIZED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _token_ids(tokenizer, text: str, chat: bool = False) -> list[int]:
    """`text`'s token ids (as a user message under the chat template with `chat`), tokenized once a process for one
    tokenizer: a quantization grid draws each method's calibration set from pools of the same sources (notebook
    02's smoke run tokenized the 200 standard-library files four times, 13 of its 29 s), and two length caps cut
    the same documents. Keyed by the text, so an edited source is tokenized again."""
    done = _TOKENIZED.setdefault(tokenizer, {})
    if (chat, text) not in done:
        done[chat, text] = array("i", chat_token_ids(tokenizer, text) if chat else
                                 tokenizer(text, add_special_tokens=False)["input_ids"])
    return done[chat, text].tolist()


def _cut(ids: list[int], task: str, source: str, max_tokens: int, rng: random.Random) -> list[Sample]:
    """Consecutive pieces of a long text, each with a length drawn from the next bucket in turn, so that
    every task has pieces of every bucket it is long enough for."""
    pieces, start = [], 0
    for i in range(PIECES_PER_DOCUMENT):
        lo, hi = _bucket_range(BUCKETS[(len(BUCKETS) - 1 - i) % len(BUCKETS)][0], max_tokens)
        piece = ids[start:start + rng.randint(lo, hi)]
        if not piece:
            break
        pieces.append(Sample(piece, task, bucket_of(len(piece), max_tokens), source))
        start += len(piece)
    return pieces


def _stratified_pool(tokenizer, max_tokens: int, spec_bench: Path | None) -> list[Sample]:
    rng = random.Random(CUT_SEED)
    pool = []
    for task, texts in (("docs", _docs_texts()), ("code", _stdlib_texts())):
        for source, text in texts:
            pool += _cut(_token_ids(tokenizer, text), task, source, max_tokens, rng)
    for i, prompt in enumerate(CHAT_PROMPTS):
        ids = _token_ids(tokenizer, prompt, chat=True)[:max_tokens]
        pool.append(Sample(ids, "chat", bucket_of(len(ids), max_tokens), f"CHAT_PROMPTS[{i}]"))
    if spec_bench is not None:
        for rec in _spec_bench_records(spec_bench):
            # Multi-turn questions become one user message per turn; the answers are not in the file.
            ids = _token_ids(tokenizer, "\n\n".join(rec["turns"]), chat=True)[:max_tokens]
            pool.append(Sample(ids, f"spec_bench/{rec['category']}", bucket_of(len(ids), max_tokens),
                               f"spec_bench:{rec['question_id']}"))
    return pool


def _short_qa_pool(tokenizer, max_tokens: int, spec_bench: Path | None) -> list[Sample]:
    """Short chat-formatted questions only: the narrow distribution of the calibration-mismatch experiment."""
    from pydoc_data.topics import topics

    questions = [(f"CHAT_PROMPTS[{i}]", "chat", q) for i, q in enumerate(CHAT_PROMPTS)]
    questions += [(f"pydoc_topic:{key}", "docs_qa", t.format(key=key.replace("-", " ")))
                  for key in sorted(topics) for t in TOPIC_QUESTIONS]
    if spec_bench is not None:
        questions += [(f"spec_bench:{rec['question_id']}", f"spec_bench/{rec['category']}", rec["turns"][0])
                      for rec in _spec_bench_records(spec_bench)]
    limit = int(BUCKETS[0][1] * max_tokens)
    pool = []
    for source, task, q in questions:
        ids = _token_ids(tokenizer, q, chat=True)
        if len(ids) <= limit:  # too long for a "short" question: left out, not truncated mid-question
            pool.append(Sample(ids, task, "short", source))
    return pool


def _allocate(n: int, capacity: dict[str, int]) -> dict[str, int]:
    """Split n as evenly as possible over the keys, no key above its capacity (water-filling); the
    remainder goes to keys in sorted order so the split is deterministic."""
    if n > sum(capacity.values()):
        raise ValueError(f"asked for {n} samples but the pool has only {sum(capacity.values())}")
    alloc, left = dict.fromkeys(capacity, 0), n
    while left:
        open_keys = sorted(k for k in capacity if alloc[k] < capacity[k])
        share = max(left // len(open_keys), 1)
        for k in open_keys:
            take = min(share, capacity[k] - alloc[k], left)
            alloc[k] += take
            left -= take
            if not left:
                break
    return alloc


def _sample(pool: list[Sample], n: int, seed: int) -> list[Sample]:
    """Stratified by task first (each task an equal share), then by length bucket within a task."""
    rng = random.Random(seed)
    by_task: dict[str, list[Sample]] = {}
    for s in pool:
        by_task.setdefault(s.task, []).append(s)
    chosen = []
    for task, k in _allocate(n, {t: len(v) for t, v in by_task.items()}).items():
        by_bucket: dict[str, list[Sample]] = {}
        for s in by_task[task]:
            by_bucket.setdefault(s.bucket, []).append(s)
        for bucket, m in _allocate(k, {b: len(v) for b, v in by_bucket.items()}).items():
            chosen += rng.sample(by_bucket[bucket], m)
    rng.shuffle(chosen)
    return chosen


def build_calibration_set(tokenizer, n_samples: int = 128, max_tokens: int = 512, mix: str = "stratified",
                          seed: int = 0, spec_bench: Path | None = SPEC_BENCH_PATH) -> datasets.Dataset:
    """A `datasets.Dataset` with columns input_ids, task, bucket, n_tokens, source. `spec_bench=None` (or a
    path that does not exist) leaves Spec-Bench out."""
    if mix not in ("stratified", "short_qa"):
        raise ValueError(f"mix must be 'stratified' or 'short_qa', not {mix!r}")
    spec_bench = spec_bench if spec_bench is not None and Path(spec_bench).exists() else None
    build_pool = _stratified_pool if mix == "stratified" else _short_qa_pool
    samples = _sample(build_pool(tokenizer, max_tokens, spec_bench), n_samples, seed)
    ds = datasets.Dataset.from_dict({
        "input_ids": [s.input_ids for s in samples],
        "task": [s.task for s in samples],
        "bucket": [s.bucket for s in samples],
        "n_tokens": [len(s.input_ids) for s in samples],
        "source": [s.source for s in samples],
    })
    ds.info.description = json.dumps({"mix": mix, "seed": seed, "max_tokens": max_tokens,
                                      "sources": _source_list(mix, spec_bench)})
    return ds


def pack_blocks(sequences: list[list[int]], n_blocks: int, block_tokens: int) -> list[list[int]]:
    """Concatenate `sequences` in order and cut `n_blocks` blocks of exactly `block_tokens` tokens: the
    fixed-length layout of the GPTQ reference (random 2048-token windows of C4) and of AutoAWQ (its samples
    joined and split into 512-token blocks), for timing the algorithms at their published sizes."""
    if n_blocks < 1 or block_tokens < 1:
        raise ValueError(f"n_blocks={n_blocks} and block_tokens={block_tokens} must be >= 1")
    flat = [t for ids in sequences for t in ids]
    if len(flat) < n_blocks * block_tokens:
        raise ValueError(f"{n_blocks} blocks of {block_tokens} tokens need {n_blocks * block_tokens} tokens; "
                         f"the sequences hold {len(flat)}")
    return [flat[i * block_tokens:(i + 1) * block_tokens] for i in range(n_blocks)]


def _source_list(mix: str, spec_bench: Path | None) -> list[str]:
    python = f"CPython {sys.version.split()[0]}"
    sources = [f"pydoc_data.topics ({python})", "lab.quant.calibration.CHAT_PROMPTS"]
    if mix == "stratified":
        sources.append(f"standard library .py files ({python}, {STDLIB_FILES} by path hash)")
    if spec_bench is not None:
        digest = hashlib.sha256(Path(spec_bench).read_bytes()).hexdigest()[:16]
        sources.append(f"../shared/data/spec_bench/question.jsonl (sha256 {digest})")
    return sources


def token_hash(ds: datasets.Dataset) -> str:
    """sha256 of the token ids, sample by sample with their lengths, so reordering or re-cutting changes it."""
    h = hashlib.sha256()
    for ids in ds["input_ids"]:
        h.update(len(ids).to_bytes(4, "little"))
        h.update(b"".join(i.to_bytes(4, "little") for i in ids))
    return h.hexdigest()


def manifest(ds: datasets.Dataset) -> dict:
    meta = json.loads(ds.info.description)
    return {
        **meta,
        "n_samples": len(ds),
        "tokens_total": sum(ds["n_tokens"]),
        "per_task": dict(sorted(Counter(ds["task"]).items())),
        "per_bucket": dict(sorted(Counter(ds["bucket"]).items())),
        "per_task_bucket": dict(sorted(Counter(f"{t}/{b}" for t, b in zip(ds["task"], ds["bucket"])).items())),
        "tokens_per_task": {t: sum(n for tt, n in zip(ds["task"], ds["n_tokens"]) if tt == t)
                            for t in sorted(set(ds["task"]))},
        "token_ids_sha256": token_hash(ds),
    }


def save_calibration_set(ds: datasets.Dataset, name: str, manifest_dir: Path = MANIFEST_DIR) -> Path:
    """Store the dataset under the git-ignored cache and write `<manifest_dir>/<name>.manifest.json`."""
    out = cache_dir() / "calibration" / name
    ds.save_to_disk(str(out))
    manifest_dir.mkdir(parents=True, exist_ok=True)
    (manifest_dir / f"{name}.manifest.json").write_text(json.dumps(manifest(ds), indent=1) + "\n")
    return out


def load_calibration_set(name: str) -> datasets.Dataset:
    return datasets.load_from_disk(str(cache_dir() / "calibration" / name))


# The sets whose manifests are committed: `python -m lab.quant.calibration` rebuilds them.
DEFAULT_SETS = {"stratified-128": dict(n_samples=128, mix="stratified"),
                "short_qa-128": dict(n_samples=128, mix="short_qa")}

if __name__ == "__main__":
    from lab.models.loader import load_tokenizer, resolve_model_dir

    tok = load_tokenizer(resolve_model_dir("smollm2-135m"))
    for set_name, kwargs in DEFAULT_SETS.items():
        print(set_name, save_calibration_set(build_calibration_set(tok, **kwargs), set_name))
