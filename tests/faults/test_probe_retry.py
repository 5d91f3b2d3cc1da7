"""A probe whose worker is SIGKILLed mid-probe: the lease expires, the reaper requeues it, the
next worker runs it again, and the probe ends with exactly one result and one `succeeded`.

Real `brorl worker` processes, PostgreSQL and a private Redis (tests/faults/conftest.py), a
real probe of builtin:tiny.
"""
from __future__ import annotations

import pytest

from store import keys, probes
from store.db import session_scope
from store.tables import Job, JobEvent, JobStatus
from tests.faults.helpers import wait_for
from tests.support.tinyprebuild import prebuild
from trainer.probe_spec import ProbeSpec, base_job_spec

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.redis, pytest.mark.timeout(900)]

TASK = {"reasoning_gym": {"name": "chain_sum", "config": {"min_terms": 2, "max_terms": 2, "max_digits": 1},
                          "train_size": 500, "eval_size": 16}}


def _job(probe_id: str) -> Job:
    with session_scope() as s:
        return s.get(Job, probe_id)


def test_a_probe_retried_after_a_killed_worker_has_one_result(stack):
    from worker.celery_app import enqueue_job

    spec = ProbeSpec.model_validate({"task": TASK, "n": 32, "prompts": 8, "max_new_tokens": 24,
                                     "chunk_samples": 32, "engine": "hf", "seed": 1,
                                     "limits": {"max_attempts": 5}})
    prebuild(base_job_spec(spec), sft_steps=150)
    stack.env["BRORL_TORCH_THREADS"] = "1"
    stack.start_worker("solo")
    with session_scope() as s:
        tenant = keys.create_tenant(s, "acme")
        row, _ = probes.create_probe(s, tenant.id, spec)
        probe_id = row.id
    enqueue_job(probe_id)
    wait_for(lambda: _job(probe_id).step >= 64, 300, "two chunks done", stack.folder)
    stack.kill_workers()
    assert _job(probe_id).status == JobStatus.running and _job(probe_id).result is None
    stack.start_worker("solo")  # its beat reaps the expired lease; attempt 2 probes from the start
    wait_for(lambda: _job(probe_id).status.finished, 300, "retried probe", stack.folder)
    job = _job(probe_id)
    assert job.status == JobStatus.succeeded and job.attempt >= 2
    with session_scope() as s:
        events = s.query(JobEvent).filter_by(job_id=probe_id).order_by(JobEvent.id).all()
        types = [e.type.value for e in events]
        last = [e.data for e in events if e.type.value == "progress" and e.data["attempt"] == job.attempt]
    assert types.count("retried") == job.attempt - 1 and types.count("succeeded") == 1
    assert last[-1]["done"] == 256  # the finishing attempt probed every sample itself
    assert job.result["samples"] == 256 and len(job.result["per_prompt"]) == 8
