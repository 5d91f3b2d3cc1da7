"""A claimed evaluation through `worker.runner.run_job` with `trainer.evaluation.evaluate_models`
replaced by a double: the models it is handed (the base, then each step's folder, looked up for
the job's tenant), progress events naming the model, the result and `succeeded` written
together, a cancel between chunks; and, without the double, a checkpoint rotated out after
submission fails the evaluation with that reason. (A real evaluation of builtin:tiny weights
through `brorl up`: tests/e2e/test_evaluation_e2e.py.)"""
from __future__ import annotations

from pathlib import Path

import pytest

import trainer.evaluation
from store import evaluations, jobs
from store.db import session_scope
from store.tables import Checkpoint, Job, JobEvent, JobKind, JobStatus
from trainer.evaluation_spec import EvaluationSpec
from trainer.spec import JobSpec
from trainer.stop import StopRequested
from worker import runner

pytestmark = pytest.mark.timeout(60)
RESULT = {"models": [], "best": None}


@pytest.fixture
def evaluated(new_job, tenant_id, tmp_path) -> tuple[str, str]:
    """(a job with checkpoints at steps 2 and 4, a queued evaluation of both and its base)."""
    job_id = new_job("evaluated")
    with session_scope() as s:
        claim = jobs.claim(s, job_id, "test-worker", lease_seconds=60)
        for step in (2, 4):
            (tmp_path / f"step-{step}").mkdir()
            jobs.record_checkpoint(s, job_id, claim.attempt, step, str(tmp_path / f"step-{step}"), 1, "0" * 64)
        jobs.finish(s, job_id, claim.attempt, "succeeded")
    with session_scope() as s:
        row, _ = evaluations.create_evaluation(s, tenant_id, job_id, EvaluationSpec(checkpoints=[4, 2], n=2))
        assert row.kind == JobKind.evaluation
        return job_id, row.id


def _job(job_id: str) -> Job:
    with session_scope() as s:
        return s.get(Job, job_id)


def _events(job_id: str) -> list[JobEvent]:
    with session_scope() as s:
        return list(s.query(JobEvent).filter_by(job_id=job_id).order_by(JobEvent.id))


def _double(monkeypatch, body, names: list | None = None) -> list:
    calls: list = []

    def evaluate_models(spec, job, models, should_stop, *, dataset_path=None, on_progress=None, name=None):
        calls.append((spec.checkpoints, job.seed, job.eval.samples_per_prompt,
                      [(m.label, m.step, m.folder) for m in models]))
        if names is not None:
            names.append(name)
        return body(should_stop, on_progress)

    monkeypatch.setattr(trainer.evaluation, "evaluate_models", evaluate_models)
    return calls


def test_an_evaluation_gets_its_models_reports_progress_and_succeeds(evaluated, tmp_path, monkeypatch):
    job_id, eval_id = evaluated

    def body(should_stop, on_progress):
        for done, model in ((4, "base"), (8, "step 4"), (12, "step 2")):
            assert not should_stop()
            on_progress({"samples_done": done, "samples_total": 12, "model": model})
        return RESULT

    names: list = []
    calls = _double(monkeypatch, body, names)
    assert runner.run_job(eval_id) == "succeeded"
    assert names == [f"{eval_id}-attempt-1"]  # what a task.env's sandboxes are tagged with
    seed = JobSpec.model_validate(_job(job_id).spec).seed  # the job's: its eval split, its model
    assert calls == [([4, 2], seed, 2, [("base", None, None), ("step 4", 4, tmp_path / "step-4"),
                                                ("step 2", 2, tmp_path / "step-2")])]
    row = _job(eval_id)
    assert (row.status, row.result, row.step, row.total_steps) == (JobStatus.succeeded, RESULT, 12, 12)
    progress = [e.data for e in _events(eval_id) if e.type.value == "progress"]
    assert [p["model"] for p in progress] == ["base", "step 4", "step 2"]
    assert runner.run_job(eval_id) is None  # a duplicate message finds nothing to claim


def test_a_cancel_between_chunks_cancels_it_without_a_result(evaluated, tenant_id, monkeypatch):
    _, eval_id = evaluated

    def body(should_stop, on_progress):
        with session_scope() as s:
            jobs.request_cancel(s, tenant_id, eval_id, kind=JobKind.evaluation)
        on_progress({"samples_done": 4, "samples_total": 12, "model": "base"})  # the store answers: cancel asked
        if should_stop():
            raise StopRequested()
        return RESULT

    _double(monkeypatch, body)
    assert runner.run_job(eval_id) == "cancelled"
    row = _job(eval_id)
    assert row.status == JobStatus.cancelled and row.result is None


def test_a_checkpoint_rotated_out_after_submission_fails_it_with_the_reason(evaluated):
    job_id, eval_id = evaluated
    with session_scope() as s:
        s.query(Checkpoint).filter_by(job_id=job_id, step=2).delete()
    assert runner.run_job(eval_id) == "failed"
    row = _job(eval_id)
    assert row.status == JobStatus.failed and row.result is None
    assert "checkpoint at step 2 is no longer stored" in row.error, row.error
    assert row.error.startswith("invalid evaluation: ") and str(Path.cwd()) not in row.error
