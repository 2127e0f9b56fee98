"""Chat messages to a prompt: the OpenAI / vLLM message shapes, checked, then the tokenizer's chat template.

`LLM.chat` and the server's /v1/chat/completions both go through `render`, so a conversation reaches the model
the same way from Python and over HTTP. Accepted, as OpenAI's API and vLLM accept them: roles system,
developer (OpenAI's newer name for system: rendered as system, which is what chat templates know), user and
assistant; content as a string or as a list of parts, of which text parts are joined (other part types, such as
images, are refused by name: this model reads text only).
"""

from __future__ import annotations

ROLES = ("system", "developer", "user", "assistant")


def _content(content, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ValueError(f"{where}.content must be a string or a list of parts, got {type(content).__name__}")
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind != "text" or not isinstance(part.get("text"), str):
            raise ValueError(f"{where}.content[{j}] is a {kind or type(part).__name__!s} part; only text parts "
                             f"({{'type': 'text', 'text': ...}}) are supported")
        texts.append(part["text"])
    return "".join(texts)


def normalize(messages, where: str = "messages") -> list[dict]:
    """One conversation as [{"role", "content": str}], every message checked (errors name its index)."""
    if not isinstance(messages, list) or not messages:
        raise ValueError(f"{where} must be a non-empty list of messages, got {messages!r}")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or "role" not in m or "content" not in m:
            raise ValueError(f"{where}[{i}] must be a dict with 'role' and 'content', got {m!r}")
        if m["role"] not in ROLES:
            raise ValueError(f"{where}[{i}].role is {m['role']!r}; one of {list(ROLES)}")
        role = "system" if m["role"] == "developer" else m["role"]
        out.append({"role": role, "content": _content(m["content"], f"{where}[{i}]")})
    return out


def render(tokenizer, messages, where: str = "messages") -> str:
    """The prompt text of one conversation, ending where the assistant's answer begins."""
    if tokenizer is None:
        raise ValueError("this model has no tokenizer, hence no chat template: pass token ids instead")
    return tokenizer.apply_chat_template(normalize(messages, where), add_generation_prompt=True, tokenize=False)
