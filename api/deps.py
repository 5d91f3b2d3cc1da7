"""Request dependencies: settings, one database session per request, the caller's tenant.

Routes declare what they need with the `Annotated` aliases at the bottom
(`SettingsDep`, `SessionDep`, `TenantDep`, `EnqueueDep`), as in the full-stack FastAPI
template. Everything is read from `request.app.state`, which `api.app.create_app` fills,
so that two apps with different settings (tests) can live in one process.

Connections are held only while a route's own code runs: the key is checked in a short
session of its own (closed before a body is read or a file streamed), and the route's
session is closed when the route function returns, before the response is sent
(`scope="function"`). A slow client can then not hold database connections.
A valid key is remembered for `settings.auth_cache_seconds` (default 5 s) to save a query per
request, so a revoked key stops working within that time.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Annotated, Any, Protocol

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session, sessionmaker
from starlette.concurrency import run_in_threadpool

from store import keys
from store.tables import Tenant
from store.settings import Settings

from api.errors import ApiError

# auto_error=False: a missing header must give our 401 (with the error shape), not
# FastAPI's own 403/401 body.
AUTH_CACHE_MAX = 10_000
_bearer = HTTPBearer(auto_error=False, description="An API key: `Authorization: Bearer <key>`.")


def get_settings(request: Request) -> Settings:
    return request.app.state.settings


def get_session(request: Request) -> Iterator[Session]:
    """One session per request; routes commit what they write, the rest is rolled back."""
    with request.app.state.sessionmaker() as session:
        yield session


SettingsDep = Annotated[Settings, Depends(get_settings)]
SessionDep = Annotated[Session, Depends(get_session, scope="function")]


def _unauthorized(message: str) -> ApiError:
    return ApiError(401, message, headers={"WWW-Authenticate": "Bearer"})


def _lookup_tenant(make_session: sessionmaker[Session], key: str) -> Tenant | None:
    """The key's tenant from a session of its own, closed at once (the row is detached;
    its loaded columns, id and name, stay readable)."""
    with make_session(expire_on_commit=False) as session:
        tenant = keys.authenticate(session, key)
        if tenant is not None:
            session.expunge(tenant)
    return tenant


def cached_tenant(state: Any, key: str) -> Tenant | None:
    """The tenant of `key` if it was found valid within `auth_cache_seconds`, else None."""
    hit = state.auth_cache.get(keys.hash_key(key))
    return hit[1] if hit is not None and hit[0] > time.monotonic() else None


async def tenant_for_key(state: Any, key: str) -> Tenant | None:
    """The tenant owning `key` (the app's `state` holds the cache and the sessionmaker), or
    None. Async so that a cache hit costs no thread-pool hop; a miss queries in a thread.
    Also called by `api.guards` before a request body is read."""
    tenant = cached_tenant(state, key)
    if tenant is not None:
        return tenant
    tenant = await run_in_threadpool(_lookup_tenant, state.sessionmaker, key)
    ttl = state.settings.auth_cache_seconds
    if tenant is not None and ttl > 0:
        cache: dict[str, tuple[float, Tenant]] = state.auth_cache
        if len(cache) >= AUTH_CACHE_MAX:
            cache.clear()  # crude, but bounded; the next requests simply refill it
        cache[keys.hash_key(key)] = (time.monotonic() + ttl, tenant)
    return tenant


async def get_current_tenant(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Tenant:
    """The tenant owning the bearer key; 401 when the key is missing or unknown."""
    if credentials is None or not credentials.credentials:
        raise _unauthorized("missing API key: send `Authorization: Bearer <key>`")
    tenant = await tenant_for_key(request.app.state, credentials.credentials)
    if tenant is None:
        raise _unauthorized("invalid API key")
    return tenant


TenantDep = Annotated[Tenant, Depends(get_current_tenant)]

class Enqueue(Protocol):
    """`enqueue(job_id, gpus=G, nodes=M)` sends the job to the queue of G-GPU workers (of Ray
    driver workers when M > 1; the same shape as `worker.celery_app.Enqueue`, repeated here so
    that importing the API imports no Celery)."""

    def __call__(self, job_id: str, gpus: int = 1, nodes: int = 1) -> None: ...


def celery_enqueue(settings: Settings) -> Enqueue:
    """An enqueue function sending to the broker of `settings`, by task name, to the queue of
    the job's GPU count (`worker.celery_app.queue_for`).

    `worker.celery_app.enqueue_job` uses the process-wide settings; an app built with other
    settings (`brorl up --data-dir`, tests) must reach *its* broker, so a Celery app bound to
    them is made on first use. Celery is imported lazily, and that module never imports torch.
    """
    cache: dict[str, object] = {}

    def enqueue(job_id: str, gpus: int = 1, nodes: int = 1) -> None:
        from worker import celery_app

        celery = cache.get("app")
        if celery is None:
            celery = cache["app"] = celery_app.make_app(settings)
        celery_app.send_job(celery, job_id, gpus, nodes)  # type: ignore[arg-type]

    return enqueue


def get_enqueue(request: Request) -> Enqueue:
    return request.app.state.enqueue


EnqueueDep = Annotated[Enqueue, Depends(get_enqueue)]
