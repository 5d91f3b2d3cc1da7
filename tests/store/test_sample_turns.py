"""A multi-turn sample's transcript and counts: stored and read back on SQLite and PostgreSQL,
null for single-turn rows, hostile text made storable, sizes capped and counted against the
job's byte cap."""
from __future__ import annotations

import json

from sqlalchemy import text
from sqlalchemy.orm import Session

from store import jobs, sample_rows
from store.tables import Tenant
from tests.store.helpers import make_job


def _row(reward: float = 1.0, **extra) -> dict:
    return {"prompt": "p", "completion": "c", "reward": reward, "correct": reward > 0.5,
            "truncated": False, "advantage": 0.0, "sub_rewards": {}, **extra}


TRANSCRIPT = [
    {"role": "system", "content": "You have a calculator."},
    {"role": "user", "content": "What is 123456 + 654321?"},
    {"role": "assistant", "content": "<tool_call>...</tool_call>",
     "tool_calls": [{"id": "call_0", "type": "function",
                     "function": {"name": "add", "arguments": {"a": 123456, "b": 654321}}}]},
    {"role": "tool", "tool_call_id": "call_0", "name": "add", "content": "777777"},
    {"role": "assistant", "content": "bad", "tool_calls": [{"id": "call_1", "name": "nope",
                                                            "arguments": "{not json"}]},
    {"role": "tool", "tool_call_id": "call_1", "name": "nope", "content": "error: unknown tool 'nope'",
     "error": True},
    {"role": "assistant", "content": "The answer is 777777."},
]


def _claimed(session: Session, tenant: Tenant):
    job = make_job(session, tenant)
    claim = jobs.claim(session, job.id, "w1", 60)
    session.commit()
    return job, claim.attempt


def test_a_transcript_round_trips_and_single_turn_rows_stay_null(session: Session, tenant: Tenant) -> None:
    job, attempt = _claimed(session, tenant)
    multi = _row(messages=TRANSCRIPT, turns=3, tool_calls=2, tool_errors=1)
    assert jobs.record_samples(session, job.id, attempt, 1, [multi, _row(0.0)], 10**6) == 2
    session.commit()
    session.expire_all()
    first, single = jobs.list_samples(session, tenant.id, job.id)
    assert first.env == {"turns": 3, "tool_calls": 2, "tool_errors": 1}
    assert [m["role"] for m in first.messages] == ["system", "user", "assistant", "tool", "assistant",
                                                   "tool", "assistant"]
    # Tool calls come back in OpenAI's shape, arguments as the JSON string (or the raw text).
    assert first.messages[2]["tool_calls"] == [
        {"id": "call_0", "type": "function", "function": {"name": "add", "arguments": '{"a": 123456, "b": 654321}'}}]
    assert first.messages[4]["tool_calls"][0]["function"] == {"name": "nope", "arguments": "{not json"}
    assert first.messages[3] == {"role": "tool", "content": "777777", "tool_call_id": "call_0", "name": "add"}
    assert first.messages[5]["error"] is True and "error" not in first.messages[3]
    assert single.messages is None and single.env is None
    broken = _row(0.0, messages=TRANSCRIPT[:2], turns=0, tool_calls=0, tool_errors=0,
                  env_error="RuntimeError: boom\x00" + "x" * 30_000)
    jobs.record_samples(session, job.id, attempt, 2, [broken], 10**6)
    session.commit()
    (row,) = jobs.list_samples(session, tenant.id, job.id, step=2)
    assert row.env["error"].startswith("RuntimeError: boom\ufffdx") and len(row.env["error"]) == 20_000
    assert first.bytes == 2 + len(json.dumps(first.messages, ensure_ascii=False).encode())


def test_rows_stored_before_the_migration_read_as_single_turn(session: Session, tenant: Tenant) -> None:
    """A row written without the new columns (as every row before 0008) reads back with null."""
    job, _ = _claimed(session, tenant)
    session.execute(text(
        "INSERT INTO job_samples (job_id, step, idx, prompt, completion, reward, correct, truncated, "
        "advantage, sub_rewards, bytes, created_at) VALUES (:j, 1, 0, 'p', 'c', 1.0, true, false, 0.0, "
        "'{}', 2, CURRENT_TIMESTAMP)"), {"j": job.id})
    session.commit()
    (row,) = jobs.list_samples(session, tenant.id, job.id)
    assert row.messages is None and row.env is None and row.completion == "c"


def test_hostile_text_in_a_transcript_is_stored_as_text(session: Session, tenant: Tenant) -> None:
    """NUL and lone surrogates (JSON from an environment server may carry one) are refused by
    PostgreSQL's jsonb and by UTF-8; they are replaced, never a failed write."""
    job, attempt = _claimed(session, tenant)
    nasty = [{"role": "tool", "content": "a\x00b\ud800c<script>alert(1)</script>", "name": "x\x00"},
             {"role": "assistant", "content": [{"type": "text", "text": "part one "}, {"type": "image"},
                                               {"type": "text", "text": "part two"}]},
             {"role": None, "content": None},
             "not a message",
             {"role": "assistant", "content": "", "tool_calls": ["junk", {"function": {"name": "f"}}]}]
    multi = _row(messages=nasty, turns=True, tool_calls=float("nan"), tool_errors=-3)
    assert jobs.record_samples(session, job.id, attempt, 1, [multi], 10**6) == 1
    session.commit()
    session.expire_all()
    (row,) = jobs.list_samples(session, tenant.id, job.id)
    assert row.messages[0] == {"role": "tool", "content": "a\ufffdb?c<script>alert(1)</script>", "name": "x\ufffd"}
    assert row.messages[1]["content"] == "part one part two"
    assert row.messages[2] == {"role": "unknown", "content": ""}
    assert row.messages[3] == {"role": "unknown", "content": "not a message"}
    assert row.messages[4]["tool_calls"] == [{"id": "", "type": "function",
                                             "function": {"name": "f", "arguments": "{}"}}]
    assert row.env == {"tool_errors": 0}  # a bool or NaN is no count; a negative one is 0


def test_a_huge_transcript_is_capped_and_counts_against_the_jobs_bytes(session: Session, tenant: Tenant) -> None:
    job, attempt = _claimed(session, tenant)
    turn = {"role": "tool", "content": "y" * 50_000}
    many = [turn] * 20 + [{"role": "user", "content": "z"}] * 2000
    multi = _row(messages=many, turns=64, tool_calls=20, tool_errors=0)
    assert jobs.record_samples(session, job.id, attempt, 1, [multi], 10**7) == 1
    session.commit()
    session.expire_all()
    (row,) = jobs.list_samples(session, tenant.id, job.id)
    assert all(len(m["content"]) <= sample_rows.MAX_TEXT_CHARS for m in row.messages)
    # The cap counts every text (roles and names too), so the contents fill it up to those.
    assert sample_rows.MAX_TRANSCRIPT_CHARS - 100 < sum(len(m["content"]) for m in row.messages) \
        <= sample_rows.MAX_TRANSCRIPT_CHARS
    assert row.env["messages_dropped"] == len(many) - len(row.messages) > 0
    assert row.bytes > sample_rows.MAX_TRANSCRIPT_CHARS
    # The next step's transcript does not fit in what is left of a 300 kB cap: not stored.
    assert jobs.record_samples(session, job.id, attempt, 2, [multi], 300_000) == 0


def test_a_long_list_of_short_messages_stops_at_the_message_cap() -> None:
    kept, dropped = sample_rows.transcript([{"role": "user", "content": "hi"}] * 5000)
    assert len(kept) == sample_rows.MAX_MESSAGES and dropped == 5000 - sample_rows.MAX_MESSAGES
    assert sample_rows.transcript("not a list") == (None, 0)
