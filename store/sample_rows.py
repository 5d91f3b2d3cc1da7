"""What one stored sample row holds, made safe to store: text PostgreSQL accepts, a multi-turn
transcript in one shape with bounded size, and the bytes it counts against the job's cap.

The trainer already cuts each text to `samples.max_chars`, but everything in a sample is
written by the model or by the tenant's environment (tool output, an OpenEnv server's
observations), so the store does not rely on it: a transcript keeps at most
`MAX_MESSAGES` messages and `MAX_TRANSCRIPT_CHARS` characters of text, each text at most
`MAX_TEXT_CHARS`; what does not fit is dropped from the end and counted (`messages_dropped`).
"""

from __future__ import annotations

import json
import math
from typing import Any

MAX_TEXT_CHARS = 20_000          # the spec's largest `samples.max_chars`
MAX_TRANSCRIPT_CHARS = 200_000   # all the texts of one transcript together
MAX_MESSAGES = 512               # 64 turns, each with a few tool calls and their results
MAX_TOOL_CALLS = 32              # tool calls kept per message
MAX_LABEL_CHARS = 200            # role, name, tool-call id, tool name
COUNTS = ("turns", "tool_calls", "tool_errors")


def clean(text: str) -> str:
    """Text PostgreSQL can store: no NUL (a model may well write one) and no lone surrogate
    (JSON from an environment server may carry one; UTF-8 cannot encode it)."""
    return text.replace("\x00", "\ufffd").encode("utf-8", "replace").decode("utf-8")


def _text(value: Any, limit: int) -> str:
    if value is None:
        return ""
    if isinstance(value, list):   # content parts [{"type": "text", "text": ...}, ...]
        value = "".join(p.get("text", "") if isinstance(p, dict) and isinstance(p.get("text"), str)
                        else "" for p in value)
    elif not isinstance(value, str):
        value = json.dumps(value, ensure_ascii=False, default=str)
    return clean(value[:limit])


def _tool_call(call: Any, budget: int) -> dict[str, Any] | None:
    """One tool call in OpenAI's shape ({id, type, function: {name, arguments}}), arguments
    as a JSON string; also takes the flat {id, name, arguments}."""
    if not isinstance(call, dict):
        return None
    fn = call.get("function") if isinstance(call.get("function"), dict) else call
    args = fn.get("arguments")
    arguments = args if isinstance(args, str) else json.dumps(args if args is not None else {},
                                                               ensure_ascii=False, default=str)
    return {"id": _text(call.get("id"), MAX_LABEL_CHARS), "type": "function",
            "function": {"name": _text(fn.get("name"), MAX_LABEL_CHARS),
                         "arguments": clean(arguments[:max(0, min(budget, MAX_TEXT_CHARS))])}}


def _message(msg: Any, budget: int) -> dict[str, Any]:
    if not isinstance(msg, dict):
        msg = {"role": "unknown", "content": msg}
    out: dict[str, Any] = {"role": _text(msg.get("role") or "unknown", MAX_LABEL_CHARS),
                           "content": _text(msg.get("content"), min(budget, MAX_TEXT_CHARS))}
    calls = msg.get("tool_calls")
    if isinstance(calls, list) and calls:
        kept = []
        for call in calls[:MAX_TOOL_CALLS]:
            one = _tool_call(call, budget - _chars(out) - sum(_chars(c) for c in kept))
            if one is not None:
                kept.append(one)
        if kept:
            out["tool_calls"] = kept
    for key in ("tool_call_id", "name"):
        if msg.get(key) is not None:
            out[key] = _text(msg[key], MAX_LABEL_CHARS)
    if msg.get("error") is True:   # a tool result that reports a failed call
        out["error"] = True
    return out


def _chars(value: Any) -> int:
    """The characters of text a message (or tool call) holds."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, dict):
        return sum(_chars(v) for v in value.values())
    if isinstance(value, list):
        return sum(_chars(v) for v in value)
    return 0


def transcript(messages: Any) -> tuple[list[dict[str, Any]] | None, int]:
    """The messages to store and how many were dropped past the caps (None: not a list)."""
    if not isinstance(messages, list):
        return None, 0
    kept: list[dict[str, Any]] = []
    used = 0
    for msg in messages[:MAX_MESSAGES]:
        room = MAX_TRANSCRIPT_CHARS - used
        if room <= 0:
            break
        one = _message(msg, room)
        kept.append(one)
        used += _chars(one)
    return kept, len(messages) - len(kept)


def _count(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return max(0, min(int(value), 2**31 - 1))


def env_counts(row: dict[str, Any], dropped: int) -> dict[str, Any] | None:
    """The episode's counts ({"turns", "tool_calls", "tool_errors"}, `messages_dropped` when
    the transcript was cut) and `error`, what broke the environment when it broke; None for a
    single-turn sample."""
    counts: dict[str, Any] = {k: c for k in COUNTS if (c := _count(row.get(k))) is not None}
    if dropped:
        counts["messages_dropped"] = dropped
    if row.get("env_error"):
        counts["error"] = _text(row["env_error"], MAX_TEXT_CHARS)
    return counts or None


def stored_fields(row: dict[str, Any]) -> dict[str, Any]:
    """The text columns of one trainer row (`trainer.samples.step_samples`), cleaned and
    capped, with `bytes`: what the row counts against the job's cap."""
    prompt, completion = clean(row["prompt"]), clean(row["completion"])
    messages, dropped = transcript(row.get("messages"))
    nbytes = len(prompt.encode()) + len(completion.encode())
    if messages is not None:
        nbytes += len(json.dumps(messages, ensure_ascii=False).encode())
    return {"prompt": prompt, "completion": completion, "messages": messages,
            "env": env_counts(row, dropped), "bytes": nbytes}
