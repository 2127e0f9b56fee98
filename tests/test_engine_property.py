"""Property tests of the engine on a small random-weight model: random pools, budgets and request streams.

1. Whatever the configuration and the arrival pattern, every accepted request finishes with the
   length it asked for (unless EOS stops it), requests that cannot fit are refused at
   `add_request`, the pool stays consistent after every step and ends empty.
2. Greedy outputs do not depend on the pool size, block size, chunk budget or batch size.
"""

from __future__ import annotations

import functools
from collections import Counter
from dataclasses import dataclass

import pytest
import torch
from hypothesis import HealthCheck, event, given, settings, target
from hypothesis import strategies as st

from lab.engine import LLM, SamplingParams
from lab.models import load_model
from lab.models.reference import forward_logits

EOS = 2  # eos_token_id of the tiny preset
VOCAB = 512
BLOCK_SIZES = (4, 8, 16)
MAX_MODEL_LENS = (32, 48, 64)
# An example takes 2-200 ms (one engine, 1 ms a step); report_multiple_bugs=False keeps a failure's
# shrinking to one bug (Hypothesis caps shrinking at 5 minutes per bug).
SETTINGS = dict(deadline=None, report_multiple_bugs=False,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


pytestmark = pytest.mark.usefixtures("one_thread")


@functools.lru_cache(maxsize=None)
def tiny_model():
    model, tokenizer = load_model("random:tiny", dtype=torch.float32, device="cpu")
    assert tokenizer is None and model.config.eos_token_ids == [EOS] and model.config.vocab_size == VOCAB
    return model


@functools.lru_cache(maxsize=None)
def eos_prone_model():
    """The tiny model with EOS made the argmax wherever its most frequent greedy token was.

    Random weights almost never produce EOS, which would leave the stop-on-EOS path untested: EOS's
    LM-head row becomes 1.01 x the row of the token greedy decoding emits most often here.
    """
    model, _ = load_model("random:tiny", dtype=torch.float32, device="cpu")
    llm = LLM(model, block_size=16, num_kv_blocks=64, max_model_len=64, max_num_seqs=16,
              max_num_batched_tokens=1024)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 500, (int(n),), generator=g).tolist() for n in torch.randint(1, 40, (16,), generator=g)]
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=16, ignore_eos=True))
    frequent = Counter(t for o in outs for t in set(o.token_ids)).most_common(1)[0][0]
    with torch.no_grad():
        model.lm_head.weight[EOS] = model.lm_head.weight[frequent] * 1.01
    return model


@dataclass(frozen=True)
class Req:
    prompt: tuple[int, ...]
    max_tokens: int
    salt: str | None = None
    ignore_eos: bool = False
    sampling: str = "greedy"  # "greedy", "seeded" or "random"

    def params(self, seed: int = 0) -> SamplingParams:
        if self.sampling == "greedy":
            return SamplingParams(temperature=0, max_tokens=self.max_tokens, ignore_eos=self.ignore_eos)
        return SamplingParams(temperature=0.8, top_p=0.95, max_tokens=self.max_tokens, ignore_eos=self.ignore_eos,
                              seed=seed if self.sampling == "seeded" else None)


# ---- strategies ---------------------------------------------------------------------------------

tokens = st.integers(3, 499)


@st.composite
def engine_configs(draw, max_model_len: int | None = None, min_pool_seqs: float = 0.5):
    bs = draw(st.sampled_from(BLOCK_SIZES))
    mml = max_model_len or draw(st.sampled_from(MAX_MODEL_LENS))
    per_seq = -(-mml // bs)  # blocks one sequence of max_model_len needs
    budget = draw(st.sampled_from([1, 2, 3, 5, 8, 16, 32, 64, 128]))
    return dict(
        block_size=bs, max_model_len=mml,
        # from half a sequence (some requests cannot fit at all; the rest preempt each other) to 2 sequences
        num_kv_blocks=draw(st.integers(max(1, int(per_seq * min_pool_seqs)), 2 * per_seq)),
        max_num_seqs=draw(st.sampled_from([1, 2, 3, 4, 6])),
        max_num_batched_tokens=budget,
        enable_prefix_caching=draw(st.booleans()),
        # chunked prefill may be off only when a whole prompt fits one step
        enable_chunked_prefill=budget < mml or draw(st.booleans()),
    )


def token_lists(min_size: int, max_size: int):
    """Lists of token ids whose length is drawn uniformly-ish (plain st.lists favours short lists)."""
    return st.integers(min_size, max_size).flatmap(lambda n: st.lists(tokens, min_size=n, max_size=n))


@st.composite
def request_streams(draw, max_len: int, sampling=("greedy", "seeded", "random")):
    """A list of ("add", Req) and ("step", k) events; some prompts share prefixes.

    Prompts are up to `max_len` tokens (the engine's max_model_len), so with max_tokens some
    requests are too long and must be refused."""
    prefixes = draw(st.lists(token_lists(4, 40), min_size=1, max_size=3))
    salts = st.sampled_from([None, None, "a", "b"])
    events = []
    for _ in range(draw(st.integers(2, 10))):
        if draw(st.booleans()):
            prefix = draw(st.sampled_from(prefixes))
            prompt = prefix[:draw(st.integers(len(prefix) // 2, len(prefix)))] + draw(token_lists(0, 24))
        else:
            prompt = draw(token_lists(1, max_len))
        req = Req(tuple(prompt[:max_len]), draw(st.integers(1, 20)), draw(salts), draw(st.booleans()),
                  draw(st.sampled_from(sampling)))
        events.append(("add", req))
        if draw(st.integers(0, 2)) == 0:
            events.append(("step", draw(st.integers(1, 8))))
    return events


# ---- running a stream ---------------------------------------------------------------------------

def fits(cfg: dict, req: Req) -> bool:
    """Whether the engine must accept `req`: prompt + max_tokens within max_model_len and the whole pool."""
    total = len(req.prompt) + req.max_tokens
    return total <= cfg["max_model_len"] and -(-total // cfg["block_size"]) <= cfg["num_kv_blocks"]


def make_llm(cfg: dict, eos_prone: bool = False) -> LLM:
    return LLM(eos_prone_model() if eos_prone else tiny_model(), **cfg)


def check_pool(llm: LLM) -> None:
    """Reference counts match the running block tables; the free queue is exactly the unreferenced blocks."""
    bm, sched = llm.block_manager, llm.scheduler
    holders = Counter(b for s in sched.running for b in s.block_table)
    assert all(len(set(s.block_table)) == len(s.block_table) for s in sched.running)
    assert bm.ref_count == [holders[b] for b in range(bm.num_blocks)]
    assert set(bm.free) == {b for b in range(bm.num_blocks) if holders[b] == 0}
    assert all(len(s.block_table) * bm.block_size >= s.num_computed_tokens for s in sched.running)
    assert all(s.block_table == [] and s.num_computed_tokens == 0 for s in sched.waiting)
    assert len(sched.running) <= sched.max_num_seqs


def run_stream(llm: LLM, cfg: dict, events: list, only=None) -> dict[int, tuple[Req, object]]:
    """Feed `events` to `llm` (refusals checked), drain it, and return {submission index: (req, output)}.

    `only`, if given, is the set of submission indices to send (the others are skipped).
    """
    accepted: dict[int, tuple[int, Req]] = {}  # request id -> (submission index, req)
    outputs: dict[int, object] = {}
    work = 0

    def step():
        for o in (d.output for d in llm.step() if d.finished):
            assert o.request_id in accepted, "an output for a request that was never accepted"
            assert o.request_id not in outputs, "a request finished twice"
            outputs[o.request_id] = o
        check_pool(llm)

    index = 0
    for kind, arg in events:
        if kind == "step":
            for _ in range(arg):
                step()
            continue
        i, req = index, arg
        index += 1
        if only is not None and i not in only:
            continue
        if fits(cfg, req):
            rid = llm.add_request(list(req.prompt), req.params(seed=i), cache_salt=req.salt)
            assert rid not in accepted
            accepted[rid] = (i, req)
            work += len(req.prompt) + req.max_tokens
        else:
            n_running, n_waiting = len(llm.scheduler.running), len(llm.scheduler.waiting)
            with pytest.raises(ValueError):
                llm.add_request(list(req.prompt), req.params(seed=i), cache_salt=req.salt)
            assert (len(llm.scheduler.running), len(llm.scheduler.waiting)) == (n_running, n_waiting)
    # Each step moves at least one token through the model, bar the rare step spent preempting;
    # recomputation after preemption is what the factor 4 leaves room for.
    bound = 20 + 4 * work
    steps = 0
    while llm.has_unfinished():
        steps += 1
        if steps > bound:
            pytest.fail(f"{len(accepted) - len(outputs)} requests still unfinished after {bound} steps: "
                        f"{llm.stats()}")
        step()
    assert set(outputs) == set(accepted)
    bm = llm.block_manager
    assert bm.num_free_blocks == bm.num_blocks
    assert bm.ref_count == [0] * bm.num_blocks
    assert not llm.scheduler.running and not llm.scheduler.waiting
    assert llm.sequences == {} and bm.block_hashes == {}
    assert llm.step() == []
    return {i: (req, outputs[rid]) for rid, (i, req) in accepted.items()}


def note_events(llms: list[LLM], results: list[dict]) -> None:
    """Statistics for --hypothesis-show-statistics, and a nudge towards streams that hit the prefix cache."""
    preemptions = sum(llm.scheduler.num_preemptions for llm in llms)
    hits = sum(llm.scheduler.prefix_hit_tokens for llm in llms)
    event(f"preempted {'yes' if preemptions else 'no'}")
    event(f"prefix hits {'yes' if hits else 'no'}")
    event(f"stopped by EOS {'yes' if any(o.finish_reason == 'stop' for r in results for _, o in r.values()) else 'no'}")
    n = len(results[0])
    event(f"requests finished: {min(n, 4)}{'+' if n >= 4 else ''}")
    target(float(hits), label="prefix hit tokens")  # preemption is common without a nudge


def check_output(req: Req, out) -> None:
    assert out.prompt_token_ids == list(req.prompt)
    assert all(0 <= t < VOCAB for t in out.token_ids)
    assert 1 <= len(out.token_ids) <= req.max_tokens
    if req.ignore_eos:
        assert out.finish_reason == "length"
    else:
        assert EOS not in out.token_ids[:-1], "generation went on past EOS"
    if out.finish_reason == "length":
        assert len(out.token_ids) == req.max_tokens
        assert req.ignore_eos or out.token_ids[-1] != EOS
    else:
        assert out.finish_reason == "stop" and out.token_ids[-1] == EOS and not req.ignore_eos
    m = out.metrics
    assert m.num_prompt_tokens == len(req.prompt)
    assert len(m.token_times) == len(out.token_ids)
    assert 0 <= m.num_cached_tokens < len(req.prompt)


# ---- property 1: everything accepted finishes, the pool ends empty -------------------------------

@st.composite
def scenarios(draw):
    cfg = draw(engine_configs())
    return cfg, draw(request_streams(max_len=cfg["max_model_len"]))


@settings(max_examples=40, **SETTINGS)
@given(scenario=scenarios(), eos_prone=st.booleans())
def test_every_accepted_request_finishes_and_frees_its_blocks(scenario, eos_prone):
    cfg, events = scenario
    llm = make_llm(cfg, eos_prone)
    results = run_stream(llm, cfg, events)
    note_events([llm], [results])
    for req, out in results.values():
        check_output(req, out)


def test_eos_stops_a_request_unless_ignored():
    """On the EOS-prone model some greedy requests stop at EOS; with ignore_eos they run on, identically."""
    cfg = dict(block_size=8, max_model_len=64, num_kv_blocks=64, max_num_seqs=8, max_num_batched_tokens=64)
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, 500, (int(n),), generator=g).tolist() for n in torch.randint(1, 40, (12,), generator=g)]
    stop = make_llm(cfg, eos_prone=True).generate(prompts, SamplingParams(temperature=0, max_tokens=20))
    full = make_llm(cfg, eos_prone=True).generate(prompts, SamplingParams(temperature=0, max_tokens=20,
                                                                          ignore_eos=True))
    stopped = [i for i, o in enumerate(stop) if o.finish_reason == "stop"]
    assert stopped, "the EOS-prone model should stop some requests early"
    assert len(stopped) < len(prompts)
    for s_out, f_out in zip(stop, full):
        n = len(s_out.token_ids)
        assert f_out.finish_reason == "length" and len(f_out.token_ids) == 20
        assert s_out.token_ids == f_out.token_ids[:n]
        if s_out.finish_reason == "stop":
            assert s_out.token_ids[-1] == EOS and EOS not in s_out.token_ids[:-1]
        else:
            assert n == 20 and EOS not in s_out.token_ids


def test_a_fixed_stream_that_preempts():
    """6 requests of 8 blocks each on a pool of 12 blocks: preemption must happen and be survived."""
    cfg = dict(block_size=4, max_model_len=32, num_kv_blocks=12, max_num_seqs=6, max_num_batched_tokens=16,
               enable_prefix_caching=True, enable_chunked_prefill=True)
    shared = list(range(10, 30))
    events = [("add", Req(tuple(shared[:12 + i] + [100 + i]), 16 - i, ignore_eos=True)) for i in range(6)]
    events.insert(3, ("step", 3))
    llm = make_llm(cfg)
    results = run_stream(llm, cfg, events)
    assert llm.scheduler.num_preemptions > 0
    assert llm.scheduler.prefix_hit_tokens > 0
    assert len(results) == 6
    for req, out in results.values():
        check_output(req, out)
        assert len(out.token_ids) == req.max_tokens


@pytest.mark.parametrize("block_size", [4, 8])
def test_repeated_block_aligned_prompt_recomputes_its_last_token(block_size):
    """A prompt of exactly 2 full blocks, seen before, hits 1 block (never the last token's), same output;
    another cache_salt hits nothing."""
    cfg = dict(block_size=block_size, max_model_len=64, num_kv_blocks=32, max_num_seqs=4, max_num_batched_tokens=64)
    llm = make_llm(cfg)
    p = list(range(40, 40 + 2 * block_size))
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    first = llm.generate([{"prompt_token_ids": p, "cache_salt": "t1"}], params)[0]
    again = llm.generate([{"prompt_token_ids": p, "cache_salt": "t1"}], params)[0]
    other = llm.generate([{"prompt_token_ids": p, "cache_salt": "t2"}], params)[0]
    assert first.metrics.num_cached_tokens == 0
    assert again.metrics.num_cached_tokens == block_size
    assert other.metrics.num_cached_tokens == 0
    assert first.token_ids == again.token_ids == other.token_ids
    # the same prompt one token longer hits both blocks
    longer = llm.generate([{"prompt_token_ids": p + [7], "cache_salt": "t1"}], params)[0]
    assert longer.metrics.num_cached_tokens == 2 * block_size


# ---- property 2: greedy outputs do not depend on the engine's configuration ---------------------

def assert_same_or_tied(model, req: Req, a: list[int], b: list[int]) -> None:
    """Equal, or first different where the model's two candidates are tied to float32 noise."""
    if a == b:
        return
    j = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), None)
    assert j is not None, f"one output is a prefix of the other: {a} vs {b}"
    logits = forward_logits(model, list(req.prompt) + a[:j])[-1]
    top = logits.max()
    gap = (top - logits[a[j]]).abs().item(), (top - logits[b[j]]).abs().item()
    assert max(gap) < 1e-4, f"outputs differ at token {j} ({a[j]} vs {b[j]}, logit gaps {gap}): {a} vs {b}"


@st.composite
def config_pairs_and_streams(draw):
    cfgs = draw(st.tuples(engine_configs(min_pool_seqs=1), engine_configs(min_pool_seqs=1)))
    max_len = min(c["max_model_len"] for c in cfgs)
    return cfgs, draw(request_streams(max_len=max_len, sampling=("greedy",)))


@settings(max_examples=30, **SETTINGS)
@given(scenario=config_pairs_and_streams(), eos_prone=st.booleans())
def test_greedy_outputs_do_not_depend_on_the_configuration(scenario, eos_prone):
    cfgs, events = scenario
    reqs = [arg for kind, arg in events if kind == "add"]
    both = {i for i, r in enumerate(reqs) if fits(cfgs[0], r) and fits(cfgs[1], r)}
    llms = [make_llm(cfg, eos_prone) for cfg in cfgs]
    results = [run_stream(llm, cfg, events, only=both) for llm, cfg in zip(llms, cfgs)]
    assert set(results[0]) == set(results[1]) == both
    note_events(llms, results)
    model = eos_prone_model() if eos_prone else tiny_model()
    for i in sorted(both):
        (req, a), (_, b) = results[0][i], results[1][i]
        check_output(req, a)
        check_output(req, b)
        assert_same_or_tied(model, req, a.token_ids, b.token_ids)
