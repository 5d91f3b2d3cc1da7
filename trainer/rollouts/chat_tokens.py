"""An episode's messages as token ids, placed where the chat template puts them.

Multi-turn training keeps the token ids the engine sampled (`trainer.rollouts.multiturn`):
re-applying the chat template to the final conversation does not reproduce them (Qwen3's
template drops the <think> block of every assistant turn before the last user message; a
re-tokenised text can split differently than it was sampled), and training on re-templated
ids breaks the ratios. So only the environment's part is rendered, once per reply, and placed
after the model's sampled ids:

- the opening: the episode's first messages through the template, with `tools=` and the
  generation prompt (`ChatTokens.opening`);
- a reply: the template's text between the end of a model turn's content and the next
  generation prompt (`ChatTokens.reply`). It is cut out of a rendering of a fixed stand-in
  conversation (one short user message, an assistant message whose content is a marker, then
  the reply's messages), not of the real one: what a template does to earlier turns cannot
  leak into it. The end-of-turn token the model already sampled (its EOS) is dropped from the
  front of the text; a turn cut by its token budget keeps it, so the turn is closed as the
  template would close it.

A template that cannot render a reply (one that refuses a `tool` message without a matching
call, or any role but user and assistant) gets the tool results as user messages; one that
ignores `tools` gets them in a system message in Hermes' words (Qwen's own), so the model
knows what it may call. A tokenizer without a chat template (`builtin:tiny`, character-level)
gets the plain format below, with clear role markers and nothing outside printable ASCII:

    opening:  [tools: add(a, b), mul(a, b)\\n] <system>\\n <user>\\n   (each content, then a newline)
    reply:    \\n<tool_response>RESULT</tool_response>\\n   (a tool message)
              \\n<user>TEXT</user>\\n                         (any other role)

the single-turn task prompt's format when a lone user message opens the episode.
"""
from __future__ import annotations

import json
from typing import Any

from trainer.rollouts.environments.base import Message

MARKER = "BRORLxSTANDINxTURNx7f3a"   # the stand-in assistant turn's content
STAND_IN_USER = {"role": "user", "content": "."}
HERMES_TOOLS = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{tools}\n</tools>\n\n"
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n{{\"name\": <function-name>, \"arguments\": "
    "<args-json-object>}}\n</tool_call>")


class ChatTokens:
    """Renders one environment's messages for one tokenizer (its tools fixed for the job)."""

    def __init__(self, tokenizer: Any, tools: list[dict[str, Any]] | None = None):
        self.tokenizer = tokenizer
        self.tools = tools or None
        template = getattr(tokenizer, "chat_template", None)
        self.chat = bool(template)
        # A template that never reads `tools` would drop them: they go into a system message.
        self.tools_in_system = bool(self.tools) and self.chat and "tools" not in str(template)
        eos = getattr(tokenizer, "eos_token_id", None)
        self.stop_ids = {int(eos)} if isinstance(eos, int) else set()
        self._reply_mode: str | None = None    # "tool" or "user": how replies render, found once
        self.specials = _special_strings(tokenizer)

    # --------------------------------------------------------------------- opening

    def opening(self, messages: list[Message]) -> list[int]:
        """The first turn's prompt: the opening messages and the generation prompt."""
        if not self.chat:
            return self._encode(plain_opening(messages, self.tools))
        return self._encode(self._render(self._with_tools(messages), generation=True))

    def _with_tools(self, messages: list[Message]) -> list[Message]:
        if not self.tools_in_system:
            return list(messages)
        text = HERMES_TOOLS.format(tools="\n".join(json.dumps(t) for t in self.tools))
        if messages and messages[0].get("role") == "system":
            first = dict(messages[0], content=f"{messages[0].get('content') or ''}\n\n{text}")
            return [first, *messages[1:]]
        return [{"role": "system", "content": text}, *messages]

    # --------------------------------------------------------------------- replies

    def reply(self, messages: list[Message], turn_ids: list[int]) -> list[int]:
        """The ids that follow a model turn (`turn_ids`, as sampled) when the environment
        answers with `messages`: the turn's close, the messages, the next generation prompt."""
        messages = defang(messages, self.specials)
        if not self.chat:
            return self._encode(plain_reply(messages))
        text = self._reply_text(messages)
        if turn_ids and turn_ids[-1] in self.stop_ids:
            eos = self.tokenizer.convert_ids_to_tokens(turn_ids[-1])
            if isinstance(eos, str) and text.startswith(eos):
                text = text[len(eos):]   # the model sampled it: it is in the turn's ids already
        return self._encode(text)

    def _reply_text(self, messages: list[Message]) -> str:
        modes = [self._reply_mode] if self._reply_mode else ["tool", "user"]
        last: Exception | None = None
        for mode in modes:
            shown = messages if mode == "tool" else [_as_user(m) for m in messages]
            try:
                text = self._render([STAND_IN_USER, {"role": "assistant", "content": MARKER}, *shown],
                                    generation=True)
            except Exception as exc:  # noqa: BLE001 - a template's own error: try the next way
                last = exc
                continue
            at = text.rfind(MARKER)
            if at < 0:
                last = ValueError("the chat template does not render an assistant message's content")
                continue
            self._reply_mode = mode
            return text[at + len(MARKER):]
        raise ChatTemplateError(f"the chat template cannot render an environment's reply: {last}")

    # --------------------------------------------------------------------- helpers

    def _render(self, messages: list[Message], *, generation: bool) -> str:
        kwargs: dict[str, Any] = {"add_generation_prompt": generation, "tokenize": False}
        if self.tools and not self.tools_in_system:
            kwargs["tools"] = self.tools
        return self.tokenizer.apply_chat_template(_template_messages(messages), **kwargs)

    def _encode(self, text: str) -> list[int]:
        # The template (or the plain format) already holds every special token it wants.
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])


def _special_strings(tokenizer: Any) -> list[str]:
    """The tokenizer's special tokens as text (longest first), e.g. `<|im_end|>`."""
    found = set(getattr(tokenizer, "all_special_tokens", None) or [])
    for token in (getattr(tokenizer, "added_tokens_decoder", None) or {}).values():
        if getattr(token, "special", False):
            found.add(str(token.content))
    return sorted((t for t in found if isinstance(t, str) and len(t) > 1), key=len, reverse=True)


def defang(messages: list[Message], specials: list[str]) -> list[Message]:
    """Messages whose content cannot be read as special tokens: an environment's text (a tool's
    output, a server's observation) is untrusted, and `<|im_end|><|im_start|>assistant` in it
    would otherwise tokenise as a forged end of turn and a new model turn. A zero-width space
    after the first character of each such string keeps it readable and plain text."""
    out = []
    for m in messages:
        content = m.get("content")
        if isinstance(content, str) and any(s in content for s in specials):
            for s in specials:
                content = content.replace(s, s[0] + "\u200b" + s[1:])
            m = dict(m, content=content)
        out.append(m)
    return out


class ChatTemplateError(ValueError):
    """The tokenizer's chat template cannot render the environment's messages."""


def _template_messages(messages: list[Message]) -> list[Message]:
    """Messages as templates read them: tool-call arguments as objects (what Qwen's and most
    templates serialise with tojson), contents as strings."""
    out = []
    for m in messages:
        m = dict(m)
        if m.get("content") is None:
            m["content"] = ""
        out.append(m)
    return out


def _as_user(message: Message) -> Message:
    """A tool result as a user message, for templates that know no `tool` role."""
    if message.get("role") != "tool":
        return message
    name = message.get("name")
    return {"role": "user", "content": f"<tool_response>{' ' + name if name else ''}\n"
                                       f"{message.get('content') or ''}\n</tool_response>"}


def _signature(tool: dict[str, Any]) -> str:
    fn = tool.get("function", tool)
    params = (fn.get("parameters") or {}).get("properties") or {}
    return f"{fn.get('name', '?')}({', '.join(params)})"


def plain_opening(messages: list[Message], tools: list[dict[str, Any]] | None = None) -> str:
    """The opening text for a tokenizer without a chat template (module docstring)."""
    head = f"tools: {', '.join(_signature(t) for t in tools)}\n" if tools else ""
    if len(messages) == 1 and messages[0].get("role") == "user":
        return head + f"{messages[0].get('content') or ''}\n"
    return head + "".join(f"<{m.get('role')}>{m.get('content') or ''}</{m.get('role')}>\n" for m in messages)


def plain_reply(messages: list[Message]) -> str:
    """A reply's text for a tokenizer without a chat template (module docstring)."""
    parts = []
    for m in messages:
        role = m.get("role") or "user"
        tag = "tool_response" if role == "tool" else role
        parts.append(f"<{tag}>{m.get('content') or ''}</{tag}>\n")
    return "\n" + "".join(parts)
