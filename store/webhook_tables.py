"""The webhook tables: a tenant's endpoints, and the outbox of deliveries with their log.

A delivery row is written in the same transaction as the job event it reports
(store.webhooks.enqueue_for_event), so an event committed is an event delivered, whatever
restarts in between; the row then carries every attempt's outcome (the delivery log).
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any

from sqlalchemy import Boolean, ForeignKey, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from store.tables import BigId, Base, JSONType, UTCDateTime, _str_enum, new_ulid, utcnow


def new_endpoint_id() -> str:
    return f"whe_{new_ulid()}"


def new_message_id() -> str:
    return f"msg_{new_ulid()}"  # the `webhook-id` header: receivers deduplicate on it


class DeliveryStatus(StrEnum):
    pending = "pending"      # due at next_attempt_at
    delivered = "delivered"  # a 2xx answer
    failed = "failed"        # out of retries (a day), or its endpoint was deleted


class WebhookEndpoint(Base):
    __tablename__ = "webhook_endpoints"

    id: Mapped[str] = mapped_column(String(40), primary_key=True, default=new_endpoint_id)
    tenant_id: Mapped[int] = mapped_column(ForeignKey("tenants.id"), index=True)
    url: Mapped[str] = mapped_column(Text)
    description: Mapped[str] = mapped_column(String(200), default="")
    # The event types it receives ("job.succeeded", ...); null: all of them.
    event_types: Mapped[list[str] | None] = mapped_column(JSONType)
    # The signing secret ("whsec_" + base64), needed in the clear to sign. After a rotation
    # the previous one also signs until previous_secret_expires_at, so receivers can switch.
    secret: Mapped[str] = mapped_column(String(100))
    previous_secret: Mapped[str | None] = mapped_column(String(100))
    previous_secret_expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    enabled: Mapped[bool] = mapped_column(Boolean, default=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class WebhookDelivery(Base):
    __tablename__ = "webhook_deliveries"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    message_id: Mapped[str] = mapped_column(String(40), unique=True, default=new_message_id)
    endpoint_id: Mapped[str] = mapped_column(ForeignKey("webhook_endpoints.id", ondelete="CASCADE"), index=True)
    event_type: Mapped[str] = mapped_column(String(64))
    payload: Mapped[dict[str, Any]] = mapped_column(JSONType)
    status: Mapped[DeliveryStatus] = mapped_column(_str_enum(DeliveryStatus), default=DeliveryStatus.pending,
                                                   index=True)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow, index=True)
    last_status_code: Mapped[int | None] = mapped_column(Integer)
    last_error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    delivered_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
