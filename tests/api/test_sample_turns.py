"""GET /v1/jobs/{id}/samples for a multi-turn job: the transcript turn by turn and the
episode's counts; single-turn samples give null for all of them."""

from __future__ import annotations

from store import jobs as store_jobs
from store.db import session_scope

from tests.api.helpers import make_spec


def _row(**extra) -> dict:
    return {"prompt": "Q: 123456 + 654321", "completion": "777777", "reward": 1.0, "correct": True,
            "truncated": False, "advantage": 0.5, "sub_rewards": {}, **extra}


def test_a_transcript_and_its_counts_come_back_in_openais_shape(client, auth, database_url):
    job_id = client.post("/v1/jobs", json=make_spec(), headers=auth).json()["id"]
    messages = [
        {"role": "user", "content": "Q: 123456 + 654321"},
        {"role": "assistant", "content": "<tool_call>",
         "tool_calls": [{"id": "c0", "type": "function",
                         "function": {"name": "add", "arguments": {"a": 123456, "b": 654321}}}]},
        {"role": "tool", "tool_call_id": "c0", "name": "add", "content": "777777"},
        {"role": "tool", "tool_call_id": "c1", "name": "sub", "content": "ZeroDivisionError", "error": True},
        {"role": "assistant", "content": "777777"},
    ]
    with session_scope(database_url) as s:
        attempt = store_jobs.claim(s, job_id, "test-worker", lease_seconds=60).attempt
    with session_scope(database_url) as s:
        store_jobs.record_samples(s, job_id, attempt, 1, [
            _row(messages=messages, turns=2, tool_calls=2, tool_errors=1), _row(),
            _row(messages=messages[:1], turns=0, tool_calls=0, tool_errors=0, env_error="OSError: gone")], 10**6)
    page = client.get(f"/v1/jobs/{job_id}/samples?step=1", headers=auth).json()
    multi, single, broken = page["data"]
    assert (multi["turns"], multi["tool_calls"], multi["tool_errors"], multi["messages_dropped"]) == (2, 2, 1, None)
    assert multi["env_error"] is None and broken["env_error"] == "OSError: gone"
    assert [m["role"] for m in multi["messages"]] == ["user", "assistant", "tool", "tool", "assistant"]
    assert multi["messages"][1]["tool_calls"] == [
        {"id": "c0", "type": "function", "function": {"name": "add", "arguments": '{"a": 123456, "b": 654321}'}}]
    assert multi["messages"][2] == {"role": "tool", "content": "777777", "tool_calls": None,
                                    "tool_call_id": "c0", "name": "add", "error": None}
    assert multi["messages"][3]["error"] is True
    assert (single["messages"], single["turns"], single["tool_calls"], single["tool_errors"],
            single["env_error"]) == (None,) * 5
    # The response schema documents the new fields.
    schema = client.get("/openapi.json").json()["components"]["schemas"]
    assert {"messages", "turns", "tool_calls", "tool_errors"} <= set(schema["SamplePublic"]["properties"])
    assert "tool_call_id" in schema["SampleMessage"]["properties"]
