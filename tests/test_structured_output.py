"""Structured output (lab.engine.grammar, lab.engine.structured) on the real model, float32: every constrained
output parses and validates (JSON schemas with jsonschema, regexes with re.fullmatch), greedy and sampled over
seeds, with penalties and n > 1; constrained and unconstrained requests in one batch (the unconstrained ones as if
alone); preemption, prefix hits, chunked prefill and n-gram speculation leave greedy constrained output unchanged;
a grammar that forces one string yields exactly it, even under ignore_eos; stop conditions still apply;
malformed and empty-language constraints are refused at add_request while other requests run on; the HTTP API's
response_format and guided_* fields; the compiled-grammar cache. Jump-forward (a token the grammar allows alone is
appended without a forward pass) keeps greedy output in fewer steps, under preemption, chunking and speculation
too, keeps sampled output valid, and leaves requests with logprobs alone."""

import json
import re

import httpx
import jsonschema
import pytest

from lab.engine import LLM, SamplingParams, StructuredOutputsConfig, StructuredOutputsParams
from lab.engine.grammar import grammars_for
from lab.serve import ServerThread
from lab.speculative.speculator import SpeculativeConfig

# One intra-op thread (conftest's one_thread): measured beside another busy process on the 2 cores, this file took
# 66 s with one thread and had not finished after 10 min with two (OpenMP's spinning threads).
pytestmark = pytest.mark.usefixtures("one_thread")

PERSON = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 16},
    "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "role": {"enum": ["admin", "user", "guest"]}},
    "required": ["name", "age", "role"]}
ORDER = {"type": "object", "properties": {
    "id": {"type": "integer", "minimum": 1000, "maximum": 9999},
    "items": {"type": "array", "minItems": 1, "maxItems": 3, "items": {"type": "object", "properties": {
        "sku": {"type": "string", "maxLength": 8}, "qty": {"type": "integer", "minimum": 1, "maximum": 9}},
        "required": ["sku", "qty"]}},
    "address": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                                 "zip": {"type": "string", "pattern": "[0-9]{5}"}},
                "required": ["city", "zip"]},
    "express": {"type": "boolean"},
    "total": {"type": "number", "minimum": 0, "maximum": 1000}},
    "required": ["id", "items", "address", "express", "total"]}
DATE, EMAIL = r"\d{4}-\d{2}-\d{2}", r"[a-z]{1,10}\.[a-z]{1,10}@[a-z]{2,8}\.(com|org|net)"
ASK = {"person": "Describe a person as JSON.", "order": "Give an example shop order as JSON.",
       "date": "When did the first person walk on the moon? Answer with a date.",
       "email": "Invent an email address for a person called Ada Lovelace.",
       "free": "What is the capital of France?",
       "object": "Return a JSON object with the keys city and country for Paris."}
GREEDY = dict(temperature=0.0, max_tokens=160)
SEEDS = range(8)


def sampled(seed: int) -> dict:
    """Sampling settings that vary with the seed: temperature, top-k, top-p and the three penalties."""
    return dict(temperature=[0.7, 1.0, 1.3][seed % 3], top_k=[0, 40][seed % 2], top_p=[1.0, 0.9, 0.95][seed % 3],
                seed=seed, max_tokens=160, presence_penalty=0.5 if seed == 1 else 0.0,
                frequency_penalty=0.3 if seed == 2 else 0.0, repetition_penalty=1.2 if seed == 3 else 1.0)


@pytest.fixture(scope="module")
def prompts(smollm):
    _, tok = smollm
    return {k: tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False)
            for k, q in ASK.items()}


@pytest.fixture(scope="module")
def llm(smollm):
    model, tok = smollm
    return LLM(model, tokenizer=tok, num_kv_blocks=256, max_model_len=512, max_num_seqs=16)


def constrained(**kw) -> dict:
    return {"structured_outputs": StructuredOutputsParams(**kw)}


def run(llm, prompt, constraint, settings):
    """One generate call: `prompt` under `constraint` for each of `settings`."""
    outs = llm.generate([prompt] * len(settings), [SamplingParams(**s, **constraint) for s in settings])
    assert all(o.finish_reason == "stop" for o in outs), [(o.finish_reason, o.text) for o in outs]
    return outs


@pytest.mark.slow
@pytest.mark.parametrize("name, schema", [("person", PERSON), ("order", ORDER)])
def test_json_schema_outputs_validate_greedy_and_sampled(llm, prompts, name, schema):
    outs = run(llm, prompts[name], constrained(json=schema), [GREEDY] + [sampled(s) for s in SEEDS])
    for o in outs:
        jsonschema.validate(json.loads(o.text), schema)
    assert len({o.text for o in outs}) > 2  # the seeds really sampled


@pytest.mark.slow
@pytest.mark.parametrize("name, regex", [("date", DATE), ("email", EMAIL)])
def test_regex_outputs_match_greedy_and_sampled(llm, prompts, name, regex):
    outs = run(llm, prompts[name], constrained(regex=regex), [GREEDY] + [sampled(s) for s in SEEDS])
    assert all(re.fullmatch(regex, o.text) for o in outs), [o.text for o in outs]


def test_choice_grammar_and_any_json_object(llm, prompts):
    colors = ["red", "green", "blue", "dark \"night\" blue"]
    grammar = 'root ::= "The answer is " digit digit? "."\ndigit ::= [0-9]'
    params = [SamplingParams(**GREEDY, **constrained(choice=colors)),
              SamplingParams(**sampled(5), **constrained(choice=colors)),
              SamplingParams(**GREEDY, **constrained(grammar=grammar)),
              SamplingParams(**GREEDY, **constrained(json_object=True)),
              SamplingParams(**sampled(3), n=3, **constrained(json=PERSON))]
    outs = llm.generate([prompts["free"]] * 3 + [prompts["object"], prompts["person"]], params)
    assert all(o.finish_reason == "stop" for r in outs for o in r.outputs), [o.text for o in outs]
    assert outs[0].text in colors and outs[1].text in colors
    assert re.fullmatch(r"The answer is \d\d?\.", outs[2].text)
    assert json.loads(outs[3].text) == {"city": "Paris", "country": "France"}
    assert len(outs[4].outputs) == 3  # n samples through the fan-out, each with its own matcher
    for o in outs[4].outputs:
        jsonschema.validate(json.loads(o.text), PERSON)


def test_a_grammar_that_forces_one_string_yields_it_even_ignoring_eos(llm, prompts):
    params = [SamplingParams(**GREEDY, logprobs=0, **constrained(regex="hello world")),
              SamplingParams(**sampled(0), ignore_eos=True, **constrained(regex="hello world")),
              SamplingParams(**GREEDY, ignore_eos=True, **constrained(json={"const": {"ok": True, "n": 3}})),
              SamplingParams(**GREEDY, **constrained(json={"enum": ["only"]}))]
    outs = llm.generate([prompts["free"]] * 4, params)
    assert [o.text for o in outs] == ["hello world", "hello world", '{"ok":true,"n":3}', '"only"']  # xgrammar's spacing
    assert all(o.finish_reason == "stop" for o in outs)
    # logprobs are the masked distribution's (as vLLM v1's): after "hello world" only EOS is left, at probability 1
    assert outs[0].token_ids[-1] == 2 and outs[0].logprobs[-1][2].logprob == 0.0


def test_constrained_beside_unconstrained_leaves_the_unconstrained_as_alone(llm, prompts):
    free = [SamplingParams(temperature=0, max_tokens=48), SamplingParams(**{**sampled(4), "max_tokens": 48})]
    alone = llm.generate([prompts["free"], prompts["order"]], free)
    mixed = llm.generate([prompts["free"], prompts["person"], prompts["order"], prompts["date"]],
                         [free[0], SamplingParams(**GREEDY, **constrained(json=PERSON)), free[1],
                          SamplingParams(**sampled(6), **constrained(regex=DATE))])
    assert [o.token_ids for o in (mixed[0], mixed[2])] == [o.token_ids for o in alone]
    jsonschema.validate(json.loads(mixed[1].text), PERSON)
    assert re.fullmatch(DATE, mixed[3].text)


def batch(prompts, seeded: bool = True):
    """Greedy constrained requests whose outputs end by their grammars after 11-28 tokens or are cut at 64 (the
    orders; ~40-token prompts: 3-7 blocks each), and a seeded one (its generator draws once a token, so it too must
    come out the same, preempted or not). Cut at 64, not run to their ends (126 and 91 tokens), the eight runs of
    this batch took 69 s against 112: the shorter requests still finish by their grammars, preemption still
    strikes mid-output, and n-gram drafts are still ruled out by the grammar."""
    greedy, order = dict(temperature=0.0, max_tokens=64), constrained(json=ORDER)
    return ([prompts["person"], prompts["order"], prompts["email"], prompts["date"]] + [prompts["order"]] * seeded,
            [SamplingParams(**greedy, **constrained(json=PERSON)), SamplingParams(**greedy, **order),
             SamplingParams(**greedy, **constrained(regex=EMAIL)), SamplingParams(**greedy, **constrained(regex=DATE))]
            + [SamplingParams(**{**sampled(1), "max_tokens": 64}, **order)] * seeded)


@pytest.fixture(scope="module")
def reference(llm, prompts):
    return [o.token_ids for o in llm.generate(*batch(prompts))]


@pytest.mark.slow
@pytest.mark.parametrize("options", [dict(num_kv_blocks=14, enable_prefix_caching=False), dict(num_kv_blocks=14),
                                     dict(max_num_batched_tokens=16)], ids=["preempted", "preempted-cached", "chunked"])
def test_preemption_and_chunked_prefill_leave_constrained_output_unchanged(smollm, prompts, reference, options):
    model, tok = smollm
    engine = LLM(model, tokenizer=tok, max_model_len=512, **{"num_kv_blocks": 256, **options})
    assert [o.token_ids for o in engine.generate(*batch(prompts))] == reference
    if "num_kv_blocks" in options:
        assert engine.stats()["preemptions"] > 0
    assert engine.block_manager.num_used_blocks == 0


def test_a_prefix_hit_gives_the_same_constrained_output(llm, prompts, reference):
    requests, params = batch(prompts)
    first, second = (llm.generate(requests[:1], params[:1])[0] for _ in range(2))
    assert second.metrics.num_cached_tokens > 0
    assert first.token_ids == second.token_ids == reference[0]


@pytest.mark.slow
def test_speculation_keeps_greedy_constrained_output_and_rejects_forbidden_drafts(smollm, prompts, reference):
    model, tok = smollm
    engine = LLM(model, tokenizer=tok, num_kv_blocks=256, max_model_len=512, speculative=SpeculativeConfig(k=4))
    assert [o.token_ids for o in engine.generate(*batch(prompts, seeded=False))] == reference[:4]
    s = engine.stats()
    assert s["spec_rounds"] > 0 and 0 < s["spec_accepted"] < s["spec_drafted"]
    assert s["structured_masked_rows"] > s["spec_rounds"]  # verification rows were masked, not only last rows
    assert s["structured_forbidden_drafts"] > 0  # n-gram drafts the grammar ruled out, rejected by verification


def test_stop_conditions_still_end_a_constrained_request(llm, prompts):
    outs = llm.generate([prompts["person"]] * 2,
                        [SamplingParams(temperature=0, max_tokens=5, **constrained(json=PERSON)),
                         SamplingParams(**GREEDY, stop=['",'], **constrained(json=PERSON))])
    assert outs[0].finish_reason == "length" and len(outs[0].token_ids) == 5 and outs[0].text.startswith("{")
    assert outs[1].finish_reason == "stop" and outs[1].text.startswith('{"name": "') and '",' not in outs[1].text


@pytest.mark.parametrize("constraint, message", [
    (dict(regex="(unclosed"), "the regex cannot be compiled: .*parenthesis"),
    (dict(json={"type": "integer", "minimum": 5, "maximum": 1}), "the JSON schema cannot be compiled: .*minimum"),
    (dict(json='{"type": "object",'), "the JSON schema is not valid JSON"),
    (dict(grammar="root ::= ("), "the grammar cannot be compiled: EBNF parser error"),
    (dict(regex=r"[^\s\S]"), "accepts no output at all"),
])
def test_bad_constraints_are_refused_while_others_run(llm, prompts, constraint, message):
    good = llm.add_request(prompts["date"], SamplingParams(**GREEDY, **constrained(regex=DATE)))
    with pytest.raises(ValueError, match=message):
        llm.add_request(prompts["date"], SamplingParams(**GREEDY, structured_outputs=StructuredOutputsParams(
            **constraint)))
    done = []
    while llm.has_unfinished():
        done += [d.output for d in llm.step() if d.finished]
    assert [o.request_id for o in done] == [good] and re.fullmatch(DATE, done[0].text)


def test_ill_formed_requests_are_refused_by_name(llm, prompts):
    with pytest.raises(ValueError, match="exactly one of json, regex, grammar, choice, json_object; got json, regex"):
        StructuredOutputsParams(json=PERSON, regex=DATE)
    with pytest.raises(ValueError, match="min_tokens cannot be combined"):
        llm.add_request(prompts["date"], SamplingParams(min_tokens=2, **constrained(regex=DATE)))
    with pytest.raises(ValueError, match="structured_outputs must be a StructuredOutputsParams"):
        SamplingParams(structured_outputs={"regex": DATE})


def test_the_grammar_cache_returns_the_same_compiled_object(smollm):
    _, tok = smollm
    grammars = grammars_for(tok, 49152, {2})
    assert grammars is grammars_for(tok, 49152, [2])  # the tokenizer's vocabulary is decoded once
    a = grammars.compile(StructuredOutputsParams(json={"type": "object", "required": ["a"]}))
    b = grammars.compile(StructuredOutputsParams(json='{"type":"object",\n "required":["a"]}'))  # its text
    assert a is b
    date = StructuredOutputsParams(regex=DATE)
    assert grammars.compile(date) is grammars.compile(StructuredOutputsParams(regex=DATE))
    assert grammars.compile(StructuredOutputsParams(regex=EMAIL)) is not grammars.compile(date)


@pytest.fixture(scope="module")
def server(smollm):
    model, tok = smollm
    with ServerThread(LLM(model, tokenizer=tok, num_kv_blocks=64, max_model_len=512, max_num_seqs=4)) as srv:
        yield srv


def test_the_http_api_takes_response_format_and_guided_fields(server):
    chat = {"model": "smollm2-135m", "messages": [{"role": "user", "content": ASK["person"]}], "temperature": 0,
            "max_tokens": 120}
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    r = httpx.post(server.url + "/v1/chat/completions", json={**chat, "response_format": fmt}, timeout=120)
    assert r.status_code == 200, r.text
    jsonschema.validate(json.loads(r.json()["choices"][0]["message"]["content"]), PERSON)
    body = {"model": "smollm2-135m", "prompt": "My favourite color is", "max_tokens": 8,
            "guided_choice": ["red", "blue"]}
    r = httpx.post(server.url + "/v1/completions", json=body, timeout=120)
    assert r.status_code == 200 and r.json()["choices"][0]["text"] in ("red", "blue")


@pytest.mark.parametrize("extra, message", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "strange"}}}},
     'the JSON schema cannot be compiled: Unsupported type "strange"'),
    ({"guided_regex": "(a"}, "the regex cannot be compiled"),
    ({"guided_regex": "a", "guided_json": {"type": "object"}}, "send one structured-output constraint"),
    ({"response_format": {"type": "json_schema"}}, "json_schema is given exactly when type is json_schema"),
])
def test_the_http_api_refuses_bad_constraints_with_a_400(server, extra, message):
    body = {"model": "smollm2-135m", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, **extra}
    r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 400 and message in r.json()["error"]["message"], r.text


def test_verification_rows_get_the_state_after_the_preceding_drafts(smollm):
    import torch

    from lab.engine.structured import GrammarState

    _, tok = smollm
    state = GrammarState(grammars_for(tok, 49152, {2}).compile(StructuredOutputsParams(regex="hello world")), 49152)
    hello, world = tok.encode("hello world", add_special_tokens=False)
    allowed = lambda row: set(torch.isfinite(row).nonzero().flatten().tolist())  # noqa: E731
    rows = torch.zeros(3, 49152)
    assert not state.mask(rows, [hello, world])
    assert hello in allowed(rows[0]) and world in allowed(rows[1]) and allowed(rows[2]) == {2}  # then only EOS
    rows = torch.zeros(3, 49152)
    assert state.mask(rows, [world, hello])  # the first draft is forbidden: the rows after it are never read
    assert world not in allowed(rows[0]) and len(allowed(rows[1])) == len(allowed(rows[2])) == 49152
    assert state.matcher.accept_token(hello)  # the tentative drafts were rolled back


# ---- jump-forward (StructuredOutputsConfig(jump_forward=True)) ---------------------------------------------------
JUMP = StructuredOutputsConfig(jump_forward=True)


@pytest.fixture(scope="module")
def jumping(smollm):
    model, tok = smollm
    return LLM(model, tokenizer=tok, num_kv_blocks=256, max_model_len=512, max_num_seqs=16, structured_outputs=JUMP)


def jumped(engine) -> int:
    return engine.stats()["structured_jump_forward_tokens"]


def greedy_alone(engine, prompt, constraint, **kw):
    """One greedy constrained request alone: its output, the engine steps it took and the tokens jumped forward."""
    steps, before = engine.num_steps, jumped(engine)
    out = engine.generate([prompt], SamplingParams(**{**GREEDY, **kw}, **constraint))[0]
    return out, engine.num_steps - steps, jumped(engine) - before


@pytest.mark.parametrize("name, constraint", [("person", constrained(json=PERSON)), ("order", constrained(json=ORDER)),
                                              ("date", constrained(regex=DATE))], ids=["person", "order", "date"])
def test_jump_forward_keeps_greedy_output_in_fewer_steps(llm, jumping, prompts, name, constraint):
    plain, plain_steps, none = greedy_alone(llm, prompts[name], constraint)
    out, steps, forced = greedy_alone(jumping, prompts[name], constraint)
    assert none == 0 and plain_steps == len(plain.token_ids)  # off by default: one step a token
    assert out.token_ids == plain.token_ids and out.finish_reason == plain.finish_reason == "stop"
    assert forced > 0 and steps == plain_steps - forced  # each token jumped forward is a forward pass saved


def test_jump_forward_sampled_outputs_stay_valid(jumping, prompts):
    before = jumped(jumping)
    outs = jumping.generate([prompts["person"]] * 3 + [prompts["order"]],
                            [SamplingParams(**sampled(s), **constrained(json=PERSON)) for s in range(3)]
                            + [SamplingParams(**sampled(3), n=3, **constrained(json=ORDER))])
    assert jumped(jumping) > before
    for o, schema in zip([*outs[:3], *outs[3].outputs], [PERSON] * 3 + [ORDER] * 3):
        assert o.finish_reason == "stop", o.text
        jsonschema.validate(json.loads(o.text), schema)


def test_jump_forward_skips_logprobs_and_keeps_stop_conditions(jumping, prompts):
    out, steps, forced = greedy_alone(jumping, prompts["person"], constrained(json=PERSON), logprobs=1)
    assert forced == 0 and steps == len(out.token_ids) == len(out.logprobs)  # one forward (and entry) a token
    assert all(t in entry for t, entry in zip(out.token_ids, out.logprobs))
    jsonschema.validate(json.loads(out.text), PERSON)
    # PERSON's second token ('"' after '{') is jumped forward: max_tokens still counts it
    short, steps, forced = greedy_alone(jumping, prompts["person"], constrained(json=PERSON), max_tokens=2)
    assert (short.finish_reason, short.text, steps, forced) == ("length", '{"', 1, 1)


@pytest.fixture(scope="module")
def jump_reference(jumping, prompts):
    return [o.token_ids for o in jumping.generate(*batch(prompts))]


@pytest.mark.slow
@pytest.mark.parametrize("options", [dict(num_kv_blocks=14), dict(max_num_batched_tokens=3)],
                         ids=["preempted-cached", "chunked"])
def test_jump_forward_under_preemption_and_chunking(smollm, prompts, reference, jump_reference, options):
    model, tok = smollm
    engine = LLM(model, tokenizer=tok, max_model_len=512, structured_outputs=JUMP, **{"num_kv_blocks": 256, **options})
    assert jump_reference[:4] == reference[:4]  # greedy: as without jump-forward; the seeded one draws less often
    assert [o.token_ids for o in engine.generate(*batch(prompts))] == jump_reference
    s = engine.stats()
    assert s["structured_jump_forward_tokens"] > 0 and engine.block_manager.num_used_blocks == 0
    if "num_kv_blocks" in options:
        assert s["preemptions"] > 0 and s["prefix_cache_hit_tokens"] > 0


@pytest.mark.slow
def test_jump_forward_with_speculation_keeps_greedy_output(smollm, prompts, reference):
    model, tok = smollm
    engine = LLM(model, tokenizer=tok, num_kv_blocks=256, max_model_len=512, speculative=SpeculativeConfig(k=4),
                 structured_outputs=JUMP)
    assert [o.token_ids for o in engine.generate(*batch(prompts, seeded=False))] == reference[:4]
    s = engine.stats()
    assert s["spec_rounds"] > 0 and s["structured_jump_forward_tokens"] > 0


def test_the_jump_forward_state_finds_the_one_allowed_token_and_reuses_its_mask(smollm):
    import torch

    from lab.engine.structured import GrammarState

    _, tok = smollm
    state = GrammarState(grammars_for(tok, 49152, {2}).compile(StructuredOutputsParams(regex="hello world")), 49152)
    assert state.forced() is None  # "hello world" can be spelt in more than one tokenization
    for token in tok.encode("hello world", add_special_tokens=False):
        assert state.accept(token)
    assert state.forced() == 2 and state.filled  # only EOS is left; row 0 holds that state's mask
    state.bitmask[0].fill_(-1)  # were row 0 filled again, this would be overwritten; reused, it allows everything
    row = torch.zeros(1, 49152)
    state.mask(row, [])
    assert bool(torch.isfinite(row).all())
    assert state.accept(2) and state.matcher.is_terminated() and state.forced() is None and not state.filled


def test_the_config_refuses_a_jump_forward_that_is_not_a_bool():
    for value in (1, "yes", None):
        with pytest.raises(ValueError, match="jump_forward must be True or False"):
            StructuredOutputsConfig(jump_forward=value)
