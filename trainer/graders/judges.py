"""LLM judges (`score_model`, `label_model`) against operator-configured chat endpoints.

A tenant never gives a URL: the grader's `model` names a judge that the operator configured
in `BRORL_JUDGES`, a JSON object `{"name": {"base_url": ..., "model": ..., "api_key_env":
..., "timeout_s": ...}}` of OpenAI-compatible endpoints (vLLM's server, a hosted API). So no
tenant can make the service fetch an address of its choosing (server-side request forgery).
The judge is asked for JSON through `response_format` (a JSON schema: `{"result": number}`
within `range` for score_model, `{"result": one of labels}` for label_model), which servers
with guided
decoding (vLLM) enforce; an answer that still does not parse scores 0 with its error, and
a number out of range is clipped to it.
"""
from __future__ import annotations

import json
import math
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable

from trainer.graders.settings import grader_settings

JUDGES_ENV = "BRORL_JUDGES"
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
                            else None, timeout_s=float(cfg.get("timeout_s", 60.0)))
                for name, cfg in table.items()}
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise JudgeError(f"{JUDGES_ENV} is not a JSON object of "
                         f'{{"name": {{"base_url": ..., "model": ...}}}}: {exc}') from None


def get_judge(name: str) -> Judge:
    judges = configured_judges()
    if name not in judges:
        known = ", ".join(sorted(judges)) or "none"
        raise JudgeError(f"no judge named {name!r} is configured on this server "
                         f"(configured: {known})")
    return judges[name]


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
    if sampling.get("max_completions_tokens") is not None:
        body["max_tokens"] = sampling["max_completions_tokens"]
    return body


def ask(judge: Judge, messages: list[dict], sampling: dict, labels: list[str] | None,
        bounds: tuple[float, float] | None = None) -> tuple[Any, str | None, str | None]:
    """(result, error flag, details): the judge's `result`, or why there is none."""
    import httpx

    headers = {"Authorization": f"Bearer {judge.api_key}"} if judge.api_key else {}
    try:
        response = httpx.post(f"{judge.base_url}/chat/completions", headers=headers,
                              json=_body(judge, messages, sampling, labels, bounds),
                              timeout=judge.timeout_s)
    except httpx.TimeoutException:
        return None, "unresponsive_reward_error", f"judge {judge.name} timed out"
    except httpx.HTTPError as exc:
        return None, "other_error", f"judge {judge.name} unreachable: {type(exc).__name__}"
    if response.status_code != 200:
        return None, "other_error", (f"judge {judge.name} answered {response.status_code}: "
                                     f"{response.text[:300]}")
    try:
        content = response.json()["choices"][0]["message"]["content"]
        result = json.loads(content)["result"]
    except (ValueError, KeyError, IndexError, TypeError):
        return None, "sample_parse_error", f"judge {judge.name} gave no JSON result"
    return result, None, None


def score_of(result: Any, low: float, high: float) -> float | None:
    """A score_model result as a reward in [low, high]; None if it is not a number."""
    if isinstance(result, bool) or not isinstance(result, (int, float)):
        return None
    value = float(result)
    return None if not math.isfinite(value) else min(high, max(low, value))


def ask_all(calls: list[Callable[[], tuple]]) -> list[tuple]:
    """Run judge calls concurrently (I/O bound), in order."""
    if not calls:
        return []
    with ThreadPoolExecutor(min(MAX_PARALLEL, len(calls))) as pool:
        return list(pool.map(lambda call: call(), calls))
