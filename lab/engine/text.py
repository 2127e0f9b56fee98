"""Request text a tokenizer can encode: found and refused at the door, by name.

A Python `str` may hold a lone surrogate (U+D800..U+DFFF without its pair), and JSON lets a client send one
(`"\\ud800"` is valid JSON). It is not Unicode text: UTF-8 cannot encode it, and a tokenizer given it raises an
error about its input's type (the Hugging Face fast tokenizers: "TextEncodeInput must be Union[...]"), deep in a
call that names neither the request nor the field. `check_text` finds such a character in one string and
`check_texts` in every string of a nested request (keys included), and each raises a `BadText` (a ValueError)
naming the field, the character and its position, before anything is tokenized, compiled or queued.
"""

from __future__ import annotations

import re

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
