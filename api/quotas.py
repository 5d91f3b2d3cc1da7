"""Per-tenant quotas: active jobs, stored datasets and their bytes, completion tokens per
rolling day (429 `quota_exceeded`).

Checked against the database when something is created, so they hold across API processes.
Two creations racing past the last free slot can both pass (check, then insert): a quota is
a guard against runaway use, not an exact accounting, so one over is accepted.
Open metric streams and uploads in progress are also capped per tenant in each API process
(`StreamSlots`: one tenant's parallel uploads parse, hash and write on the same cores as
every other tenant's requests; docs/hardening.md has the figures), and
per key with requests in flight in `api.guards`; a job's disk use is
bounded by the spec (`checkpoint.keep_last` at most 100).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

from sqlalchemy.orm import Session

from store import completion_usage, datasets
from store.jobs import count_active_jobs
from store.settings import Settings

from api.errors import ApiError


def _exceeded(message: str) -> ApiError:
    return ApiError(429, f"quota exceeded: {message}", type_="quota_exceeded")


def job_quota_error(session: Session, settings: Settings, tenant_id: int) -> ApiError | None:
    """The error to raise if the tenant may not start another job (returned, not raised:
    an Idempotency-Key replay of an existing job must still answer)."""
    limit = settings.max_active_jobs_per_tenant
    if count_active_jobs(session, tenant_id) >= limit:
        return _exceeded(f"at most {limit} queued or running jobs per tenant; "
                         f"wait for some to finish or cancel them")
    return None


def check_dataset_quota(session: Session, settings: Settings, tenant_id: int,
                        incoming_bytes: int = 0) -> None:
    count, used = datasets.usage(session, tenant_id)
    if incoming_bytes == 0 and count >= settings.max_datasets_per_tenant:
        raise _exceeded(f"at most {settings.max_datasets_per_tenant} datasets per tenant")
    if used + incoming_bytes > settings.max_dataset_bytes_per_tenant:
        raise _exceeded(f"datasets may use at most {settings.max_dataset_bytes_per_tenant} "
                        f"bytes per tenant ({used} used)")


def check_completion_quota(session: Session, settings: Settings, tenant_id: int) -> None:
    """Refuse a completion before it generates while the tenant's last 24 hours of calls
    used the whole `completion_tokens_per_day` (the call that crosses it finishes: its
    length is not known before it ends)."""
    limit = settings.completion_tokens_per_day
    if not limit:
        return
    used = completion_usage.tokens_used(session, tenant_id)
    if used >= limit:
        freed = completion_usage.next_release(session, tenant_id)
        when = f"; the oldest call counted leaves the window at {freed:%Y-%m-%d %H:%M} UTC" if freed else ""
        raise _exceeded(f"at most {limit} completion tokens (prompt + completion) per tenant per "
                        f"24 hours; {used} used{when}")


class StreamSlots:
    """Things a tenant has open in this API process: metric streams (`max_streams_per_tenant`),
    uploads in progress (`max_concurrent_uploads_per_tenant`); `what` names them in the 429."""

    def __init__(self, what: str = "open metric streams") -> None:
        self._open: dict[int, int] = defaultdict(int)
        self.what = what

    def acquire(self, tenant_id: int, limit: int) -> Callable[[], None]:
        """Take a slot or raise 429; returns a release function that is safe to call twice."""
        if self._open[tenant_id] >= limit:
            raise _exceeded(f"at most {limit} {self.what} per tenant")
        self._open[tenant_id] += 1
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                self._open[tenant_id] -= 1

        return release
