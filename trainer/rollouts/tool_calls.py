"""Tool calls read from a model turn's text: what the multi-turn driver hands an episode.

The model writes its calls in its chat template's format; the one read here is Hermes'
(Qwen2.5, Qwen3, Hermes, and most open chat models trained for tools):

    <tool_call>
    {"name": "add", "arguments": {"a": 1, "b": 2}}
    </tool_call>

several to a turn, plus Mistral's `[TOOL_CALLS][{...}, ...]` for templates that use it
(`call_format`). `arguments` may be an object or a JSON string holding one (OpenAI's wire
shape); `parameters` is read as its other name.

The text is the policy's sample, so it is hostile by construction: anything may be there (a
megabyte of braces, JSON nested ten thousand deep, a list where an object belongs, a call
with no name). `parse_turn` never raises: a call it cannot read becomes `parse_error`, a
message that names what was wrong so the environment can answer it to the model (which may
retry), and the calls it could read are kept. Sizes are bounded before any JSON is parsed.
"""
from __future__ import annotations

import json
import re
from typing import Any

from trainer.rollouts.environments.base import AssistantTurn, ToolCall

MAX_CALLS = 16               # calls read from one turn; more is an error for the rest
MAX_CALL_CHARS = 32_768      # one call's JSON
MAX_NAME_CHARS = 128
MAX_DEPTH = 32               # nesting of a call's JSON (arguments included)

_HERMES = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-]*$")


def call_format(tokenizer: Any) -> str:
    """The tool-call format the tokenizer's chat template speaks: "mistral" where it renders
    `[TOOL_CALLS]`, else "hermes" (also the format the plain-text fallback teaches)."""
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):  # a tokenizer with named templates
        template = template.get("tool_use") or template.get("default") or ""
    return "mistral" if isinstance(template, str) and "[TOOL_CALLS]" in template else "hermes"


def parse_turn(text: str, *, turn: int = 0, fmt: str = "hermes", truncated: bool = False) -> AssistantTurn:
    """The turn's text and the tool calls in it (ids `call_<turn>_<k>`). Never raises."""
    try:
        blocks, error = (_mistral_blocks if fmt == "mistral" else _hermes_blocks)(text)
    except Exception as exc:  # noqa: BLE001 - a parser bug must not end the job either
        return AssistantTurn(text=text, parse_error=f"the tool calls could not be read ({type(exc).__name__})",
                             truncated=truncated)
    calls: list[ToolCall] = []
    errors = [error] if error else []
    for k, block in enumerate(blocks):
        if len(calls) >= MAX_CALLS:
            errors.append(f"more than {MAX_CALLS} tool calls in one turn; the rest were not run")
            break
        call, why = _read_call(block, f"call_{turn}_{k}")
        if call is not None:
            calls.append(call)
        else:
            errors.append(f"tool call {k + 1}: {why}" if len(blocks) > 1 else f"tool call: {why}")
    return AssistantTurn(text=text, tool_calls=calls, parse_error="; ".join(errors) or None, truncated=truncated)


def _hermes_blocks(text: str) -> tuple[list[Any], str | None]:
    """The JSON text of each `<tool_call>` block; a block left open at the end of the turn is
    read too (a turn cut by its budget) but named in the error when it is not JSON."""
    blocks: list[Any] = []
    for m in _HERMES.finditer(text):
        body = m.group(1)
        closed = m.group(0).endswith("</tool_call>")
        blocks.append(body if closed else _Unclosed(body))
        if len(blocks) > MAX_CALLS:
            break
    return blocks, None


class _Unclosed(str):
    """A `<tool_call>` block with no closing tag."""


def _mistral_blocks(text: str) -> tuple[list[Any], str | None]:
    """Mistral: `[TOOL_CALLS]` followed by a JSON list of calls (or one call)."""
    at = text.find("[TOOL_CALLS]")
    if at < 0:
        return [], None
    body = text[at + len("[TOOL_CALLS]"):].strip()
    if len(body) > MAX_CALL_CHARS * 4:
        return [], f"tool calls of {len(body)} characters; at most {MAX_CALL_CHARS * 4}"
    value, why = _loads(body)
    if why is not None:
        return [], f"tool calls: {why}"
    return (value if isinstance(value, list) else [value]), None


def _loads(body: str) -> tuple[Any, str | None]:
    """JSON of bounded size and depth, or why not."""
    if len(body) > MAX_CALL_CHARS:
        return None, f"{len(body)} characters of JSON; at most {MAX_CALL_CHARS}"
    if _depth(body) > MAX_DEPTH:
        return None, f"JSON nested deeper than {MAX_DEPTH} levels"
    try:
        return json.loads(body), None
    except json.JSONDecodeError as exc:
        return None, f"not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})"
    except (ValueError, RecursionError) as exc:
        return None, f"not valid JSON ({type(exc).__name__})"


def _depth(body: str) -> int:
    """The JSON's nesting (brackets outside strings): a bomb is refused before the parser
    recurses into it, while code in a string argument may hold any brackets."""
    deepest = level = 0
    in_string = escaped = False
    for ch in body:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            level += 1
            deepest = max(deepest, level)
        elif ch in "]}":
            level -= 1
    return deepest


def _read_call(block: Any, call_id: str) -> tuple[ToolCall | None, str | None]:
    """One call from its JSON text (or its parsed value, Mistral's), or why it is not one."""
    if isinstance(block, str):
        body = block.strip()
        if not body:
            return None, "empty <tool_call> block; write {\"name\": ..., \"arguments\": {...}}"
        value, why = _loads(body)
        if why is not None:
            if isinstance(block, _Unclosed):
                why += "; the <tool_call> block was not closed with </tool_call>"
            return None, why
    else:
        value = block
    if not isinstance(value, dict):
        return None, f"expected a JSON object with name and arguments, got {_kind(value)}"
    name = value.get("name")
    if name is None and isinstance(value.get("function"), dict):  # OpenAI's {"function": {...}}
        value = value["function"]
        name = value.get("name")
    if name is None:
        return None, "no \"name\" given"
    if not isinstance(name, str) or not name.strip():
        return None, f"\"name\" must be a non-empty string, got {_kind(name)}"
    name = name.strip()
    if len(name) > MAX_NAME_CHARS or not _NAME.match(name):
        return None, f"{name[:MAX_NAME_CHARS]!r} is not a tool name"
    arguments = value.get("arguments", value.get("parameters", {}))
    if isinstance(arguments, str):
        if not arguments.strip():
            arguments = {}
        else:
            arguments, why = _loads(arguments)
            if why is not None:
                return None, f"\"arguments\" of {name} is a string that is {why}"
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        return None, f"\"arguments\" of {name} must be a JSON object, got {_kind(arguments)}"
    return ToolCall(id=call_id, name=name, arguments=arguments), None


def _kind(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", int: "a number",
            float: "a number", type(None): "null"}.get(type(value), type(value).__name__)
