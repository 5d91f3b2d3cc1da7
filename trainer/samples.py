"""A step's rollouts kept for people to read: the highest- and lowest-reward ones, decoded.

Reward hacking shows in the text long before it shows in a curve, so every step stores a few
completions (`samples.per_step`) from its first generation round, before dynamic sampling
drops the groups whose rewards are all equal: those (all correct, all wrong) are often the
most telling. The advantage is the one the estimator gives over that round (0 for a group
whose rewards are all equal).

A multi-turn sample (`task.env`) also carries its transcript, `messages` ({role, content,
tool_calls?, tool_call_id?, name?}, each text cut to `max_chars`), and its `turns`,
`tool_calls` and `tool_errors`; `env_error` when the environment itself broke the episode.
"""
from __future__ import annotations

import json
from typing import Any

import torch

from trainer.rollouts import Rollouts


def pick_indices(rewards: torch.Tensor, k: int) -> list[int]:
    """`k` distinct samples: the ceil(k/2) highest rewards, then the floor(k/2) lowest
    (ties broken by position, so the pick is deterministic)."""
    if k <= 0 or len(rewards) == 0:
        return []
    order = torch.argsort(rewards, descending=True, stable=True).tolist()
    high = order[: (k + 1) // 2]
    taken = set(high)
    low = [i for i in reversed(order) if i not in taken][: k // 2]
    return high + low


def step_samples(rollouts: Rollouts, advantages: torch.Tensor, tokenizer: Any, per_step: int,
                 max_chars: int) -> list[dict[str, Any]]:
    """The rows to store for one step (see the module docstring)."""
    rows = []
    for i in pick_indices(rollouts.rewards, per_step):
        prompt = tokenizer.decode(rollouts.prompt_ids[i], skip_special_tokens=True)
        completion = tokenizer.decode(rollouts.response_ids[i], skip_special_tokens=True)
        rows.append({
            "prompt": prompt[:max_chars], "completion": completion[:max_chars],
            "reward": float(rollouts.rewards[i]), "correct": bool(rollouts.correct[i]),
            "truncated": bool(rollouts.truncated[i]), "advantage": float(advantages[i]),
            "sub_rewards": {k[len("reward/"):]: float(v[i]) for k, v in rollouts.extras.items()
                            if k.startswith("reward/")},
        })
        episode = rollouts.episodes[i] if rollouts.episodes is not None else None
        if episode is not None:
            rows[-1].update(episode_fields(episode, max_chars))
    return rows


def episode_fields(episode: dict[str, Any], max_chars: int) -> dict[str, Any]:
    """A multi-turn sample's transcript and counts, each text cut to `max_chars`."""
    out = {"messages": [_message(m, max_chars) for m in episode.get("messages") or []],
           "turns": int(episode.get("turns") or 0), "tool_calls": int(episode.get("tool_calls") or 0),
           "tool_errors": int(episode.get("tool_errors") or 0)}
    error = (episode.get("info") or {}).get("error")
    if error:
        out["env_error"] = str(error)[:max_chars]
    return out


def _message(msg: dict[str, Any], max_chars: int) -> dict[str, Any]:
    content = msg.get("content")
    out: dict[str, Any] = {"role": str(msg.get("role") or ""),
                           "content": (content if isinstance(content, str) else json.dumps(content, default=str))[:max_chars]}
    for key in ("tool_call_id", "name"):
        if msg.get(key) is not None:
            out[key] = str(msg[key])[:200]
    if msg.get("tool_calls"):
        out["tool_calls"] = [_call(c, max_chars) for c in msg["tool_calls"]]
    return out


def _call(call: Any, max_chars: int) -> dict[str, Any]:
    """A tool call in OpenAI's shape, its arguments as JSON text cut to `max_chars`."""
    fn = call.get("function", {}) if isinstance(call, dict) else {}
    args = fn.get("arguments")
    text = args if isinstance(args, str) else json.dumps(args if args is not None else {}, default=str)
    return {"id": str(call.get("id", ""))[:200] if isinstance(call, dict) else "", "type": "function",
            "function": {"name": str(fn.get("name", ""))[:200], "arguments": text[:max_chars]}}
