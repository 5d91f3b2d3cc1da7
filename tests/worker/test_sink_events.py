"""The worker's database sink and the event vocabulary: a known type is stored as sent, an
unknown one raises before anything is buffered (it was dropped with a log line before)."""
from __future__ import annotations

import pytest

from store import jobs
from store.db import session_scope
from store.tables import Job, JobEvent
from trainer.events import EventType, Phase, PhaseProgress, UnknownEventType


def _events(job_id: str) -> list[tuple[str, dict]]:
    with session_scope() as s:
        rows = s.query(JobEvent).filter_by(job_id=job_id).order_by(JobEvent.id).all()
        return [(e.type.value, e.data) for e in rows]


def test_an_unknown_event_type_raises_and_stores_nothing(new_job):
    from worker.sink import DbSink

    job_id = new_job()
    with session_scope() as s:
        attempt = jobs.claim(s, job_id, "w", lease_seconds=60).attempt
    sink = DbSink(job_id, attempt)
    before = _events(job_id)
    with pytest.raises(UnknownEventType, match="ranks_started"):
        sink.event("ranks_started", {"launcher": "x"})
    sink.flush()
    assert _events(job_id) == before


def test_a_phase_s_progress_is_stored_and_leaves_the_step_alone(new_job):
    from worker.sink import DbSink

    job_id = new_job()
    with session_scope() as s:
        attempt = jobs.claim(s, job_id, "w", lease_seconds=60).attempt
    sink = DbSink(job_id, attempt)
    with PhaseProgress(sink).phase(Phase.model_load, "loading builtin:tiny", total=2) as report:
        report(1, 2, "loading the weights")  # within a second of the start: not written
    sink.event(EventType.eval, {"step": 0, "eval/pass@1": 0.5})
    progress = [d for t, d in _events(job_id) if t == "progress"]
    assert [(d["phase"], d["done"], d["finished"]) for d in progress] == [("model_load", 0, False),
                                                                         ("model_load", 2, True)]
    assert progress[-1]["message"] == "loading the weights" and _events(job_id)[-1][0] == "eval"
    with session_scope() as s:
        job = s.get(Job, job_id)
        assert (job.step, job.total_steps) == (0, 3)  # a probe's progress moves them; a phase's does not
