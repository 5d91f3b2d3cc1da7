"""Jobs for the store tests: a small spec and a committed job row."""
from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from store import jobs
from store.tables import Job, Tenant


def make_spec(max_attempts: int = 3, **extra: Any) -> dict[str, Any]:
    return {"name": "demo", "seed": 0, "limits": {"max_attempts": max_attempts}, **extra}


def make_job(s: Session, tenant: Tenant, max_attempts: int = 3, **extra: Any) -> Job:
    job, created = jobs.create_job(s, tenant.id, make_spec(max_attempts, **extra),
                                   total_steps=10, name="demo", idempotency_key=None)
    assert created
    s.commit()
    return job
