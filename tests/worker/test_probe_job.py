"""A claimed probe through `worker.runner.run_job` with `trainer.probe.probe` replaced by a
double: progress events, the result and `succeeded` written together, a cancel between
chunks, a fenced attempt that writes nothing and an error that fails the probe with a user
message. (A real probe of builtin:tiny: tests/e2e/test_probe_stack.py; a retry after a killed
worker: tests/faults/test_probe_retry.py.)"""
from __future__ import annotations

import pytest

import trainer.probe
from store import jobs, probes
from store.db import session_scope
from store.tables import Job, JobEvent, JobKind, JobStatus
from trainer.probe_spec import ProbeSpec
from trainer.stop import StopRequested
from worker import runner

pytestmark = pytest.mark.timeout(60)

TASK = {"reasoning_gym": {"name": "chain_sum", "train_size": 10, "eval_size": 4}}
RESULT = {"samples": 8, "per_prompt": [[1, 4], [0, 4]]}


@pytest.fixture
def probe_id(tenant_id) -> str:
    spec = ProbeSpec.model_validate({"task": TASK, "n": 4, "prompts": 2, "engine": "hf"})
    with session_scope() as s:
        row, _ = probes.create_probe(s, tenant_id, spec)
        assert row.kind == JobKind.probe
        return row.id


def _job(job_id: str) -> Job:
    with session_scope() as s:
        return s.get(Job, job_id)


def _events(job_id: str) -> list[str]:
    with session_scope() as s:
        return [e.type.value for e in s.query(JobEvent).filter_by(job_id=job_id).order_by(JobEvent.id)]


def _double(monkeypatch, body, names: list | None = None) -> list:
    calls: list = []

    def probe(spec, base, should_stop, *, model_dir=None, dataset_path=None, on_progress=None, name=None):
        calls.append((spec.n, base.task.reasoning_gym.name, model_dir, dataset_path))
        if names is not None:
            names.append(name)
        return body(should_stop, on_progress)

    monkeypatch.setattr(trainer.probe, "probe", probe)
    return calls


def test_a_probe_records_progress_then_its_result_and_succeeds(probe_id, monkeypatch):
    def body(should_stop, on_progress):
        for done in (4, 8):
            assert not should_stop()
            on_progress({"samples_done": done, "samples_total": 8})
        return RESULT

    names: list = []
    calls = _double(monkeypatch, body, names)
    assert runner.run_job(probe_id) == "succeeded"
    job = _job(probe_id)
    assert calls == [(4, "chain_sum", None, None)]
    assert names == [f"{probe_id}-attempt-1"]  # what a task.env's sandboxes are tagged with
    assert (job.status, job.result, job.step, job.lease_owner) == (JobStatus.succeeded, RESULT, 8, None)
    assert _events(probe_id).count("progress") == 2 and _events(probe_id)[-1] == "succeeded"
    assert runner.run_job(probe_id) is None  # a duplicate message finds nothing to claim


def test_a_cancel_between_chunks_cancels_the_probe_without_a_result(probe_id, tenant_id, monkeypatch):
    def body(should_stop, on_progress):
        on_progress({"samples_done": 4, "samples_total": 8})
        with session_scope() as s:
            jobs.request_cancel(s, tenant_id, probe_id, kind=JobKind.probe)
        on_progress({"samples_done": 8, "samples_total": 8})  # the store answers: cancel asked
        if should_stop():
            raise StopRequested()
        return RESULT

    _double(monkeypatch, body)
    assert runner.run_job(probe_id) == "cancelled"
    job = _job(probe_id)
    assert job.status == JobStatus.cancelled and job.result is None


def test_a_fenced_probe_writes_no_result(probe_id, monkeypatch):
    def body(should_stop, on_progress):
        with session_scope() as s:  # the reaper hands the probe on meanwhile
            s.query(Job).filter_by(id=probe_id).update({"attempt": Job.attempt + 1})
        on_progress({"samples_done": 4, "samples_total": 8})
        return RESULT

    _double(monkeypatch, body)
    assert runner.run_job(probe_id) is None
    job = _job(probe_id)
    assert job.status == JobStatus.running and job.result is None and "succeeded" not in _events(probe_id)


def test_a_probe_error_fails_it_with_a_user_message(probe_id, monkeypatch):
    def body(should_stop, on_progress):
        raise RuntimeError("engine fell over at /srv/models/secret")

    _double(monkeypatch, body)
    assert runner.run_job(probe_id) == "failed"
    job = _job(probe_id)
    assert job.status == JobStatus.failed and job.error == "RuntimeError: engine fell over at <path>"
