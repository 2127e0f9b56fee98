"""Reading tool calls out of output text as it grows (`lab.serve.tools` uses them; vLLM's counterparts are its
tool parsers, vllm/entrypoints/openai/tool_parsers/, and the partial-JSON reading of serving_chat.py).

- `RequiredScanner`: the text of a `tool_choice="required"` output, `[{"name": "f", "arguments": {...}}, ...]`,
  read one character at a time: a call appears once its name's string is complete, and its arguments' text
  grows as it arrives, so a stream can send each piece once. The grammar guarantees the shape; the scanner only
  follows strings (and their escapes) and bracket depth.
- `Hermes`: the Hermes format (`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, the format of
  Hermes 2/3 and Qwen2.5's chat templates; vLLM's `hermes` parser). Text outside the blocks is content; text that
  might be the start of `<tool_call>` is held back until it is known not to be, and leading whitespace until
  something else follows it (content that is only whitespace is no content: null).
"""

from __future__ import annotations

import json


class RequiredScanner:
    def __init__(self):
        self.calls: list[dict] = []  # {"name": str | None, "arguments": str}
        self.done = False  # the array has closed
        self._depth = 0
        self._in_string = self._escape = False
        self._raw = ""  # a string at depth 2 being read, with its quotes
        self._key: str | None = None  # the key at depth 2 whose value comes next
        self._after_colon = False
        self._args_depth: int | None = None  # bracket depth inside the arguments value, while in it

    def feed(self, text: str) -> None:
        for ch in text:
            if self._args_depth is not None:
                self._arguments(ch)
            elif self._in_string:
                self._string(ch)
            else:
                self._structure(ch)

    def _closes_string(self, ch: str) -> bool:
        """One character inside a JSON string: escapes tracked; True when it is the closing quote."""
        if self._escape:
            self._escape = False
        elif ch == "\\":
            self._escape = True
        elif ch == '"':
            self._in_string = False
            return True
        return False

    def _string(self, ch: str) -> None:
        self._raw += ch
        if self._closes_string(ch):
            if self._depth == 2 and self._after_colon and self._key == "name":
                self.calls[-1]["name"] = json.loads(self._raw)
            elif self._depth == 2 and not self._after_colon:
                self._key = json.loads(self._raw)

    def _structure(self, ch: str) -> None:
        if ch.isspace():
            return
        if self._depth == 2 and self._after_colon and self._key == "arguments":
            self._args_depth = 0
            self._arguments(ch)
        elif ch == '"':
            self._in_string, self._raw = True, ch
        elif ch == ":":
            self._after_colon = True
        elif ch == ",":
            self._after_colon, self._key = False, None
        elif ch in "[{":
            self._depth += 1
            if self._depth == 2:
                self.calls.append({"name": None, "arguments": ""})
                self._after_colon, self._key = False, None
        elif ch in "]}":
            self._depth -= 1
            self.done = self._depth == 0

    def _arguments(self, ch: str) -> None:
        self.calls[-1]["arguments"] += ch
        if self._in_string:
            self._closes_string(ch)
        elif ch == '"':
            self._in_string = True
        elif ch in "[{":
            self._args_depth += 1
        elif ch in "]}":
            self._args_depth -= 1
        if self._args_depth == 0 and not self._in_string and ch in "]}":  # the arguments object has closed
            self._args_depth, self._after_colon, self._key = None, False, None


class Hermes:
    START, END = "<tool_call>", "</tool_call>"

    @classmethod
    def fits(cls, tokenizer) -> bool:
        """Whether the model's chat template writes tool calls in this format."""
        return cls.START in str(getattr(tokenizer, "chat_template", None) or "")

    def __init__(self, names: set[str], parallel: bool = True):
        self.names, self.parallel = names, parallel
        self.calls: list[tuple[str, str]] = []  # (name, arguments JSON text), whole
        self._pending = ""  # text not yet classified
        self._in_call = False
        self._spoken = False  # content other than whitespace has been sent
        self._held = ""  # whitespace held until something else follows it

    def feed(self, text: str, final: bool) -> tuple[str, list[tuple[str, str]]]:
        """The content this text adds, and every call so far."""
        self._pending += text
        out = []
        while self._pending:
            if not self._in_call:
                at = self._pending.find(self.START)
                if at < 0:
                    keep = 0 if final else _partial_suffix(self._pending, self.START)
                    out.append(self._pending[:len(self._pending) - keep])
                    self._pending = self._pending[len(self._pending) - keep:]
                    break
                out.append(self._pending[:at])
                self._pending, self._in_call = self._pending[at:], True
            at = self._pending.find(self.END)
            if at < 0:
                if final:  # an unclosed block: the model's text, as it wrote it
                    out.append(self._pending)
                    self._pending = ""
                break
            block, self._pending = self._pending[:at + len(self.END)], self._pending[at + len(self.END):]
            self._in_call = False
            call = self._call(block[len(self.START):-len(self.END)])
            if call is None:
                out.append(block)
            else:
                self.calls.append(call)
        return self._content("".join(out)), list(self.calls)

    def _call(self, inner: str) -> tuple[str, str] | None:
        try:
            obj = json.loads(inner)
        except json.JSONDecodeError:
            return None
        if (not isinstance(obj, dict) or obj.get("name") not in self.names
                or not isinstance(obj.get("arguments", {}), dict) or (self.calls and not self.parallel)):
            return None
        return obj["name"], json.dumps(obj.get("arguments", {}), ensure_ascii=False)

    def _content(self, text: str) -> str:
        if not self._spoken:
            self._held += text
            if not self._held.strip():
                return ""
            text, self._held, self._spoken = self._held, "", True
        return text


def _partial_suffix(text: str, marker: str) -> int:
    """The length of the longest end of `text` that begins `marker` (text that may yet become it)."""
    for n in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0
