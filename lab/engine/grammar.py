"""Grammars for structured output: what a request may ask its output to be, compiled once, applied as token masks.

`StructuredOutputsParams` (vLLM's name and fields) names one language the output must belong to: a JSON Schema,
any JSON object, a regular expression, an EBNF grammar (GBNF's dialect, as llama.cpp writes it), or one of a list
of strings. `Grammars` compiles it with xgrammar (Dong et al., 2024, "XGrammar: Flexible and Efficient Structured
Generation Engine for Large Language Models", arXiv:2411.15100): the grammar becomes a pushdown automaton whose
token masks are mostly precomputed per state (the tokens whose acceptance does not depend on the stack), so a
matcher fills a step's mask in microseconds. The matcher itself, one per request, is `lab.engine.structured`'s.

What is cached, and for how long:
- the tokenizer's vocabulary as xgrammar's `TokenizerInfo` (decoding 49k tokens takes ~0.1 s): once per
  tokenizer, model vocabulary width and stop tokens, shared by every engine on that tokenizer (`grammars_for`);
- compiled grammars by their text (a JSON schema by its dump, so a dict and its text, however spaced, are one
  entry; key order is kept, since it is the order the properties are generated in): the `MAX_CACHED` most
  recently used, so the same schema sent twice compiles once.

`apply_bitmask` turns xgrammar's packed bitmask (token t is bit t % 32 of int32 word t // 32) into -inf logits
where the logits are.
"""

from __future__ import annotations

import json
import re
import threading
import weakref
from collections import OrderedDict
from dataclasses import dataclass

import torch

from .text import check_text, check_texts

MAX_CACHED = 256  # compiled grammars kept per tokenizer (least recently used first out)
KINDS = ("json", "regex", "grammar", "choice", "json_object")


@dataclass
class StructuredOutputsParams:
    """Exactly one constraint. `json`: a JSON Schema (a dict or its text); `regex`: the whole output matches it;
    `grammar`: EBNF with a `root` rule; `choice`: the output is one of these strings; `json_object`: any JSON
    object (OpenAI's response_format json_object)."""

    json: dict | str | None = None
    regex: str | None = None
    grammar: str | None = None
    choice: list[str] | None = None
    json_object: bool = False

    def __post_init__(self):
        given = [k for k in KINDS if getattr(self, k) not in (None, False)]
        if len(given) != 1:
            raise ValueError(f"structured_outputs takes exactly one of {', '.join(KINDS)}; got "
                             f"{', '.join(given) if given else 'none'}")
        if not isinstance(self.json_object, bool):
            raise ValueError(f"json_object must be True or False, got {self.json_object!r}")
        for name in ("regex", "grammar"):
            if getattr(self, name) is not None and not (isinstance(getattr(self, name), str) and getattr(self, name)):
                raise ValueError(f"{name} must be a non-empty string, got {getattr(self, name)!r}")
        if self.choice is not None and (not isinstance(self.choice, (list, tuple)) or not self.choice
                                        or not all(isinstance(c, str) and c for c in self.choice)):
            raise ValueError(f"choice must be a non-empty list of non-empty strings, got {self.choice!r}")
        for name in ("regex", "grammar"):
            if getattr(self, name) is not None:
                check_text(getattr(self, name), name)
        for i, c in enumerate(self.choice or ()):
            check_text(c, f"choice[{i}]")
        if self.json is not None:
            check_texts(self.json, "json")
            self.schema_text()  # a schema that is not JSON is refused here, at the door

    def schema_text(self) -> str:
        """The JSON schema, dumped in one spacing (not sorted: the properties come out in the schema's order)."""
        schema = self.json
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except json.JSONDecodeError as e:
                raise ValueError(f"the JSON schema is not valid JSON: {e}") from None
        if not isinstance(schema, (dict, bool)):
            raise ValueError(f"a JSON schema is an object (or true/false), got {type(schema).__name__}")
        try:
            return json.dumps(schema)
        except (TypeError, ValueError) as e:
            raise ValueError(f"the JSON schema cannot be written as JSON: {e}") from None

    @property
    def kind(self) -> str:
        return next(k for k in KINDS if getattr(self, k) not in (None, False))

    @property
    def text(self) -> str:
        """The constraint as the compiler reads it; with `kind`, the cache key."""
        if self.json is not None:
            return self.schema_text()
        if self.choice is not None:  # an alternation of string literals (JSON escapes are EBNF's)
            return "root ::= " + " | ".join(json.dumps(c, ensure_ascii=False) for c in self.choice)
        if self.json_object:
            return '{"type": "object"}'
        return self.regex if self.regex is not None else self.grammar


_DESCRIPTIONS = {"json": "the JSON schema", "json_object": "the JSON object grammar", "regex": "the regex",
                 "grammar": "the grammar", "choice": "the choice list"}
_CPP_PREFIX = re.compile(r"^\[[\d:]+\] \S+:\d+: (Check failed: .*? is false: )?")  # xgrammar's C++ log prefix


class Grammars:
    """One tokenizer's xgrammar compiler and its cache of compiled grammars (thread-safe: a server validates
    requests on its event loop while the engine thread steps)."""

    def __init__(self, tokenizer, vocab_size: int, stop_token_ids: list[int]):
        import xgrammar as xgr

        # vocab_size is the model's logits width, which may exceed len(tokenizer) (padded embeddings)
        self.info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size,
                                                       stop_token_ids=sorted(stop_token_ids))
        self.compiler = xgr.GrammarCompiler(self.info, cache_enabled=False)  # the cache is ours, by text
        self.vocab_size = vocab_size
        self.cache: OrderedDict[tuple, object] = OrderedDict()
        self.lock = threading.Lock()
        self.hits = self.misses = 0

    def compile(self, spec: StructuredOutputsParams, any_whitespace: bool = True):
        """The `xgrammar.CompiledGrammar` of `spec`, from the cache when its text was compiled before.
        ValueError names the constraint and the compiler's complaint."""
        key = (spec.kind, spec.text, any_whitespace)
        with self.lock:
            if key in self.cache:
                self.hits += 1
                self.cache.move_to_end(key)
                return self.cache[key]
        try:
            compiled = self._compile(spec.kind, spec.text, any_whitespace)
        except Exception as e:  # noqa: BLE001  xgrammar raises RuntimeError (C++), ValueError or its own types
            message = _CPP_PREFIX.sub("", str(e).strip())
            raise ValueError(f"{_DESCRIPTIONS[spec.kind]} cannot be compiled: {message}") from None
        with self.lock:
            self.misses += 1
            self.cache[key] = compiled
            while len(self.cache) > MAX_CACHED:
                self.cache.popitem(last=False)
        return compiled

    def compile_uncached(self, spec: StructuredOutputsParams, any_whitespace: bool = True):
        """Compile `spec` afresh, neither reading nor filling the cache: what a cache miss costs (notebook 07)."""
        return self._compile(spec.kind, spec.text, any_whitespace)

    def _compile(self, kind: str, text: str, any_whitespace: bool):
        c = self.compiler  # built with xgrammar's own cache off: a call always compiles
        if kind in ("json", "json_object"):
            # strict (no properties the schema does not name) for a schema, as vLLM; any object's keys are free
            return c.compile_json_schema(text, any_whitespace=any_whitespace, strict_mode=kind == "json")
        if kind == "regex":
            return c.compile_regex(text)
        return c.compile_grammar(text)


_REGISTRY: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # tokenizer -> {(vocab, stops): Grammars}
_REGISTRY_LOCK = threading.Lock()


def grammars_for(tokenizer, vocab_size: int, stop_token_ids) -> Grammars:
    """The `Grammars` of this tokenizer, built on first use and shared by every engine that uses it."""
    key = (vocab_size, tuple(sorted(stop_token_ids)))
    with _REGISTRY_LOCK:
        per_tokenizer = _REGISTRY.setdefault(tokenizer, {})
        if key not in per_tokenizer:
            per_tokenizer[key] = Grammars(tokenizer, vocab_size, list(key[1]))
        return per_tokenizer[key]


@torch.inference_mode()  # the step's logits are inference tensors, writable in place only in this mode
def apply_bitmask(logits: torch.Tensor, bitmask: torch.Tensor) -> None:
    """In place: logits [rows, V] get -inf wherever bitmask [rows, ceil(V / 32)] (int32) has a 0 bit. xgrammar's
    kernel: C++ on a CPU (one thread: torch's element-wise ops over 49k logits wake OpenMP's threads, which cost
    up to 50 ms a row beside another busy process, measured), Triton on CUDA."""
    import xgrammar as xgr

    xgr.apply_token_bitmask_inplace(logits, bitmask.to(logits.device), vocab_size=logits.shape[-1])
