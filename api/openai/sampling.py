"""The parameters of `/v1/chat/completions` and `/v1/completions`: each honoured, or refused
with a 400 that names it (`param`), as OpenAI's own API does.

Honoured: max_tokens (max_completion_tokens), temperature, top_p, n, stop, seed, stream,
stream_options.include_usage. Accepted and ignored, because they change nothing here: user,
metadata, store, service_tier, parallel_tool_calls. Refused unless left at their default:
log-probs, penalties, logit_bias, tools and functions, response formats other than text,
echo, suffix, best_of. Any other name is refused as unrecognised, so a typo is not silently
dropped.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from store.settings import Settings

from api.openai.errors import bad_request

IGNORED = {"user", "metadata", "store", "service_tier", "parallel_tool_calls"}
HONOURED = {"model", "max_tokens", "max_completion_tokens", "temperature", "top_p", "n", "stop",
            "seed", "stream", "stream_options"}
# name -> the values that mean "not asked for" (anything else is refused)
_DEFAULTS: dict[str, tuple[Any, ...]] = {
    "logprobs": (None, False, 0), "top_logprobs": (None, 0), "logit_bias": (None, {}),
    "presence_penalty": (None, 0, 0.0), "frequency_penalty": (None, 0, 0.0),
    "tools": (None, []), "tool_choice": (None, "none"), "functions": (None, []),
    "function_call": (None, "none"), "best_of": (None, 1), "echo": (None, False),
    "suffix": (None, ""), "modalities": (None, ["text"]), "audio": (None,), "prediction": (None,),
    "reasoning_effort": (None,), "web_search_options": (None,),
}
CHAT_DEFAULT_MAX_TOKENS = 256
MAX_STOPS = 4


@dataclass(frozen=True)
class Request:
    model: str
    sampling: dict[str, Any]   # what the inference server takes (trainer.serving.Sampling)
    stream: bool
    include_usage: bool


def _number(body: dict[str, Any], name: str, default: float, low: float, high: float,
            low_open: bool = False) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise bad_request(name, f"must be a number, got {value!r}")
    if value > high or value < low or (low_open and value == low):
        side = "(" if low_open else "["
        raise bad_request(name, f"must be in {side}{low:g}, {high:g}], got {value!r}")
    return float(value)


def _integer(body: dict[str, Any], name: str, default: int | None, low: int, high: int) -> int | None:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad_request(name, f"must be an integer, got {value!r}")
    if not low <= value <= high:
        raise bad_request(name, f"must be between {low} and {high} on this deployment, got {value}")
    return value


def _stop(body: dict[str, Any]) -> list[str]:
    stop = body.get("stop")
    if stop is None:
        return []
    items = [stop] if isinstance(stop, str) else stop
    if not isinstance(items, list) or not all(isinstance(s, str) and s for s in items):
        raise bad_request("stop", "must be a non-empty string or a list of them")
    if len(items) > MAX_STOPS:
        raise bad_request("stop", f"at most {MAX_STOPS} stop sequences, got {len(items)}")
    return items


def parse(body: Any, settings: Settings, chat: bool) -> Request:
    """The request's sampling parameters, checked; a 400 names the first bad one."""
    if not isinstance(body, dict):
        raise bad_request("body", "must be a JSON object")
    own = {"messages"} if chat else {"prompt"}
    for name, value in body.items():
        if name in HONOURED or name in IGNORED or name in own:
            continue
        if name not in _DEFAULTS:
            raise bad_request(name, "unrecognized request argument")
        if value not in _DEFAULTS[name]:
            raise bad_request(name, "is not supported by this service's completions "
                                    "(docs/inference.md lists what is)")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad_request("model", "is required: a job id, `<job id>:<step>` or `ft:<job id>:step-<N>`")
    cap = settings.inference_max_tokens
    default = min(CHAT_DEFAULT_MAX_TOKENS, cap) if chat else min(16, cap)
    name = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    sampling = {
        "max_tokens": _integer(body, name, default, 1, cap),
        "temperature": _number(body, "temperature", 1.0, 0, 2),
        "top_p": _number(body, "top_p", 1.0, 0, 1, low_open=True),
        "n": _integer(body, "n", 1, 1, settings.inference_max_n),
        "stop": _stop(body),
        "seed": _integer(body, "seed", None, -(2**63), 2**63 - 1),
    }
    stream = body.get("stream") or False
    if not isinstance(stream, bool):
        raise bad_request("stream", f"must be true or false, got {stream!r}")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict) or set(options) - {"include_usage", "include_obfuscation"}:
        raise bad_request("stream_options", "only include_usage is served")
    if options and not stream:
        raise bad_request("stream_options", "is only allowed with stream: true")
    return Request(model, sampling, stream, bool(options.get("include_usage")))
