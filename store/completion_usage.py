"""Tokens a tenant's completions used (`/v1/chat/completions`, `/v1/completions`): one row per
finished call, so the daily token quota (`BRORL_COMPLETION_TOKENS_PER_DAY`) is a sum over the
last 24 hours that every API process sees alike.

A row per call rather than a counter: a rolling day needs to know when each use happened,
and an insert needs no upsert that SQLite and PostgreSQL spell differently. Rows older than
the window are deleted when the tenant's next call is recorded, so a tenant keeps about a
day of rows (at most its rate limit's worth).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import ForeignKey, Index, Integer, String, delete, func, select
from sqlalchemy.orm import Mapped, Session, mapped_column

from store.tables import Base, BigId, UTCDateTime, utcnow

WINDOW = timedelta(days=1)


class CompletionUsage(Base):
    __tablename__ = "completion_usage"
    __table_args__ = (Index("ix_completion_usage_tenant_id_created_at", "tenant_id", "created_at"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    tenant_id: Mapped[int] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    model: Mapped[str] = mapped_column(String(100))  # the checkpoint that answered (ft:<job>:step-<N>)
    prompt_tokens: Mapped[int] = mapped_column(Integer)
    completion_tokens: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


def tokens_used(s: Session, tenant_id: int, now: datetime | None = None) -> int:
    """Prompt + completion tokens of the tenant's calls in the last 24 hours."""
    since = (now or utcnow()) - WINDOW
    total = s.scalar(select(func.coalesce(func.sum(CompletionUsage.prompt_tokens
                                                   + CompletionUsage.completion_tokens), 0))
                     .where(CompletionUsage.tenant_id == tenant_id, CompletionUsage.created_at > since))
    return int(total or 0)


def next_release(s: Session, tenant_id: int, now: datetime | None = None) -> datetime | None:
    """When the oldest call still in the window drops out of it (None: no call in it)."""
    since = (now or utcnow()) - WINDOW
    oldest = s.scalar(select(func.min(CompletionUsage.created_at))
                      .where(CompletionUsage.tenant_id == tenant_id, CompletionUsage.created_at > since))
    return oldest + WINDOW if oldest is not None else None


def record(s: Session, tenant_id: int, model: str, prompt_tokens: int, completion_tokens: int,
           now: datetime | None = None) -> None:
    """One finished call's usage; drops the tenant's rows past the window. The caller commits."""
    now = now or utcnow()
    s.execute(delete(CompletionUsage).where(CompletionUsage.tenant_id == tenant_id,
                                            CompletionUsage.created_at <= now - WINDOW))
    s.add(CompletionUsage(tenant_id=tenant_id, model=model[:100], prompt_tokens=prompt_tokens,
                          completion_tokens=completion_tokens, created_at=now))
    s.flush()


__all__ = ["CompletionUsage", "WINDOW", "next_release", "record", "tokens_used"]
