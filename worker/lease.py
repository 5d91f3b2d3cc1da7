"""One claimed attempt of a job: the claim, the heartbeat, why to stop, and the outcomes.

Every job kind (training, probe) runs under the same lease, written once here:

1. claim: one compare-and-set in the store that moves the job queued -> running, bumps the
   attempt and takes the lease (`claim`). A duplicate or stale message finds nothing to claim.
2. a heartbeat thread renews the lease every `heartbeat_seconds` and brings back the job's
   `cancel_requested` and pause flags; when the store answers `Fenced` (a newer attempt owns
   the job), or no renewal has landed for a whole lease, the run must stop.
3. `StopState.should_stop` is what the work polls: true on cancel, pause, the worker's
   shutdown and past `limits.max_wall_seconds`; it raises `Fenced` once the job is not ours
   (so a fenced run saves nothing on its way out).
4. the outcome (`Lease.settle` for work that returned, `Lease.fail` for work that raised):
   cancelled, paused (`store.job_pause`: its checkpoint is kept and a resume queues it again),
   failed (the wall-clock limit, or an exception, with a one-line user message; the traceback
   goes to the worker log only), requeued (an exception marked `retryable = True`, a fault of
   the machine such as `trainer.distributed.launch.RankDied`: below `limits.max_attempts` the
   job is queued again and enqueued on the queue of its GPU count), or what the job kind's
   own success writes. A fenced run writes nothing: the job is no longer ours. A run stopped
   because the worker is shutting down writes nothing either: the lease runs out and the
   reaper requeues the job.

Every database write goes to the database of the `Settings` the lease was claimed with.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session

from store import datasets, job_pause, jobs
from store.db import session_scope
from store.errors import Fenced
from store.jobs import Claim
from store.settings import Settings
from worker.celery_app import Enqueue
from worker.messages import user_message

log = logging.getLogger(__name__)

WALL_LIMIT_ERROR = "exceeded max_wall_seconds"


# Set when this worker process is shutting down (worker.entrypoints connects it to Celery's
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
    """Why a run should stop; written by the heartbeat thread and the sink, read by the work."""

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
        self.database_url = settings.database_url
        self._done = threading.Event()

    def beat(self) -> None:
        """One renewal; public so tests (and the lease) can beat without waiting."""
        try:
            sent = time.monotonic()
            with session_scope(self.database_url) as s:
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


def claim(job_id: str, settings: Settings) -> Lease | None:
    """Claim job `job_id` for this worker; None when it is not claimable (a duplicate or stale
    message, a cancelled job, a job another worker holds)."""
    with session_scope(settings.database_url) as s:
        won = jobs.claim(s, job_id, settings.worker_id, settings.lease_seconds)
    return None if won is None else Lease(won, settings)


class Lease:
    """What a worker holds while it runs one attempt of a job; `held` keeps it renewed."""

    def __init__(self, claim: Claim, settings: Settings) -> None:
        self.claim, self.settings = claim, settings
        self.job_id, self.attempt = claim.job_id, claim.attempt
        self.state = StopState(max_wall_seconds=float("inf"), lease_seconds=settings.lease_seconds,
                               job_id=claim.job_id, attempt=claim.attempt)

    def session(self) -> AbstractContextManager[Session]:
        """A session on the database this lease was claimed in."""
        return session_scope(self.settings.database_url)

    @contextmanager
    def held(self, max_wall_seconds: float) -> Iterator[StopState]:
        """Start the wall clock and the heartbeat; the block gets the stop state to poll."""
        # The lease counts from here, as the wall clock does: what came before (validating the
        # spec may import reasoning-gym, seconds) is not a lease that failed to renew.
        now = time.monotonic()
        self.state.max_wall_seconds, self.state.started, self.state.renewed = max_wall_seconds, now, now
        heartbeat = Heartbeat(self.job_id, self.attempt, self.settings, self.state)
        heartbeat.start()
        try:
            yield self.state
        finally:
            heartbeat.stop()

    def dataset_path(self, spec: Any) -> Path | None:
        """The uploaded JSONL of a dataset task, checked to belong to the job's tenant.

        The API checks ownership at submit time; checking again here costs one query and keeps
        a hand-edited job row from reading another tenant's data.
        """
        if spec.task.dataset is None:
            return None
        dataset_id = spec.task.dataset.id
        with self.session() as s:
            row = datasets.get_dataset_unscoped(s, dataset_id)
            if row is None or row.tenant_id != self.claim.tenant_id:
                raise ValueError(f"task.dataset.id: dataset {dataset_id} not found")
            return Path(row.uri)

    def finish(self, status: str, error: str | None = None) -> str | None:
        """Record the outcome and return the status written (a success after a cancel request
        is written as cancelled); None when fenced (someone else owns the job now) or when the
        database is unreachable (the lease runs out and the reaper retries the job)."""
        def write(s: Session) -> str:
            return jobs.finish(s, self.job_id, self.attempt, status, error=error).value
        return self.write_outcome(status, write)

    def write_outcome(self, what: str, write: Callable[[Session], str]) -> str | None:
        """Write an outcome (`write(session)` returns the status written), fenced: None when the
        job is no longer ours or the database is unreachable (the lease runs out and the reaper
        retries the job)."""
        try:
            with self.session() as s:
                return write(s)
        except Fenced:
            log.warning("job %s attempt %s fenced before recording %s", self.job_id, self.attempt, what)
        except OperationalError:  # nothing else to write it with
            log.error("job %s attempt %s: database unreachable, could not record %s",
                      self.job_id, self.attempt, what)
        return None

    def pause(self) -> str | None:
        """End the attempt as `paused` (its checkpoint was saved on the way out); a resume
        queues it again."""
        def write(s: Session) -> str:
            job_pause.pause_attempt(s, self.job_id, self.attempt)
            return "paused"
        return self.write_outcome("paused", write)

    def retry_or_fail(self, error: str, gpus: int, enqueue: Enqueue, nodes: int = 1) -> str | None:
        """A machine fault: requeue (and enqueue on the job's queue) or fail past max_attempts;
        returns the status written, None when fenced or the database is unreachable."""
        def write(s: Session) -> str:
            if jobs.retry_or_fail(s, self.job_id, self.attempt, error):
                return "queued"
            return jobs.get_job_unscoped(s, self.job_id).status.value
        status = self.write_outcome(f"a retry ({error})", write)
        if status == "queued":
            try:
                enqueue(self.job_id, gpus=gpus, nodes=nodes)
            except Exception:  # noqa: BLE001 - it stays queued; the reaper enqueues it again
                log.exception("job %s requeued but not enqueued; the reaper will", self.job_id)
        return status

    def fail(self, exc: BaseException, gpus: int, enqueue: Enqueue, nodes: int = 1) -> str | None:
        """The outcome of work that raised: nothing when fenced, a retry for a machine fault,
        else `failed` with the user message (the traceback goes to this worker's log only)."""
        if self.state.fenced:
            return None
        retryable = getattr(exc, "retryable", False)  # the machine's fault, not the job's
        log.error("job %s %s", self.job_id, "hit a machine fault" if retryable else "failed",
                  exc_info=exc)
        if retryable:
            return self.retry_or_fail(user_message(exc), gpus, enqueue, nodes)
        return self.finish("failed", user_message(exc))

    def settle_with_result(self, result: dict[str, Any] | None, kind: str) -> str | None:
        """`settle` for work whose success is one result (a probe's, an evaluation's): the
        result recorded with the succeeded status; never paused (the API pauses training jobs only)."""
        def succeed() -> str | None:
            if result is None:  # stopped, yet nothing says why: leave it to the lease and reaper
                log.warning("%s %s stopped without an outcome; the reaper will requeue it", kind, self.job_id)
                return None

            def write(s: Session) -> str:
                jobs.record_result(s, self.job_id, self.attempt, result)
                return jobs.finish(s, self.job_id, self.attempt, "succeeded").value
            return self.write_outcome("its result", write)
        return self.settle(succeed, pausable=False)

    def settle(self, succeed: Callable[[], str | None], pausable: bool) -> str | None:
        """The outcome of work that returned (stopped or done): `succeed()` writes the job
        kind's success. `pausable`: the work stopped before its end and a resume can go on
        from where it stopped (a pause that arrived after the last step has nothing left to
        pause, and probes are not paused)."""
        state = self.state
        if state.fenced:
            return None
        if state.cancel_requested:
            return self.finish("cancelled")
        if state.shutdown:
            # Not an outcome of the job: leave it running; once the (no longer renewed) lease
            # expires the reaper requeues it and the next attempt resumes from its checkpoint.
            log.warning("job %s stopped for worker shutdown; the reaper will requeue it", self.job_id)
            return None
        if state.pause_requested and pausable and not state.wall_exceeded:
            return self.pause()
        if state.wall_exceeded:
            return self.finish("failed", WALL_LIMIT_ERROR)
        return succeed()
