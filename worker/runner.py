"""The job runner: claim a job, run it by its kind under the lease, and the reaper.

This is the logic behind the Celery tasks (a few lines each in `worker.entrypoints`), so it
can be tested without a broker. `run_job` claims the row (`worker.lease`: a duplicate or
stale message finds nothing to claim and returns at once) and hands the lease to the module
of the row's kind: `worker.training_job` (train), `worker.probe_job` (probe) or `worker.evaluation_job`
(evaluation). Every kind
runs under the same heartbeat, stop check and outcomes, and every write (the claim, the
heartbeat, the sink, the outcome) goes to the database of the `settings` given.
"""
from __future__ import annotations

import logging
from typing import Callable

from store import jobs
from store.db import session_scope
from store.settings import Settings, get_settings
from store.tables import JobKind
from worker import celery_app
from worker.celery_app import Enqueue
from worker.evaluation_job import run_evaluation
from worker.lease import Lease, claim
from worker.probe_job import run_probe
from worker.training_job import run_training

log = logging.getLogger(__name__)

# What runs a claimed row of each kind; each returns the status it wrote (None: not ours).
RUNS: dict[JobKind, Callable[[Lease, Enqueue], str | None]] = {
    JobKind.train: run_training,
    JobKind.probe: run_probe,
    JobKind.evaluation: run_evaluation,
}


def _settings_enqueue(settings: Settings) -> Enqueue:
    """Enqueue through a Celery app bound to `settings`: the broker this worker serves, also
    when a caller (a test, an embedded stack) runs a job with settings of its own."""

    def enqueue(job_id: str, gpus: int = 1, nodes: int = 1) -> None:
        celery_app.send_job(celery_app.make_app(settings), job_id, gpus, nodes)

    return enqueue


def run_job(job_id: str, settings: Settings | None = None,
            enqueue: Enqueue | None = None) -> str | None:
    """Run job `job_id` if it can be claimed; returns the final status ("queued" when a
    machine fault sent it back), None if not ours. `enqueue` re-sends a job requeued after a
    machine fault (default: to the broker of `settings`)."""
    settings = settings or get_settings()
    enqueue = enqueue if enqueue is not None else _settings_enqueue(settings)
    lease = claim(job_id, settings)
    if lease is None:
        log.info("job %s is not claimable (duplicate or stale message); skipping", job_id)
        return None
    log.info("claimed %s job %s attempt %s", lease.claim.kind.value, job_id, lease.attempt)
    return RUNS[JobKind(lease.claim.kind)](lease, enqueue)


def reap_and_requeue(enqueue: Enqueue, settings: Settings | None = None) -> list[str]:
    """Requeue (or fail, past max_attempts: the store decides) jobs whose lease expired, and
    enqueue again queued jobs nobody claimed for `requeue_queued_after_seconds`; each goes to
    the queue of its own shape (GPU count; `ray` for a multi-node job)."""
    settings = settings or get_settings()
    with session_scope(settings.database_url) as s:
        job_ids = list(jobs.reap_expired(s))
        stale = jobs.stale_queued(s, settings.requeue_queued_after_seconds)
        shapes = jobs.job_shapes(s, job_ids + stale)
    for job_id in job_ids:
        log.warning("lease of job %s expired; requeueing", job_id)
        gpus, nodes = shapes.get(job_id, (1, 1))
        enqueue(job_id, gpus=gpus, nodes=nodes)
    for job_id in stale:
        log.warning("job %s queued for over %ss without a claim; enqueueing again",
                    job_id, settings.requeue_queued_after_seconds)
        gpus, nodes = shapes.get(job_id, (1, 1))
        enqueue(job_id, gpus=gpus, nodes=nodes)
    return job_ids + stale
