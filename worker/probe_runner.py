"""Running a claimed probe: the job runner's lease, heartbeat and outcomes, a probe's work.

`worker.runner.run_job` claims every job row the same way and hands rows of kind `probe` here,
so a probe is leased, heartbeated, fenced, cancelled and reaped exactly as a training job
(one definition of each, in store.jobs and worker.runner). What differs: the work is
`trainer.probe.probe`, progress is a `progress` event after each generation chunk (samples
done of n x prompts, in `step` / `total_steps`), and success writes the result and the
`succeeded` status in one transaction, fenced, so a probe retried after a dead worker ends
with exactly one result: that of the attempt that finished.
"""
from __future__ import annotations

import logging
from typing import Any

from sqlalchemy.exc import OperationalError

from store import jobs, probes
from store.db import session_scope
from store.errors import Fenced
from store.jobs import Claim
from store.model_paths import model_path_problem
from store.settings import Settings
from trainer.probe_spec import ProbeSpec
from trainer.spec import ModelSpec
from worker.messages import user_message
from worker.runner import WALL_LIMIT_ERROR, Heartbeat, StopState, _dataset_path, _finish

log = logging.getLogger(__name__)


def run_probe(claim: Claim, settings: Settings) -> str | None:
    """Run the claimed probe to its outcome; returns the status written (None: not ours)."""
    job_id, attempt = claim.job_id, claim.attempt
    try:
        spec = ProbeSpec.model_validate(claim.spec)
        with session_scope() as s:
            resolved = probes.resolve(s, claim.tenant_id, spec)
    except Exception as exc:  # noqa: BLE001 - a stored probe that no longer resolves
        return _finish(job_id, attempt, "failed", f"invalid probe: {user_message(exc)}")
    if isinstance(spec.model, ModelSpec) and (problem := model_path_problem(spec.model.path, settings)):
        return _finish(job_id, attempt, "failed", f"model.path: {problem}")
    state = StopState(max_wall_seconds=spec.limits.max_wall_seconds,
                      lease_seconds=settings.lease_seconds, job_id=job_id, attempt=attempt)
    heartbeat = Heartbeat(job_id, attempt, settings, state)
    heartbeat.start()
    try:
        return _probe_and_record(claim, resolved, state)
    finally:
        heartbeat.stop()


def _progress(job_id: str, attempt: int, state: StopState):
    def report(p: dict[str, Any]) -> None:
        try:
            with session_scope() as s:
                if jobs.record_progress(s, job_id, attempt, p["samples_done"], p["samples_total"]):
                    state.cancel_requested = True
        except Fenced:
            state.fenced = True
        except OperationalError:  # progress is not worth stopping for; the lease decides
            log.warning("probe %s: progress not recorded (database unreachable)", job_id)
    return report


def _probe_and_record(claim: Claim, resolved: probes.Resolved, state: StopState) -> str | None:
    from trainer.probe import probe
    from trainer.stop import StopRequested

    job_id, attempt = claim.job_id, claim.attempt
    try:
        result = probe(resolved.probe, resolved.base, state.should_stop, model_dir=resolved.model_dir,
                       dataset_path=_dataset_path(resolved.base, claim.tenant_id),
                       on_progress=_progress(job_id, attempt, state))
    except (Fenced, StopRequested):
        result = None
    except Exception as exc:  # noqa: BLE001 - a probe's error fails the probe, not the worker
        if state.fenced:
            return None
        log.exception("probe %s failed", job_id)
        return _finish(job_id, attempt, "failed", user_message(exc))
    if state.fenced:
        return None
    if state.cancel_requested:
        return _finish(job_id, attempt, "cancelled")
    if state.wall_exceeded:
        return _finish(job_id, attempt, "failed", WALL_LIMIT_ERROR)
    if result is None:  # stopped for the worker's shutdown: the reaper requeues it
        log.warning("probe %s stopped for worker shutdown; the reaper will requeue it", job_id)
        return None
    try:
        with session_scope() as s:
            jobs.record_result(s, job_id, attempt, result)
            return jobs.finish(s, job_id, attempt, "succeeded").value
    except Fenced:
        log.warning("probe %s attempt %s fenced before its result was recorded", job_id, attempt)
        return None
