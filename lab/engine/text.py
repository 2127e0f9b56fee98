"""A request's text at the engine's two edges: what comes in must be text a tokenizer can encode, and what goes
out is decoded incrementally as the tokens arrive, with its stop strings.

**In.** A Python `str` may hold a lone surrogate (U+D800..U+DFFF without its pair), and JSON lets a client send one
(`"\\ud800"` is valid JSON). It is not Unicode text: UTF-8 cannot encode it, and a tokenizer given it raises an
error about its input's type (the Hugging Face fast tokenizers: "TextEncodeInput must be Union[...]"), deep in a
call that names neither the request nor the field. `check_text` finds such a character in one string and
`check_texts` in every string of a nested request (keys included), and each raises a `BadText` (a ValueError)
naming the field, the character and its position, before anything is tokenized, compiled or queued.

**Out**, the output path: `LLM.generate` and the server read the same object (`Sequence.detokenizer`), so a
streamed response and a whole one are the same text and nothing is decoded twice. After vLLM's incremental detokenizer
(vllm/v1/engine/detokenizer.py): each new token is decoded together with the one or more tokens before it
(`prefix_offset` .. `read_offset`), and the text is what that window adds beyond its prefix, so a character
whose bytes span several tokens appears once all of them are in (until then the window ends in U+FFFD and
nothing is added). The text is brought up to date when it is read: after every token for a request with stop
strings, every step for a streamed one, once at the end otherwise; each update decodes the window since the last
one, never the whole output again (which would make a request's decoding quadratic in its length).

Stop strings (vLLM's `SamplingParams.stop`) are looked for in the new text and the `max stop length - 1`
characters before it, so a stop string spanning tokens is found when its last character arrives; the text is cut
before it (after it with include_stop_str_in_output). A stream holds back those last characters until they
cannot begin a stop string (`streamable`).
"""

from __future__ import annotations

import re

REPLACEMENT = "\ufffd"  # what decoding shows for the bytes of an incomplete character
_SURROGATE = re.compile("[\ud800-\udfff]")


class BadText(ValueError):
    """A request field holds a character no tokenizer can encode; `where` names the field."""

    def __init__(self, where: str, message: str):
        super().__init__(message)
        self.where = where


def check_text(text: str, where: str, what: str = "contains") -> None:
    """Raise BadText if `text` holds a lone surrogate (a str that UTF-8 cannot encode)."""
    m = _SURROGATE.search(text)
    if m is not None:
        raise BadText(where, f"{where} {what} {m.group()!r} at character {m.start()}, a lone surrogate (half of "
                             f"a UTF-16 pair): it is not Unicode text, and no tokenizer can encode it")


def check_texts(value, where: str) -> None:
    """`check_text` on every string in `value` (dicts, lists and tuples walked, keys included); the first found
    is named by its path, as `where[0].content` or `where.schema.properties`."""
    if isinstance(value, str):
        check_text(value, where)
    elif isinstance(value, dict):
        for key, item in value.items():
            if isinstance(key, str):
                check_text(key, where or "the body", "has a key that contains")
                path = f"{where}.{key}" if where else key
            else:
                path = f"{where}[{key!r}]"
            check_texts(item, path)
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            check_texts(item, f"{where}[{i}]")





class Detokenizer:
    def __init__(self, tokenizer, stop: list[str] | None = None, include_stop: bool = False):
        self.tokenizer, self.stop, self.include_stop = tokenizer, stop or [], include_stop
        self.hold = max(map(len, self.stop), default=1) - 1  # characters that could begin a stop string
        self.text = ""
        self.prefix_offset = self.read_offset = 0  # output-token offsets of the decoding window
        self.stopped = False  # a stop string matched: `text` is final

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def update(self, output_ids: list[int], final: bool = False) -> bool:
        """Bring `text` up to the output's tokens so far; True when a stop string ends it. `final`: the request
        ends here, so the bytes of an incomplete character are decoded as they are."""
        if self.stopped:
            return True
        prefix = self._decode(output_ids[self.prefix_offset:self.read_offset])
        full = self._decode(output_ids[self.prefix_offset:])
        if len(full) <= len(prefix) or (full.endswith(REPLACEMENT) and not final):
            return False  # nothing printable yet: wait for the rest of the character
        start = len(self.text)
        self.text += full[len(prefix):]
        self.prefix_offset, self.read_offset = self.read_offset, len(output_ids)
        return self._cut_at_stop(max(0, start - self.hold))

    def _cut_at_stop(self, since: int) -> bool:
        hits = [(i, s) for s in self.stop if (i := self.text.find(s, since)) >= 0]
        if not hits:
            return False
        i, s = min(hits)
        self.text = self.text[:i + len(s)] if self.include_stop else self.text[:i]
        self.stopped = True
        return True

    def streamable(self, finished: bool) -> str:
        """The text a stream may send now: all of it once finished, else all but what could begin a stop string."""
        if finished or self.stopped or not self.stop:
            return self.text
        return self.text[:max(0, len(self.text) - self.hold)]
