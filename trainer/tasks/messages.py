"""OpenAI's reinforcement fine-tuning rows: `{"messages": [...], <any other fields>}`.

The messages are the prompt; the whole row is the grader's `item` (`reference_answer` and any
other field). This module checks a row's messages (each problem named by its path, e.g.
`messages[1].content[0].text`), reduces each message's content to text (OpenAI's content is
a string or a list of `{"type": "input_text" | "text", "text": ...}` parts), and renders
them: with the model's chat template where the tokenizer has one, else as the plain text
`plain_text` documents (docs/graders.md, Dataset formats). Pure Python: the API's upload
check imports it.
"""
from __future__ import annotations

from typing import Any

# OpenAI's chat roles (developer is its newer name for system); a tool turn has no place in
# a prompt the model answers.
ROLES = ("system", "developer", "user", "assistant")
TEXT_PART_TYPES = ("input_text", "text")
MAX_MESSAGES = 256


class MessagesError(ValueError):
    """A bad `messages` field; `path` is e.g. `messages[1].content`."""

    def __init__(self, path: str, message: str):
        super().__init__(f"{path}: {message}")
        self.path = path
        self.message = message


def _content_text(content: Any, path: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise MessagesError(path, "must be a string or a list of text parts "
                                  '({"type": "input_text", "text": ...})')
    texts = []
    for j, part in enumerate(content):
        where = f"{path}[{j}]"
        if not isinstance(part, dict):
            raise MessagesError(where, f"must be an object, got {type(part).__name__}")
        kind = part.get("type")
        if kind not in TEXT_PART_TYPES:
            raise MessagesError(f"{where}.type", f"{kind!r} is not supported: only text parts "
                                f"({', '.join(TEXT_PART_TYPES)}) can be trained on here")
        text = part.get("text")
        if not isinstance(text, str):
            raise MessagesError(f"{where}.text", "must be a string")
        texts.append(text)
    return "".join(texts)  # OpenAI's text parts are one text, concatenated as they are


def parse_messages(messages: Any) -> list[dict[str, str]]:
    """`[{"role", "content": text}]` of a row's `messages`; MessagesError naming the field."""
    if not isinstance(messages, list) or not messages:
        raise MessagesError("messages", "must be a non-empty list of {role, content} objects")
    if len(messages) > MAX_MESSAGES:
        raise MessagesError("messages", f"has {len(messages)} messages; at most {MAX_MESSAGES}")
    out = []
    for i, msg in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(msg, dict):
            raise MessagesError(where, f"must be an object, got {type(msg).__name__}")
        role = msg.get("role")
        if role not in ROLES:
            raise MessagesError(f"{where}.role", f"must be one of {', '.join(ROLES)}, got {role!r}")
        if "content" not in msg:
            raise MessagesError(f"{where}.content", "is missing")
        out.append({"role": role, "content": _content_text(msg["content"], f"{where}.content")})
    if not any(m["content"].strip() for m in out):
        raise MessagesError("messages", "holds no text")
    return out


def plain_text(messages: list[dict[str, str]]) -> str:
    """The messages as one text, for a model without a chat template (builtin:tiny is
    character-level: every character costs a position for each of the N samples).

    A lone user message is its text; otherwise each message is `<role>: <text>`, one per line,
    in order. This is also the row's `question` (what `{question}` in task.prompt_template
    stands for, and the grader's `item.prompt` / `item.question`)."""
    if len(messages) == 1 and messages[0]["role"] == "user":
        return messages[0]["content"]
    return "\n".join(f"{m['role']}: {m['content']}" for m in messages)


def chat_prompt(messages: list[dict[str, str]], tokenizer: Any) -> str:
    """The messages through the tokenizer's chat template, ready for the assistant's turn.

    developer becomes system (the role chat templates know); a template that refuses a
    system role (e.g. Gemma's) gets the system texts at the head of the first user turn."""
    chat = [{"role": "system" if m["role"] == "developer" else m["role"], "content": m["content"]}
            for m in messages]
    try:
        return tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
    except Exception:  # noqa: BLE001 - a template's own refusal (a jinja raise_exception)
        system = "\n\n".join(m["content"] for m in chat if m["role"] == "system")
        rest = [m for m in chat if m["role"] != "system"]
        if not system or not rest or rest[0]["role"] != "user":
            raise
        rest[0] = {"role": "user", "content": f"{system}\n\n{rest[0]['content']}"}
        return tokenizer.apply_chat_template(rest, add_generation_prompt=True, tokenize=False)
