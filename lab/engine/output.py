"""The engine's one output path: what a step added to each request, as a `RequestDelta`.

`LLM.step` returns a delta for every request the step changed, and everything a caller shows is built from
those deltas alone: `LLM.generate` and `LLM.chat` keep the last one of each request (its `output`), and the
server streams each delta as a chunk or, not streaming, joins them into one response. This is vLLM v1's
`OutputProcessor` (vllm/v1/engine/output_processor.py) and its `RequestOutputKind`: a request whose
`SamplingParams.output_kind` is "final" gets one delta, when it ends, holding all its tokens, text and
logprobs (and the text is decoded once, there); a "delta" request gets one each step that adds text it may show.

Text comes from the request's own incremental detokenizer (`lab.engine.text.Detokenizer`): a delta waits while
the last token ends inside a character (its bytes span tokens), and holds back the characters that could begin
a stop string, so a stream's chunks joined are the final text, never more.
"""

from __future__ import annotations

from dataclasses import dataclass

from .request import RequestOutput, Sequence


@dataclass
class RequestDelta:
    """What one step added to one request: its new token ids, their text and logprobs; on the last, `finished`
    and the whole request's `output` (and `error` if its own step failed, or the engine's did)."""

    request_id: int
    token_ids: list[int]
    text: str
    finished: bool = False
    output: RequestOutput | None = None
    error: str | None = None
    logprobs: list | None = None  # one {token: Logprob} dict per token in token_ids, if the request asked

    @property
    def finish_reason(self) -> str | None:
        return None if self.output is None else self.output.finish_reason


def final_output(seq: Sequence, error: str | None = None) -> RequestOutput:
    """The whole request, its text brought up to the last token (and cut at a stop string)."""
    text = None
    if seq.detokenizer is not None:
        seq.detokenizer.update(seq.output_token_ids, final=True)
        text = seq.detokenizer.text
    return RequestOutput(seq.request_id, seq.token_ids[:seq.num_prompt_tokens], seq.output_token_ids, text,
                         seq.finish_reason, seq.metrics, error, seq.logprobs, prompt_logprobs=seq.prompt_logprobs)


class OutputProcessor:
    """Per request, how much has been sent (tokens and characters), and the delta each step makes of it."""

    def __init__(self):
        self._sent: dict[int, tuple[int, int]] = {}  # request id -> (tokens, characters) already in a delta

    def delta(self, seq: Sequence, finished: bool, error: str | None = None) -> RequestDelta | None:
        """The request's delta after a step (None: nothing to send yet). A finished request gets its last one,
        with its whole output; its record goes."""
        if not finished and seq.params.output_kind == "final":  # checked first: the common case, every step
            return None
        tokens = seq.output_token_ids
        sent_tokens, sent_chars = self._sent.get(seq.request_id, (0, 0))
        output = None
        if finished:
            output = final_output(seq, error)
            self._sent.pop(seq.request_id, None)
        elif len(tokens) == sent_tokens:
            return None
        detok = seq.detokenizer
        if detok is not None and not finished:
            detok.update(tokens)
            if detok.read_offset < len(tokens):  # a character split across tokens: wait for the rest
                return None
        text = detok.streamable(finished) if detok is not None else ""
        if not finished:
            self._sent[seq.request_id] = (len(tokens), len(text))
        logprobs = None if seq.logprobs is None else seq.logprobs[sent_tokens:len(tokens)]
        return RequestDelta(seq.request_id, tokens[sent_tokens:], text[sent_chars:], finished, output, error,
                            logprobs)

    def forget(self, request_id: int) -> None:
        """The request was aborted: it gets no more deltas."""
        self._sent.pop(request_id, None)
