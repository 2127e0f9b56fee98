"""One output path (`lab.engine.text`): the text decoded as tokens arrive equals decoding the whole output, and
the server streams the engine's own text, decoding each token a bounded number of times, not the whole output
again every step. One fan-out (`LLM.add_samples`) for `n`, which can abort a sample it still holds."""

import json
import random
from pathlib import Path

import httpx

from lab.engine import LLM, SamplingParams
from lab.engine.text import Detokenizer
from lab.serve import ServerThread

SPEC_BENCH = Path(__file__).resolve().parents[2] / "shared" / "data" / "spec_bench" / "question.jsonl"


def test_text_decoded_as_it_grows_equals_the_whole_decode(smollm):
    _, tok = smollm
    texts = [json.loads(line)["turns"][0] for line in SPEC_BENCH.read_text().splitlines()[:80]]
    texts += ["héllo wörld ✓ 日本語のテキスト 🙂🙂 done", "a\u00e9\u20ac\U0001F600b" * 5]  # 2 to 4 bytes each
    rng = random.Random(0)
    for text in texts:
        ids = tok.encode(text, add_special_tokens=False)
        d = Detokenizer(tok)
        for i in range(1, len(ids) + 1):  # updated after some tokens only, as a stream read every few steps is
            if rng.random() < 0.7 or i == len(ids):
                d.update(ids[:i], final=i == len(ids))
        assert d.text == tok.decode(ids, skip_special_tokens=True)


def test_a_stream_is_the_engines_text_and_decodes_each_token_a_few_times(smollm, monkeypatch):
    model, tok = smollm
    body = {"model": "smollm2-135m", "prompt": "Write a long story about a lighthouse keeper.", "max_tokens": 60,
            "temperature": 0, "ignore_eos": True}
    with ServerThread(LLM(model, tokenizer=tok, num_kv_blocks=64, max_model_len=256)) as srv:
        whole = httpx.post(srv.url + "/v1/completions", json=body, timeout=120).json()["choices"][0]["text"]
        decoded, decode = [], tok.decode
        monkeypatch.setattr(tok, "decode", lambda ids, **kw: decoded.append(len(ids)) or decode(ids, **kw))
        chunks = []
        with httpx.stream("POST", srv.url + "/v1/completions", json={**body, "stream": True}, timeout=120) as r:
            for line in r.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    chunks.append(json.loads(line[6:]))
    assert "".join(c["choices"][0]["text"] for c in chunks if c.get("choices")) == whole
    # Each step decodes the window since the last one (a token and the one before it, about): linear in the
    # output. Decoding the whole output every step, as the server once did, is 60 * 61 / 2 = 1830 tokens.
    assert sum(decoded) <= 4 * 60, sum(decoded)


def test_an_aborted_sample_that_is_still_held_never_runs(smollm):
    """A defect: aborting a sample the fan-out still held did nothing, and it ran later for nobody."""
    model, tok = smollm
    llm = LLM(model, tokenizer=tok, num_kv_blocks=64, max_model_len=256)
    p = SamplingParams(max_tokens=4, temperature=1.0, seed=3, n=3, ignore_eos=True)
    seqs = [llm.make_sequence("Tell me a joke about caches.", q) for q in p.samples()]
    llm.add_samples(seqs)
    llm.abort(seqs[1].request_id)  # held: the first has not computed the prompt yet
    done = {}
    while llm.has_unfinished():
        done.update((o.request_id, o) for o in (d.output for d in llm.step() if d.finished))
    assert set(done) == {seqs[0].request_id, seqs[2].request_id}
    assert llm.stats()["fanout_held"] == 0 and llm.stats()["running"] == 0
