"""The job runner: claim a job, train it under a lease, record the outcome.

This is the logic behind the Celery task (which is a few lines in `worker.tasks`), so it can
be tested without a broker. One run, top to bottom:

1. claim: one compare-and-set in the store that moves the job queued -> running, bumps the
   attempt and takes the lease. A duplicate or stale message finds nothing to claim and
   returns at once.
2. a heartbeat thread renews the lease every `heartbeat_seconds` and brings back the
   job's `cancel_requested` flag; when the store answers `Fenced` (a newer attempt owns the
   job), or no renewal has landed for a whole lease, the run must stop.
3. `train(spec, DbSink, should_stop, resume=..., out_dir=..., dataset_path=...)`, where
   `should_stop` turns true on cancel and past `limits.max_wall_seconds`, and raises `Fenced`
   once the job is not ours (so a fenced run saves nothing on its way out). `out_dir` is
   this attempt's own folder (`jobs/<id>/attempt-<n>`): attempts never share files.
4. finish: succeeded (cancelled if a cancel was requested meanwhile), cancelled (stopped by
   a cancel), paused (stopped by a pause, `store.job_pause`: its checkpoint is kept and a
   resume queues it again), or failed (an exception, with a `failed` event carrying a user message; the
   traceback goes to the worker log only, or the wall-clock limit), after the sink has
   written the rows it buffered during a database outage. An exception marked
   `retryable = True` (a fault of the machine, e.g. `trainer.distributed.launch.RankDied` when a rank of
   a many-GPU job dies) is not the job's fault: below `limits.max_attempts` the job is
   queued again (`store.jobs.retry_or_fail`) and enqueued on the queue of its GPU count.
   A fenced run writes nothing: the job is no longer ours. A run stopped because the
   worker is shutting down writes nothing either: the lease runs out and the reaper
   requeues the job.
"""
from __future__ import annotations

import importlib
import logging
import shutil
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from sqlalchemy.exc import OperationalError

from store import artifacts, datasets, job_pause, jobs
from store.db import session_scope
from store.errors import Fenced
from store.model_paths import model_path_problem
from store.models import Checkpoint, JobKind
from store.settings import Settings, get_settings
from trainer.checkpoints import format as ckpt_format
from worker import celery_app
from worker.celery_app import Enqueue
from worker.messages import user_message
from worker.sink import DatabaseUnavailable, DbSink, SinkBufferFull

log = logging.getLogger(__name__)

WALL_LIMIT_ERROR = "exceeded max_wall_seconds"


# Set when this worker process is shutting down (worker.tasks connects it to Celery's
# worker_shutting_down signal): the running job stops at its next step instead of being
# killed mid-step when the stop grace period runs out.
_shutdown = threading.Event()


def request_shutdown() -> None:
    _shutdown.set()


def clear_shutdown() -> None:
    """Forget a shutdown request (tests; a worker process never un-shuts-down)."""
    _shutdown.clear()


@dataclass
class StopState:
    """Why a run should stop; written by the heartbeat thread and the sink, read by the loop."""

    max_wall_seconds: float
    lease_seconds: float = float("inf")
    job_id: str = ""
    attempt: int = 0
    started: float = field(default_factory=time.monotonic)
    renewed: float = field(default_factory=time.monotonic)  # last lease renewal that landed
    cancel_requested: bool = False
    pause_requested: bool = False  # store.job_pause: stop like a cancel, end `paused`
    fenced: bool = False
    wall_exceeded: bool = False
    shutdown: bool = False

    def should_stop(self) -> bool:
        """True when the run should stop; raises Fenced when the job is no longer ours.

        Raising (rather than returning True) is what keeps a fenced run from saving the
        checkpoint a stopped run saves on its way out. A lease not renewed for longer than
        the lease itself counts as lost: the reaper may already have handed the job on.
        """
        if time.monotonic() - self.renewed > self.lease_seconds:
            self.fenced = True
        if self.fenced:
            raise Fenced(self.job_id, self.attempt)
        # The wall-clock limit counts from this attempt's claim: a retried job gets a fresh
        # budget (a simplification; the alternative needs the first attempt's start time).
        if time.monotonic() - self.started > self.max_wall_seconds:
            self.wall_exceeded = True
        self.shutdown = self.shutdown or _shutdown.is_set()
        return self.cancel_requested or self.pause_requested or self.wall_exceeded or self.shutdown


class Heartbeat(threading.Thread):
    """Renews the lease of (job, attempt) until stopped or fenced off."""

    def __init__(self, job_id: str, attempt: int, settings: Settings, state: StopState) -> None:
        super().__init__(name=f"heartbeat-{job_id}", daemon=True)
        self.job_id, self.attempt, self.state = job_id, attempt, state
        self.interval = float(settings.heartbeat_seconds)
        self.lease_seconds = settings.lease_seconds
        self._done = threading.Event()

    def beat(self) -> None:
        """One renewal; public so tests (and the runner) can beat without waiting."""
        try:
            sent = time.monotonic()
            with session_scope() as s:
                if jobs.heartbeat(s, self.job_id, self.attempt, self.lease_seconds):
                    self.state.cancel_requested = True
                if job_pause.pause_requested(s, self.job_id):
                    self.state.pause_requested = True
            self.state.renewed = sent
        except Fenced:
            log.warning("job %s attempt %s lost its lease", self.job_id, self.attempt)
            self.state.fenced = True
            self._done.set()
        except Exception:  # noqa: BLE001 - a flaky database must not kill the thread
            # The lease outlives several missed beats; the next one may well succeed.
            log.exception("heartbeat for job %s failed; will retry", self.job_id)

    def run(self) -> None:
        while not self._done.wait(self.interval):
            self.beat()

    def stop(self) -> None:
        self._done.set()
        self.join(timeout=max(self.interval, 1.0) + 5.0)


def resolve_entrypoint(dotted: str) -> Callable[..., Any]:
    """`"package.module:function"` -> the function (the trainer, or a test double)."""
    module_name, _, attr = dotted.partition(":")
    if not module_name or not attr:
        raise ValueError(f"trainer entrypoint {dotted!r} is not 'module:function'")
    return getattr(importlib.import_module(module_name), attr)


def _resume_dir(job_id: str) -> Path | None:
    """The folder of this job's latest recorded checkpoint, if it still exists on disk."""
    with session_scope() as s:
        ckpt = jobs.latest_checkpoint(s, job_id)
        uri = getattr(ckpt, "uri", None) if ckpt is not None else None
    if not uri:
        return None
    path = Path(uri.removeprefix("file://"))
    return path if path.exists() else None


def _sweep_earlier_attempts(settings: Settings, job_id: str, attempt: int) -> None:
    """Delete what earlier attempts left on disk without a row: temp folders and unrecorded
    checkpoints of a worker that crashed mid-save. Those attempts are fenced for good (only
    this one may write), so nothing they left can still become a recorded checkpoint."""
    with session_scope() as s:
        recorded = {Path(c.uri) for c in s.query(Checkpoint).filter_by(job_id=job_id)}
    for n in range(1, attempt):
        root = artifacts.attempt_dir(settings, job_id, n) / "checkpoints"
        for path in root.glob("*") if root.is_dir() else []:
            if path.name.startswith(".tmp-"):
                shutil.rmtree(path, ignore_errors=True)
            elif path.is_dir() and path.resolve() not in recorded and path not in recorded:
                ckpt_format.remove(path)


def _dataset_path(spec: Any, tenant_id: int) -> Path | None:
    """The uploaded JSONL of a dataset task, checked to belong to the job's tenant.

    The API checks ownership at submit time; checking again here costs one query and keeps a
    hand-edited job row from reading another tenant's data.
    """
    if spec.task.dataset is None:
        return None
    dataset_id = spec.task.dataset.id
    with session_scope() as s:
        row = datasets.get_dataset_unscoped(s, dataset_id)
        if row is None or row.tenant_id != tenant_id:
            raise ValueError(f"task.dataset.id: dataset {dataset_id} not found")
        return Path(row.uri)


def _finish(job_id: str, attempt: int, status: str, error: str | None = None) -> str | None:
    """Record the outcome and return the status written (a success after a cancel request is
    written as cancelled); a `Fenced` here means someone else owns the job now: None."""
    try:
        with session_scope() as s:
            return jobs.finish(s, job_id, attempt, status, error=error).value
    except Fenced:
        log.warning("job %s attempt %s fenced before finishing as %s", job_id, attempt, status)
        return None
    except OperationalError:
        # Nothing else to write it with: the lease runs out and the reaper retries the job.
        log.error("job %s attempt %s: database unreachable, could not record %s (%s)",
                  job_id, attempt, status, error)
        return None


def _pause(job_id: str, attempt: int) -> str | None:
    """End the attempt as `paused` (its checkpoint was saved on the way out); a resume queues
    it again. None when fenced or the database is unreachable (the reaper then requeues it)."""
    try:
        with session_scope() as s:
            job_pause.pause_attempt(s, job_id, attempt)
        return "paused"
    except Fenced:
        log.warning("job %s attempt %s fenced before it could pause", job_id, attempt)
    except OperationalError:
        log.error("job %s attempt %s: database unreachable, could not record the pause",
                  job_id, attempt)
    return None


def _settings_enqueue(settings: Settings) -> Enqueue:
    """Enqueue through a Celery app bound to `settings`: the broker this worker serves, also
    when a caller (a test, an embedded stack) runs a job with settings of its own."""

    def enqueue(job_id: str, gpus: int = 1) -> None:
        celery_app.send_job(celery_app.make_app(settings), job_id, gpus)

    return enqueue


def _retry_or_fail(job_id: str, attempt: int, error: str, gpus: int,
                   enqueue: Enqueue) -> str | None:
    """A machine fault: requeue (and enqueue on the job's queue) or fail past max_attempts;
    returns the status written, None when fenced or the database is unreachable."""
    try:
        with session_scope() as s:
            requeued = jobs.retry_or_fail(s, job_id, attempt, error)
            status = "queued" if requeued else jobs.get_job_unscoped(s, job_id).status.value
    except Fenced:
        log.warning("job %s attempt %s fenced before it could be retried", job_id, attempt)
        return None
    except OperationalError:
        log.error("job %s attempt %s: database unreachable, could not retry it (%s); the "
                  "reaper will once its lease expires", job_id, attempt, error)
        return None
    if requeued:
        try:
            enqueue(job_id, gpus=gpus)
        except Exception:  # noqa: BLE001 - it stays queued; the reaper enqueues it again
            log.exception("job %s requeued but not enqueued; the reaper will", job_id)
    return status


def run_job(job_id: str, settings: Settings | None = None,
            enqueue: Enqueue | None = None) -> str | None:
    """Run job `job_id` if it can be claimed; returns the final status ("queued" when a
    machine fault sent it back), None if not ours. `enqueue` re-sends a job requeued after a
    machine fault (default: to the broker of `settings`)."""
    from trainer.spec import JobSpec  # light (pydantic only), but keeps import time down

    settings = settings or get_settings()
    enqueue = enqueue if enqueue is not None else _settings_enqueue(settings)
    with session_scope() as s:
        claim = jobs.claim(s, job_id, settings.worker_id, settings.lease_seconds)
    if claim is None:
        log.info("job %s is not claimable (duplicate or stale message); skipping", job_id)
        return None
    attempt = claim.attempt
    log.info("claimed job %s attempt %s", job_id, attempt)
    if claim.kind == JobKind.probe:  # same claim, lease and outcomes; a probe's work
        from worker.probe_runner import run_probe

        return run_probe(claim, settings)
    try:
        spec = JobSpec.model_validate(claim.spec)
    except Exception as exc:  # noqa: BLE001 - a stored spec that no longer validates
        _finish(job_id, attempt, "failed", f"invalid spec: {user_message(exc)}")
        return "failed"
    # Checked again here, not only at submission: a spec stored before the operator narrowed
    # BRORL_MODEL_ROOTS (or written around the API) must not load an arbitrary path.
    problem = model_path_problem(spec.model.path, settings)
    if problem is not None:
        _finish(job_id, attempt, "failed", f"model.path: {problem}")
        return "failed"
    state = StopState(max_wall_seconds=spec.limits.max_wall_seconds,
                      lease_seconds=settings.lease_seconds, job_id=job_id, attempt=attempt)
    heartbeat = Heartbeat(job_id, attempt, settings, state)
    heartbeat.start()
    try:
        return _train_and_record(job_id, attempt, claim.tenant_id, spec, settings, state,
                                 enqueue)
    finally:
        heartbeat.stop()


def _train_and_record(job_id: str, attempt: int, tenant_id: int, spec: Any,
                      settings: Settings, state: StopState, enqueue: Enqueue) -> str | None:
    def on_fenced() -> None:
        state.fenced = True

    sink = DbSink(job_id, attempt, on_fenced=on_fenced, keep_last=spec.checkpoint.keep_last,
                  retry_seconds=settings.lease_seconds, buffer_rows=settings.sink_buffer_rows,
                  max_sample_bytes=settings.max_sample_bytes_per_job)
    try:
        # Per attempt: a stale attempt can neither overwrite nor prune its successor's files.
        out_dir = artifacts.attempt_dir(settings, job_id, attempt)
        out_dir.mkdir(parents=True, exist_ok=True)
        _sweep_earlier_attempts(settings, job_id, attempt)
        train = resolve_entrypoint(settings.trainer_entrypoint)
        result = train(spec, sink, state.should_stop, resume=_resume_dir(job_id),
                       out_dir=out_dir, dataset_path=_dataset_path(spec, tenant_id))
        sink.flush()  # rows buffered during a database outage land before the outcome
    except Fenced:
        state.fenced = True
    except Exception as exc:  # noqa: BLE001 - any trainer error fails the job, not the worker
        if state.fenced:
            return None
        retryable = getattr(exc, "retryable", False)  # the machine's fault, not the job's
        log.exception("job %s %s", job_id, "hit a machine fault" if retryable else "failed")
        if not isinstance(exc, (SinkBufferFull, DatabaseUnavailable)):
            try:
                sink.flush()  # the steps before the error still count
            except Fenced:
                return None
            except DatabaseUnavailable:
                log.error("job %s: its last metric rows were not written", job_id)
        if retryable:
            return _retry_or_fail(job_id, attempt, user_message(exc),
                                  spec.resources.gpus_per_node, enqueue)
        return _finish(job_id, attempt, "failed", user_message(exc))  # traceback: logged above only
    if state.fenced:
        return None
    if state.shutdown and not state.cancel_requested:
        # Not an outcome of the job: leave it running; once the (no longer renewed) lease
        # expires the reaper requeues it and the next attempt resumes from its checkpoint.
        log.warning("job %s stopped for worker shutdown; the reaper will requeue it", job_id)
        return None
    if state.cancel_requested:
        return _finish(job_id, attempt, "cancelled")
    # A pause that arrived after the last step has nothing left to pause: the job succeeded.
    finished_all = getattr(result, "stopped", True) is False
    if state.pause_requested and not state.wall_exceeded and not finished_all:
        return _pause(job_id, attempt)
    if state.wall_exceeded:
        return _finish(job_id, attempt, "failed", WALL_LIMIT_ERROR)
    return _finish(job_id, attempt, "succeeded")


def reap_and_requeue(enqueue: Enqueue) -> list[str]:
    """Requeue (or fail, past max_attempts: the store decides) jobs whose lease expired, and
    enqueue again queued jobs nobody claimed for `requeue_queued_after_seconds`; each goes to
    the queue of its own GPU count."""
    settings = get_settings()
    with session_scope() as s:
        job_ids = list(jobs.reap_expired(s))
        stale = jobs.stale_queued(s, settings.requeue_queued_after_seconds)
        gpus = jobs.job_gpus(s, job_ids + stale)
    for job_id in job_ids:
        log.warning("lease of job %s expired; requeueing", job_id)
        enqueue(job_id, gpus=gpus.get(job_id, 1))
    for job_id in stale:
        log.warning("job %s queued for over %ss without a claim; enqueueing again",
                    job_id, settings.requeue_queued_after_seconds)
        enqueue(job_id, gpus=gpus.get(job_id, 1))
    return job_ids + stale
