"""The files one request runs through, measured (`lab.engine.trace.request_path_files`) and stated in
docs/engine.md's "Follow one request" table: the table lists exactly the files whose code runs for one
`LLM.generate` on the torch backend in float32, and the count in its sentence is theirs. The count is a symptom
a reader sees, not a target (issue 50 retired the old one of 8: it had merged the block pool into the scheduler
for the number more than for the reader)."""

import gc
import re
from pathlib import Path

from lab.engine import LLM, SamplingParams
from lab.engine.trace import request_path_files

DOC = Path(__file__).resolve().parents[1] / "docs" / "engine.md"


def _table() -> tuple[int, set[str]]:
    text = DOC.read_text()
    section = text[text.index("## Follow one request"):text.index("Around that path:")]
    count = int(re.search(r"runs in (\d+) files of `lab`", section).group(1))
    return count, set(re.findall(r"\| `(lab/[\w/]+\.py)` \|", section))


def test_the_docs_list_the_files_one_request_runs_through(smollm):
    model, tok = smollm
    gc.collect()  # engines of earlier tests on this shared model are gone, and their hooks with them
    llm = LLM(model, tokenizer=tok, dtype="float32", max_model_len=256, num_kv_blocks=32)
    llm.generate("warm up", SamplingParams(temperature=0, max_tokens=2))  # first-call setup is not the path
    files = request_path_files(llm, "The capital of France is", SamplingParams(temperature=0, max_tokens=4))
    count, listed = _table()
    assert set(files) == listed, (sorted(set(files) - listed), sorted(listed - set(files)))
    assert count == len(files), files
