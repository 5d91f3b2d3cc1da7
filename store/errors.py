"""Errors the store raises; api/ maps them to HTTP statuses, worker/ to "stop writing".

NotFound -> 404, InvalidTransition -> 409, IdempotencyConflict -> 409. Fenced means a newer
attempt owns the job (or it is no longer running): the writer must stop, not retry.
"""

from __future__ import annotations


class StoreError(Exception):
    """Base class of every error raised by store/."""


class NotFound(StoreError):
    """The object does not exist, or belongs to another tenant (indistinguishable on purpose)."""


class InvalidTransition(StoreError):
    """The job's state does not allow the requested change; `status` names that state."""

    def __init__(self, status: str, message: str | None = None) -> None:
        self.status = str(status)
        super().__init__(message or f"job is already {self.status}")


class IdempotencyConflict(StoreError):
    """The Idempotency-Key was used before with a different request body."""


class Fenced(StoreError):
    """A write carried an attempt that no longer owns the job (or the job is not running)."""

    def __init__(self, job_id: str, attempt: int) -> None:
        self.job_id = job_id
        self.attempt = attempt
        super().__init__(f"job {job_id}: attempt {attempt} no longer owns the job")
