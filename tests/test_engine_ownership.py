"""Who owns the engine's state (issue 50): one method changes a sequence's progress, one output path, and no
code outside `lab.engine` reaches into its internals. Each check is run on a planted offender too, so it is seen
to fail."""

import ast
from pathlib import Path

import pytest

from lab.engine import LLM, SamplingParams
from lab.engine.block_manager import BlockManager
from lab.engine.request import Sequence

ROOT = Path(__file__).resolve().parents[1]
PROGRESS = {"num_computed_tokens", "_num_computed_tokens"}
# The one writer (and the constructor's zero).
PROGRESS_WRITERS = {("BlockManager", "update"), ("Sequence", "__init__")}
# The engine's parts: code outside lab.engine uses LLM's public methods and views instead.
INTERNALS = {"scheduler", "block_manager", "runner", "sequences", "last_schedule", "sampler", "step_view", "hooks",
             "output_processor"}


def _functions(tree):
    """(class name or None, function node) for every function, methods named with their class."""
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield None, node
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    yield node.name, item


def _targets(node):
    if isinstance(node, ast.Assign):
        for t in node.targets:
            yield from ast.walk(t)
    elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
        yield from ast.walk(node.target)


def progress_writes(source: str) -> list[str]:
    """Where `source` assigns a sequence's progress outside its one writer: 'Class.function:line'."""
    tree = ast.parse(source)
    inside = {}
    for cls, fn in _functions(tree):
        for node in ast.walk(fn):
            inside[id(node)] = (cls, fn.name)
    found = []
    for node in ast.walk(tree):
        for t in _targets(node):
            if isinstance(t, ast.Attribute) and t.attr in PROGRESS:
                where = inside.get(id(node), (None, "<module>"))
                if where not in PROGRESS_WRITERS:
                    found.append(f"{where[0] or ''}.{where[1]}:{node.lineno}")
    return found


def reach_ins(source: str) -> list[str]:
    """`x.<internal>` on anything but `self` (a drafter's own pool is its own), outside an extension config's
    `build(self, engine)`, which alone sees the whole engine (lab.engine.extension)."""
    tree = ast.parse(source)
    exempt = set()
    for _, fn in _functions(tree):
        if fn.name == "build" and [a.arg for a in fn.args.args][:2] == ["self", "engine"]:
            exempt |= {id(n) for n in ast.walk(fn)}
    return [f"{ast.unparse(node)}:{node.lineno}" for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and node.attr in INTERNALS and id(node) not in exempt
            and not (isinstance(node.value, ast.Name) and node.value.id == "self")]


def _sources(*folders, outside=()):
    return [p for d in folders for p in sorted((ROOT / d).rglob("*.py"))
            if not any(p.is_relative_to(ROOT / o) for o in outside)]


def test_one_method_changes_a_sequences_progress():
    found = {str(p.relative_to(ROOT)): w for p in _sources("lab", "gpu") if (w := progress_writes(p.read_text()))}
    assert not found, f"num_computed_tokens assigned outside BlockManager.update: {found}"
    planted = "class Speculator:\n    def accept(self, seq):\n        seq.num_computed_tokens = 3\n"
    assert progress_writes(planted) == ["Speculator.accept:3"]
    assert progress_writes("def f(s):\n    s.num_computed_tokens += 1\n") == [".f:2"]


def test_progress_is_read_only_on_a_sequence_and_checked_where_it_changes():
    seq = Sequence(list(range(40)), SamplingParams(max_tokens=4))
    with pytest.raises(AttributeError):
        seq.num_computed_tokens = 5
    bm = BlockManager(8, 16)
    assert bm.allocate(seq, 32)
    bm.update(seq, 32)
    assert seq.num_computed_tokens == 32
    with pytest.raises(RuntimeError, match="33 computed tokens is outside 0 .. 32"):
        bm.update(seq, 33)  # no slot was allocated for position 32
    with pytest.raises(RuntimeError, match="-1 computed tokens"):
        bm.update(seq, -1)


def test_nothing_outside_the_engine_reaches_into_it():
    sources = _sources("lab", "gpu", "notebooks", outside=("lab/engine",))
    found = {str(p.relative_to(ROOT)): r for p in sources if (r := reach_ins(p.read_text()))}
    assert not found, f"reach-ins into engine internals (use LLM's public methods or LLM.view()): {found}"
    assert reach_ins("def f(llm):\n    llm.block_manager.reset_prefix_cache()\n") == ["llm.block_manager:2"]
    assert reach_ins("class C:\n    def build(self, engine):\n        return engine.runner\n") == []
    assert reach_ins("class D:\n    def go(self):\n        return self.runner\n") == []


def test_a_step_returns_deltas_that_join_into_the_output(smollm, chat_prompt_ids):
    """"delta" requests get a delta a step whose tokens, text and logprobs join into the final output; "final"
    requests get one delta, when they end, equal to what `generate` returns."""
    model, tok = smollm
    llm = LLM(model, tokenizer=tok, num_kv_blocks=64, max_model_len=256)
    kinds = ["delta", "final", "delta"]
    ids = [llm.add_request(p, SamplingParams(max_tokens=12, temperature=0, logprobs=1, output_kind=k))
           for p, k in zip(chat_prompt_ids[:3], kinds)]
    got = {rid: [] for rid in ids}
    while llm.has_unfinished():
        for d in llm.step():
            got[d.request_id].append(d)
    reference = LLM(model, tokenizer=tok, num_kv_blocks=64, max_model_len=256).generate(
        chat_prompt_ids[:3], SamplingParams(max_tokens=12, temperature=0, logprobs=1))
    for rid, kind, ref in zip(ids, kinds, reference):
        deltas = got[rid]
        assert [d.finished for d in deltas] == [False] * (len(deltas) - 1) + [True]
        assert (len(deltas) == 1) == (kind == "final")
        out = deltas[-1].output
        assert out.token_ids == ref.token_ids and out.text == ref.text
        assert sum((d.token_ids for d in deltas), []) == out.token_ids
        assert "".join(d.text for d in deltas) == out.text
        assert sum((d.logprobs for d in deltas), []) == out.logprobs


def test_output_kind_is_checked():
    with pytest.raises(ValueError, match="output_kind must be 'final' or 'delta', got 'stream'"):
        SamplingParams(output_kind="stream")


def test_a_recompute_probe_refuses_positions_not_computed(smollm, chat_prompt_ids):
    """`LLM.recompute` re-runs positions whose KV is in the pool; past them it refuses, and progress is kept."""
    model, tok = smollm
    llm = LLM(model, tokenizer=tok, num_kv_blocks=32, max_model_len=256)
    rid = llm.add_request(chat_prompt_ids[0], SamplingParams(max_tokens=2, temperature=0, ignore_eos=True))
    llm.step()
    done = next(s.num_computed_tokens for s in llm.view().running if s.request_id == rid)
    llm.recompute(rid, done - 4, 4)
    with pytest.raises(ValueError, match="are not all computed"):
        llm.recompute(rid, done - 4, 5)
    with pytest.raises(ValueError, match="are not all computed"):
        llm.recompute(rid, -1, 2)
    assert next(s.num_computed_tokens for s in llm.view().running if s.request_id == rid) == done
