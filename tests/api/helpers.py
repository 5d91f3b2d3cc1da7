"""Helpers shared by the API tests: a small valid spec, the error-shape assertion, SSE parsing,
the upload limit the test app is built with."""

from __future__ import annotations

import json
from typing import Any

UPLOAD_LIMIT = 64 * 1024  # the app's max_upload_bytes in these tests (conftest.settings)


def make_spec(**overrides: Any) -> dict[str, Any]:
    """A small valid spec; keyword arguments replace top-level sections."""
    spec: dict[str, Any] = {
        "name": "chain-sum-test",
        "model": {"path": "builtin:tiny"},
        "task": {"reasoning_gym": {"name": "chain_sum", "train_size": 100, "eval_size": 10}},
        "rollout": {"engine": "hf", "schedule": [{"n": 4, "prompts_per_step": 2, "steps": 3},
                                                 {"n": 8, "prompts_per_step": 1, "steps": 2}]},
    }
    spec.update(overrides)
    return spec


def assert_error(resp, status: int, type_: str | None = None,
                 field: str | None = None) -> dict[str, Any]:
    """The response is `status` in the one error shape; returns the `error` object."""
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert set(body) >= {"error"}, body
    err = body["error"]
    assert isinstance(err["type"], str) and isinstance(err["message"], str) and err["message"]
    assert set(err) <= {"type", "message", "field"}, err
    if type_ is not None:
        assert err["type"] == type_, err
    if field is not None:
        assert err.get("field") == field, err
    return err


def parse_sse(text: str) -> list[dict[str, Any]]:
    """Events of a text/event-stream body as dicts with event, id and (JSON-decoded) data."""
    events = []
    for block in text.replace("\r\n", "\n").split("\n\n"):
        event: dict[str, Any] = {}
        data_lines = []
        for line in block.split("\n"):
            if not line or line.startswith(":"):
                continue  # blank, or a comment (pings)
            name, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if name == "data":
                data_lines.append(value)
            elif name in ("event", "id"):
                event[name] = value
        if data_lines:
            event["data"] = json.loads("\n".join(data_lines))
        if event:
            events.append(event)
    return events
