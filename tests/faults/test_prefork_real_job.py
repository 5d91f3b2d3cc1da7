"""A real training job on the production worker shape: `brorl worker --pool prefork` (one fresh
child per job, as docker-compose.yml runs the GPU workers), PostgreSQL and Redis.

A prefork child is a daemonic process, and a job starts children of its own (the task build's
isolated process, the graders' pools); without `worker.entrypoints._allow_child_processes` the
job fails with "daemonic processes are not allowed to have children". The other fault tests use
the stand-in trainer, which starts none.
"""
from __future__ import annotations

import pytest

from store import jobs, keys
from store.db import session_scope
from store.tables import JobStatus, Metric
from tests.faults.helpers import checkpoint_steps, event_types, job, wait_for
from tests.support.tinyprebuild import SHARED_SEED, prebuild, shared_task
from trainer.spec import JobSpec

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.redis, pytest.mark.timeout(900)]


def test_a_real_job_runs_in_a_prefork_child(stack):
    from worker.celery_app import enqueue_job

    spec = {"spec_version": 1, "name": "prefork", "seed": SHARED_SEED,
            "model": {"path": "builtin:tiny", "dtype": "float32"}, "task": shared_task(),
            "rollout": {"engine": "hf", "max_new_tokens": 24,
                        "schedule": [{"n": 8, "prompts_per_step": 4, "steps": 2}]},
            "eval": {"every": 0}, "checkpoint": {"every": 2}, "limits": {"max_attempts": 1}}
    prebuild(JobSpec.model_validate(spec))
    del stack.env["BRORL_TRAINER_ENTRYPOINT"]  # the real trainer
    stack.env["BRORL_TORCH_THREADS"] = "1"
    stack.start_worker()  # prefork, one fresh child per job
    with session_scope() as s:
        tenant = keys.create_tenant(s, "acme")
        row, _ = jobs.create_job(s, tenant.id, spec, total_steps=2, name="prefork")
        job_id = row.id
    enqueue_job(job_id)
    wait_for(lambda: job(job_id).status.finished, 600, "the real job", stack.folder)
    final = job(job_id)
    assert final.status == JobStatus.succeeded, (final.status, final.error)
    assert checkpoint_steps(job_id) == [2] and event_types(job_id).count("succeeded") == 1
    with session_scope() as s:
        rows = s.query(Metric).filter_by(job_id=job_id).order_by(Metric.step).all()
    assert [r.step for r in rows if "loss" in r.values] == [1, 2]  # both steps trained
