"""Races the compare-and-set updates must settle: concurrent claims, reapers, idempotent creates."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.orm import Session

from store import jobs
from store.tables import Tenant, utcnow
from tests.store.helpers import make_job, make_spec

ROUNDS = 10


def _race(engine: Engine, fn: Callable[[Session], Any], n: int = 2) -> list[Any]:
    """Run fn in n threads, each with its own session, released together by a barrier."""
    barrier = threading.Barrier(n)
    results: list[Any] = [None] * n
    errors: list[BaseException] = []

    def run(i: int) -> None:
        with Session(engine, expire_on_commit=False) as s:
            try:
                barrier.wait()
                results[i] = fn(s)
                s.commit()
            except BaseException as exc:  # surfaced below: a thread's error must fail the test
                errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    return results


def test_two_threads_claim_one_wins(engine: Engine, session: Session, tenant: Tenant) -> None:
    for _ in range(ROUNDS):
        job = make_job(session, tenant)
        claims = _race(engine, lambda s: jobs.claim(s, job.id, "w", 60))
        won = [c for c in claims if c is not None]
        assert len(won) == 1 and won[0].attempt == 1


def test_two_reapers_requeue_once(engine: Engine, session: Session, tenant: Tenant) -> None:
    job = make_job(session, tenant)
    jobs.claim(session, job.id, "w", 1)
    later = utcnow() + timedelta(seconds=5)
    results = _race(engine, lambda s: jobs.reap_expired(s, now=later))
    assert sorted(results) == [[], [job.id]]
    assert jobs.get_job_unscoped(session, job.id).attempt == 1


def test_concurrent_idempotent_creates_make_one_job(
    engine: Engine, session: Session, tenant: Tenant
) -> None:
    def create(s: Session) -> tuple[str, bool]:
        job, created = jobs.create_job(s, tenant.id, make_spec(), 10, "demo", "same-key")
        return job.id, created

    results = _race(engine, create)
    assert len({job_id for job_id, _ in results}) == 1
    assert sorted(created for _, created in results) == [False, True]
