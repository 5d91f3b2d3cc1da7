"""LLM judges (`score_model`, `label_model`) against operator-configured chat endpoints.

A tenant never gives a URL: the grader's `model` names a judge that the operator configured
in `BRORL_JUDGES`, a JSON object `{"name": {"base_url": ..., "model": ..., "api_key_env":
..., "timeout_s": ..., "max_tokens": ...}}` of OpenAI-compatible endpoints (vLLM's server, a hosted API). So no
tenant can make the service fetch an address of its choosing (server-side request forgery).
`BRORL_JUDGE_ALIASES`, `{"gpt-4o-2024-08-06": "name", ...}`, lets graders written for OpenAI
name a configured judge by OpenAI's model ids, unchanged; an id mapped nowhere is refused.
The judge is asked for JSON through `response_format` (a JSON schema: `{"result": number}`
within `range` for score_model, `{"result": one of labels}` for label_model), which servers
with guided decoding (vLLM) enforce. An answer in OpenAI's judges' own shape, `{"result":
..., "steps": [{"description", "conclusion"}]}`, parses too, also inside a ```json fence.
The error flags are OpenAI's: no answer is `model_grader_server_error` (with its details), a
refusal `model_grader_refusal_error`, an answer without a result `model_grader_parse_error`,
a timeout `unresponsive_reward_error`; a number out of range is clipped to it. The judge's
token usage (OpenAI's `usage`) comes back with every answer.
"""
from __future__ import annotations

import json
import math
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable

from trainer.graders.settings import grader_settings

JUDGES_ENV = "BRORL_JUDGES"
ALIASES_ENV = "BRORL_JUDGE_ALIASES"
MAX_PARALLEL = 8


class JudgeError(ValueError):
    """A judge name that is not configured, or a bad BRORL_JUDGES value."""


@dataclass(frozen=True)
class Judge:
    name: str
    base_url: str
    model: str
    api_key: str | None = None
    timeout_s: float = 60.0
    # The operator's cap on an answer's tokens: a grader may ask more (OpenAI's examples ask
    # 32768, past many servers' context), it gets at most this.
    max_tokens: int | None = None


def configured_judges() -> dict[str, Judge]:
    """The operator's judges from BRORL_JUDGES (empty when unset)."""
    raw = grader_settings().judges.strip()
    if not raw:
        return {}
    try:
        table = json.loads(raw)
        return {name: Judge(name=name, base_url=str(cfg["base_url"]).rstrip("/"),
                            model=str(cfg.get("model", name)),
                            api_key=os.environ.get(cfg["api_key_env"]) if cfg.get("api_key_env")
                            else None, timeout_s=float(cfg.get("timeout_s", 60.0)),
                            max_tokens=int(cfg["max_tokens"]) if cfg.get("max_tokens") else None)
                for name, cfg in table.items()}
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise JudgeError(f"{JUDGES_ENV} is not a JSON object of "
                         f'{{"name": {{"base_url": ..., "model": ...}}}}: {exc}') from None


def judge_aliases() -> dict[str, str]:
    """Model id -> configured judge name, from BRORL_JUDGE_ALIASES (empty when unset)."""
    raw = grader_settings().judge_aliases.strip()
    if not raw:
        return {}
    try:
        table = json.loads(raw)
        if not isinstance(table, dict) or not all(isinstance(v, str) for v in table.values()):
            raise TypeError("not an object of strings")
    except (ValueError, TypeError) as exc:
        raise JudgeError(f'{ALIASES_ENV} is not a JSON object of {{"model id": "judge name"}}: '
                         f"{exc}") from None
    return table


def get_judge(name: str) -> Judge:
    """The judge a grader's `model` names: a configured judge, or a model id mapped to one."""
    judges = configured_judges()
    if name in judges:
        return judges[name]
    aliases = judge_aliases()
    if name in aliases:
        if aliases[name] not in judges:
            raise JudgeError(f"{ALIASES_ENV} maps {name!r} to {aliases[name]!r}, which is not "
                             f"a judge in {JUDGES_ENV}")
        return judges[aliases[name]]
    known = ", ".join(sorted(judges) + sorted(aliases)) or "none"
    raise JudgeError(f"no judge named {name!r} is configured on this server "
                     f"(configured: {known})")


def _schema(labels: list[str] | None, bounds: tuple[float, float] | None) -> dict:
    if labels is not None:
        result: dict[str, Any] = {"type": "string", "enum": labels}
    else:
        result = {"type": "number"}
        if bounds is not None:  # guided decoding then keeps the number in range
            result.update(minimum=bounds[0], maximum=bounds[1])
    return {"type": "json_schema", "json_schema": {
        "name": "grade", "strict": True,
        "schema": {"type": "object", "properties": {"result": result},
                   "required": ["result"], "additionalProperties": False}}}


def _body(judge: Judge, messages: list[dict], sampling: dict, labels: list[str] | None,
          bounds: tuple[float, float] | None) -> dict:
    body: dict[str, Any] = {"model": judge.model, "messages": messages,
                            "response_format": _schema(labels, bounds)}
    for key in ("temperature", "top_p", "seed", "reasoning_effort"):
        if sampling.get(key) is not None:
            body[key] = sampling[key]
    limit = sampling.get("max_completions_tokens") or sampling.get("max_tokens")
    if judge.max_tokens is not None:
        limit = min(limit or judge.max_tokens, judge.max_tokens)
    if limit is not None:
        body["max_tokens"] = limit
    return body


@dataclass
class Reply:
    """One judge call: its `result` (None when there is none), the error flag and details
    when there is none, and the tokens it used (OpenAI's usage fields)."""

    result: Any = None
    flag: str | None = None
    details: str | None = None
    usage: dict[str, int] = field(default_factory=dict)


def _usage(raw: Any) -> dict[str, int]:
    raw = raw if isinstance(raw, dict) else {}
    cached = (raw.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    out = {key: raw.get(key) for key in ("prompt_tokens", "completion_tokens", "total_tokens")}
    out = {k: int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else 0
           for k, v in out.items()}
    out["total_tokens"] = out["total_tokens"] or out["prompt_tokens"] + out["completion_tokens"]
    out["cached_tokens"] = int(cached) if isinstance(cached, int) else 0
    return out


def parse_answer(content: Any) -> Any:
    """The `result` of a judge's JSON answer (`{"result": ..., "steps": [...]}`, also fenced
    in ```json); KeyError / ValueError when there is none."""
    if not isinstance(content, str):
        raise ValueError("no text")
    text = content.strip()
    if text.startswith("```"):
        text = text.split("\n", 1)[1] if "\n" in text else ""
        text = text.rsplit("```", 1)[0]
    try:
        answer = json.loads(text)
    except ValueError:
        start, end = text.find("{"), text.rfind("}")
        if start < 0 or end <= start:
            raise
        answer = json.loads(text[start:end + 1])
    if not isinstance(answer, dict):
        raise ValueError("not an object")
    steps = answer.get("steps", [])
    if not isinstance(steps, list):
        raise ValueError("steps is not a list")
    return answer["result"]


def ask(judge: Judge, messages: list[dict], sampling: dict, labels: list[str] | None,
        bounds: tuple[float, float] | None = None) -> Reply:
    """The judge's `result` and token usage, or the error flag saying why there is none."""
    import httpx

    headers = {"Authorization": f"Bearer {judge.api_key}"} if judge.api_key else {}
    try:
        response = httpx.post(f"{judge.base_url}/chat/completions", headers=headers,
                              json=_body(judge, messages, sampling, labels, bounds),
                              timeout=judge.timeout_s)
    except httpx.TimeoutException:
        return Reply(flag="unresponsive_reward_error", details=f"judge {judge.name} timed out")
    except httpx.HTTPError as exc:
        return Reply(flag="model_grader_server_error",
                     details=f"judge {judge.name} unreachable: {type(exc).__name__}")
    if response.status_code != 200:
        return Reply(flag="model_grader_server_error",
                     details=f"judge {judge.name} answered {response.status_code}: "
                             f"{response.text[:300]}")
    try:
        body = response.json()
        usage = _usage(body.get("usage"))
        choice = body["choices"][0]
        message = choice["message"]
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        return Reply(flag="model_grader_server_error",
                     details=f"judge {judge.name} answered something other than a chat "
                             f"completion")
    if message.get("refusal") or choice.get("finish_reason") == "content_filter":
        return Reply(flag="model_grader_refusal_error", usage=usage,
                     details=f"judge {judge.name} refused: {str(message.get('refusal'))[:300]}")
    try:
        result = parse_answer(message.get("content"))
    except (ValueError, KeyError, TypeError, RecursionError):
        cut = " (cut at max_tokens)" if choice.get("finish_reason") == "length" else ""
        return Reply(flag="model_grader_parse_error", usage=usage,
                     details=f"judge {judge.name} gave no JSON result{cut}: "
                             f"{str(message.get('content'))[:200]!r}")
    return Reply(result=result, usage=usage)


def score_of(result: Any, low: float, high: float) -> float | None:
    """A score_model result as a reward in [low, high]; None if it is not a number."""
    if isinstance(result, bool) or not isinstance(result, (int, float)):
        return None
    value = float(result)
    return None if not math.isfinite(value) else min(high, max(low, value))


def ask_all(calls: list[Callable[[], Reply]]) -> list[Reply]:
    """Run judge calls concurrently (I/O bound), in order."""
    if not calls:
        return []
    with ThreadPoolExecutor(min(MAX_PARALLEL, len(calls))) as pool:
        return list(pool.map(lambda call: call(), calls))
