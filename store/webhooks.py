"""Webhooks in the database: a tenant's endpoints, and the outbox their deliveries go through.

A job event that users ask to be pushed (a job succeeded, failed, was cancelled or paused, a
warning, a checkpoint saved) adds one delivery row per matching endpoint in the same
transaction as the event (`enqueue_for_event`, called by store.jobs), so nothing committed is
lost to a restart. A dispatcher (api.webhooks.dispatch) claims due rows with a compare-and-set
(several API processes never send one row twice at once), sends them, and records each
attempt: a 2xx delivers; anything else is retried with exponential backoff (5 s, 20 s, 80 s,
... at most 6 h apart) until a day after the event, then the row is `failed`. The row is the
delivery log.
"""
from __future__ import annotations

import base64
import os
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import delete, func, select, update
from sqlalchemy.orm import Session

from store.errors import NotFound
from store.tables import Job, JobKind, utcnow
from store.webhook_tables import DeliveryStatus, WebhookDelivery, WebhookEndpoint

# Job event type -> the webhook event type users subscribe to (per kind: job.* or probe.*).
PUSHED_EVENTS = ("succeeded", "failed", "cancelled", "paused", "warning", "checkpoint_saved")
EVENT_TYPES = tuple(f"{kind}.{e}" for kind in ("job", "probe", "evaluation")
                    for e in PUSHED_EVENTS) + ("webhook.test",)
RETRY_FOR = timedelta(days=1)
FIRST_RETRY_S, MAX_RETRY_S = 5.0, 6 * 3600.0
ROTATION_OVERLAP = timedelta(hours=24)  # the previous secret still signs this long


def new_secret() -> str:
    return "whsec_" + base64.b64encode(os.urandom(24)).decode()


def retry_delay(attempts: int) -> timedelta:
    """Wait after the `attempts`-th failed attempt: 5 s, 20 s, 80 s, ... capped at 6 h."""
    return timedelta(seconds=min(FIRST_RETRY_S * 4 ** max(attempts - 1, 0), MAX_RETRY_S))


# --------------------------------------------------------------------------- endpoints

def create_endpoint(s: Session, tenant_id: int, url: str, description: str = "",
                    event_types: list[str] | None = None) -> WebhookEndpoint:
    row = WebhookEndpoint(tenant_id=tenant_id, url=url, description=description,
                          event_types=event_types, secret=new_secret())
    s.add(row)
    s.flush()
    return row


def count_endpoints(s: Session, tenant_id: int) -> int:
    return s.scalar(select(func.count()).select_from(WebhookEndpoint)
                    .where(WebhookEndpoint.tenant_id == tenant_id)) or 0


def list_endpoints(s: Session, tenant_id: int) -> list[WebhookEndpoint]:
    return list(s.scalars(select(WebhookEndpoint).where(WebhookEndpoint.tenant_id == tenant_id)
                          .order_by(WebhookEndpoint.id)))


def get_endpoint(s: Session, tenant_id: int, endpoint_id: str) -> WebhookEndpoint:
    """The tenant's endpoint; another tenant's is as unknown as a made-up id."""
    row = s.scalar(select(WebhookEndpoint).where(WebhookEndpoint.id == endpoint_id,
                                                 WebhookEndpoint.tenant_id == tenant_id))
    if row is None:
        raise NotFound(f"webhook endpoint {endpoint_id} not found")
    return row


def update_endpoint(s: Session, tenant_id: int, endpoint_id: str, **fields: Any) -> WebhookEndpoint:
    row = get_endpoint(s, tenant_id, endpoint_id)
    for name, value in fields.items():
        setattr(row, name, value)
    s.flush()
    return row


def rotate_secret(s: Session, tenant_id: int, endpoint_id: str, now: datetime | None = None) -> WebhookEndpoint:
    """A new secret; the old one keeps signing beside it for `ROTATION_OVERLAP`."""
    row = get_endpoint(s, tenant_id, endpoint_id)
    row.previous_secret, row.secret = row.secret, new_secret()
    row.previous_secret_expires_at = (now or utcnow()) + ROTATION_OVERLAP
    s.flush()
    return row


def delete_endpoint(s: Session, tenant_id: int, endpoint_id: str) -> None:
    row = get_endpoint(s, tenant_id, endpoint_id)
    s.execute(delete(WebhookDelivery).where(WebhookDelivery.endpoint_id == row.id))
    s.delete(row)
    s.flush()


def signing_secrets(endpoint: WebhookEndpoint, now: datetime | None = None) -> list[str]:
    """The secrets a delivery is signed with now: the current one, and the previous one
    during its overlap (Standard Webhooks: several space-separated signatures)."""
    now = now or utcnow()
    previous = endpoint.previous_secret if endpoint.previous_secret_expires_at \
        and endpoint.previous_secret_expires_at > now else None
    return [endpoint.secret] + ([previous] if previous else [])


# --------------------------------------------------------------------------- the outbox

def _payload(event_type: str, data: dict[str, Any], now: datetime) -> dict[str, Any]:
    return {"type": event_type, "timestamp": now.isoformat().replace("+00:00", "Z"), "data": data}


def _enqueue(s: Session, tenant_id: int, event_type: str, data: dict[str, Any]) -> int:
    """One delivery per enabled endpoint of the tenant that takes `event_type`."""
    now = utcnow()
    count = 0
    for endpoint in s.scalars(select(WebhookEndpoint).where(WebhookEndpoint.tenant_id == tenant_id,
                                                            WebhookEndpoint.enabled.is_(True))):
        if endpoint.event_types is None or event_type in endpoint.event_types:
            s.add(WebhookDelivery(endpoint_id=endpoint.id, event_type=event_type,
                                  payload=_payload(event_type, data, now), next_attempt_at=now))
            count += 1
    return count


def enqueue_for_event(s: Session, job_id: str, event: str, data: dict[str, Any]) -> int:
    """Deliveries for a job event, in the caller's transaction; 0 for events not pushed."""
    if event not in PUSHED_EVENTS:
        return 0
    row = s.execute(select(Job.tenant_id, Job.kind, Job.status, Job.step, Job.name)
                    .where(Job.id == job_id)).one_or_none()
    if row is None:
        return 0
    kind = {JobKind.probe: "probe", JobKind.evaluation: "evaluation"}.get(JobKind(row.kind), "job")
    body = {"id": job_id, "object": kind, "name": row.name, "event": event, **data}
    return _enqueue(s, row.tenant_id, f"{kind}.{event}", body)


def enqueue_test(s: Session, tenant_id: int, endpoint_id: str) -> WebhookDelivery:
    """A `webhook.test` message to one endpoint (whatever its event types): a receiver's check."""
    endpoint = get_endpoint(s, tenant_id, endpoint_id)
    now = utcnow()
    row = WebhookDelivery(endpoint_id=endpoint.id, event_type="webhook.test", next_attempt_at=now,
                          payload=_payload("webhook.test", {"endpoint_id": endpoint.id}, now))
    s.add(row)
    s.flush()
    return row


@dataclass(frozen=True)
class Claimed:
    """A delivery claimed for sending: what the dispatcher needs, detached from the session."""

    id: int
    message_id: str
    url: str
    secrets: list[str]
    payload: dict[str, Any]
    created_at: datetime


def claim_due(s: Session, limit: int, lease_s: float, now: datetime | None = None) -> list[Claimed]:
    """Up to `limit` due deliveries, each pushed `lease_s` into the future by a compare-and-set
    on its `next_attempt_at`, so another dispatcher skips it until this one records an answer
    (or dies: then it is due again when the lease passes). The caller commits."""
    now = now or utcnow()
    due = s.execute(select(WebhookDelivery.id, WebhookDelivery.next_attempt_at)
                    .where(WebhookDelivery.status == DeliveryStatus.pending,
                           WebhookDelivery.next_attempt_at <= now)
                    .order_by(WebhookDelivery.next_attempt_at).limit(limit)).all()
    claimed = []
    for delivery_id, due_at in due:
        taken = s.execute(update(WebhookDelivery)
                          .where(WebhookDelivery.id == delivery_id, WebhookDelivery.next_attempt_at == due_at,
                                 WebhookDelivery.status == DeliveryStatus.pending)
                          .values(next_attempt_at=now + timedelta(seconds=lease_s))
                          .execution_options(synchronize_session=False)).rowcount
        if taken != 1:
            continue
        d, endpoint = s.execute(select(WebhookDelivery, WebhookEndpoint)
                                .join(WebhookEndpoint, WebhookEndpoint.id == WebhookDelivery.endpoint_id)
                                .where(WebhookDelivery.id == delivery_id)).one()
        claimed.append(Claimed(d.id, d.message_id, endpoint.url, signing_secrets(endpoint, now),
                               dict(d.payload), d.created_at))
    return claimed


def record_attempt(s: Session, delivery_id: int, *, ok: bool, status_code: int | None,
                   error: str | None, now: datetime | None = None) -> DeliveryStatus:
    """The outcome of one attempt: delivered, due again after the backoff, or failed once a
    day has passed since the event. The caller commits."""
    now = now or utcnow()
    d = s.get(WebhookDelivery, delivery_id, populate_existing=True)
    if d is None or d.status != DeliveryStatus.pending:
        return d.status if d is not None else DeliveryStatus.failed
    d.attempts += 1
    d.last_status_code, d.last_error = status_code, (error or None) and error[:500]
    if ok:
        d.status, d.delivered_at = DeliveryStatus.delivered, now
    elif now + retry_delay(d.attempts) > d.created_at + RETRY_FOR:
        d.status = DeliveryStatus.failed
    else:
        d.next_attempt_at = now + retry_delay(d.attempts)
    s.flush()
    return d.status


def list_deliveries(s: Session, tenant_id: int, endpoint_id: str, limit: int = 20,
                    after: int | None = None, status: DeliveryStatus | None = None,
                    ) -> tuple[list[WebhookDelivery], bool]:
    """An endpoint's delivery log, newest first; `after` is the last id of the previous page."""
    get_endpoint(s, tenant_id, endpoint_id)
    query = select(WebhookDelivery).where(WebhookDelivery.endpoint_id == endpoint_id)
    if after is not None:
        query = query.where(WebhookDelivery.id < after)
    if status is not None:
        query = query.where(WebhookDelivery.status == status)
    rows = list(s.scalars(query.order_by(WebhookDelivery.id.desc()).limit(limit + 1)))
    return rows[:limit], len(rows) > limit


def retry_delivery(s: Session, tenant_id: int, endpoint_id: str, delivery_id: int) -> WebhookDelivery:
    """Send a failed (or pending) delivery again now, once (a receiver that was down for a
    day): a failed row that fails again stays failed."""
    get_endpoint(s, tenant_id, endpoint_id)
    d = s.scalar(select(WebhookDelivery).where(WebhookDelivery.id == delivery_id,
                                               WebhookDelivery.endpoint_id == endpoint_id))
    if d is None:
        raise NotFound(f"delivery {delivery_id} not found")
    if d.status != DeliveryStatus.delivered:
        d.status, d.next_attempt_at = DeliveryStatus.pending, utcnow()
    s.flush()
    return d


__all__ = ["EVENT_TYPES", "PUSHED_EVENTS", "Claimed", "claim_due", "create_endpoint", "count_endpoints",
           "delete_endpoint", "enqueue_for_event", "enqueue_test", "get_endpoint", "list_deliveries",
           "list_endpoints", "record_attempt", "retry_delay", "retry_delivery", "rotate_secret",
           "signing_secrets", "update_endpoint"]
