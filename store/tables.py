"""SQLAlchemy 2 table models: tenants, API keys, jobs, job events, metrics, checkpoints, datasets.

The database is the truth about every job; Celery messages only trigger work. Only store/
imports these classes to build queries; api/ and worker/ read their attributes.
Timestamps are timezone-aware UTC on every backend (SQLite drops the zone, `UTCDateTime`
puts it back). JSON columns are JSONB on Postgres and JSON text on SQLite.
"""

from __future__ import annotations

import os
import threading
import time
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Enum,
    Float,
    ForeignKey,
    Integer,
    MetaData,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
    false,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

# One definition of the event types, the trainer's (its values are the column's: no migration).
from trainer.events import EventType  # noqa: F401  (re-exported: store, api and tests import it here)

# Named constraints keep migrations identical on both backends and let SQLite's batch mode
# (which recreates tables) find constraints by name on downgrade.
NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

JSONType = JSON().with_variant(JSONB(), "postgresql")
# SQLite only auto-increments an INTEGER PRIMARY KEY; Postgres gets 64-bit ids for the two
# tables that grow with every step.
BigId = BigInteger().with_variant(Integer(), "sqlite")


def utcnow() -> datetime:
    return datetime.now(UTC)


class UTCDateTime(TypeDecorator[datetime]):
    """A timestamp stored in UTC and always read back timezone-aware."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given; store/ only accepts timezone-aware UTC")
        return value.astimezone(UTC)

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        # SQLite hands back naive values; they were written as UTC by process_bind_param.
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


# --------------------------------------------------------------------------- ids

_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_ulid_lock = threading.Lock()
_ulid_last = (0, 0)


def _b32(value: int, length: int) -> str:
    return "".join(_CROCKFORD[(value >> (5 * i)) & 31] for i in reversed(range(length)))


def new_ulid() -> str:
    """26 chars: 48-bit ms timestamp + 80 random bits, so ids sort by creation time.

    Within one millisecond the random part is incremented instead of redrawn (monotonic
    ULID), so ids made by one process keep their creation order; list_jobs relies on that
    for "newest first".
    """
    global _ulid_last
    with _ulid_lock:
        ms = time.time_ns() // 1_000_000
        last_ms, last_rand = _ulid_last
        if ms <= last_ms:
            ms, rand = last_ms, (last_rand + 1) & ((1 << 80) - 1)
        else:
            rand = int.from_bytes(os.urandom(10), "big")
        _ulid_last = (ms, rand)
    return _b32(ms, 10) + _b32(rand, 16)


def new_job_id() -> str:
    return f"job_{new_ulid()}"


class JobKind(StrEnum):
    """What a job row runs: a training job, a pass@k probe (trainer/probe.py) or an evaluation
    of a job's checkpoints (trainer/evaluation.py). All share the row, the state machine (claim,
    heartbeat, fencing, cancel, reaper) and the queues."""

    train = "train"
    probe = "probe"
    evaluation = "evaluation"


ID_PREFIX = {JobKind.train: "job", JobKind.probe: "prb", JobKind.evaluation: "evl"}


def new_id(kind: "JobKind") -> str:
    return f"{ID_PREFIX[JobKind(kind)]}_{new_ulid()}"


# --------------------------------------------------------------------------- enums


class JobStatus(StrEnum):
    queued = "queued"
    running = "running"
    paused = "paused"  # stopped at a step with its checkpoint; resume queues it again
    succeeded = "succeeded"
    failed = "failed"
    cancelled = "cancelled"

    @property
    def finished(self) -> bool:
        return self in TERMINAL_STATUSES


TERMINAL_STATUSES = frozenset({JobStatus.succeeded, JobStatus.failed, JobStatus.cancelled})


def _str_enum(cls: type[StrEnum]) -> Enum:
    # A VARCHAR holding the value (not a native Postgres ENUM): adding a member later needs no
    # ALTER TYPE, and SQLite and Postgres store the same thing.
    return Enum(
        cls,
        native_enum=False,
        create_constraint=False,
        length=32,
        values_callable=lambda members: [m.value for m in members],
        validate_strings=True,
    )


# --------------------------------------------------------------------------- tables


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class Tenant(Base):
    __tablename__ = "tenants"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class ApiKey(Base):
    __tablename__ = "api_keys"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    tenant_id: Mapped[int] = mapped_column(ForeignKey("tenants.id"), index=True)
    prefix: Mapped[str] = mapped_column(String(12))  # shown in listings; not a secret
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)  # sha256 hex of the key
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime())


class Job(Base):
    __tablename__ = "jobs"
    __table_args__ = (UniqueConstraint("tenant_id", "idempotency_key"),)

    id: Mapped[str] = mapped_column(String(40), primary_key=True, default=new_job_id)
    tenant_id: Mapped[int] = mapped_column(ForeignKey("tenants.id"), index=True)
    kind: Mapped[JobKind] = mapped_column(_str_enum(JobKind), default=JobKind.train,
                                          server_default=JobKind.train.value)
    name: Mapped[str] = mapped_column(String(200))
    spec: Mapped[dict[str, Any]] = mapped_column(JSONType)
    status: Mapped[JobStatus] = mapped_column(
        _str_enum(JobStatus), default=JobStatus.queued, index=True
    )
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow, onupdate=utcnow)
    # Bumped by every claim; writes carrying an older attempt are refused (fencing).
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    lease_owner: Mapped[str | None] = mapped_column(String(200))
    lease_expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    heartbeat_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    pause_requested: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    step: Mapped[int] = mapped_column(Integer, default=0)
    total_steps: Mapped[int] = mapped_column(Integer)
    error: Mapped[str | None] = mapped_column(Text)
    warning: Mapped[str | None] = mapped_column(Text)   # the trainer's latest warning event
    result: Mapped[dict[str, Any] | None] = mapped_column(JSONType)  # a probe's figures
    # What an OpenAI-shaped request said that the spec does not hold (api/openai): metadata,
    # suffix, validation_file, the hyperparameters as asked. Null for native jobs.
    client_meta: Mapped[dict[str, Any] | None] = mapped_column(JSONType)
    # A job started from a checkpoint of an earlier job (spec.continue_from): that job, so its
    # page can list its continuations.
    parent_job_id: Mapped[str | None] = mapped_column(String(40), index=True)
    idempotency_key: Mapped[str | None] = mapped_column(String(200))
    request_hash: Mapped[str | None] = mapped_column(String(64))


class JobEvent(Base):
    """Append-only log of what happened to a job; its id is the SSE/pagination cursor."""

    __tablename__ = "job_events"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    type: Mapped[EventType] = mapped_column(_str_enum(EventType))
    data: Mapped[dict[str, Any]] = mapped_column(JSONType, default=dict)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class Metric(Base):
    """One row per (job, step): the step's metrics as a JSON object."""

    __tablename__ = "metrics"
    __table_args__ = (UniqueConstraint("job_id", "step"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    # No separate index: the unique (job_id, step) index serves lookups by job.
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    step: Mapped[int] = mapped_column(Integer)
    values: Mapped[dict[str, Any]] = mapped_column(JSONType)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class JobSample(Base):
    """One of the few rollouts a step stores for people to read (`samples.per_step` in the spec)."""

    __tablename__ = "job_samples"
    __table_args__ = (UniqueConstraint("job_id", "step", "idx"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    step: Mapped[int] = mapped_column(Integer)
    idx: Mapped[int] = mapped_column(Integer)          # its place among the step's samples
    prompt: Mapped[str] = mapped_column(Text)
    completion: Mapped[str] = mapped_column(Text)
    reward: Mapped[float] = mapped_column(Float)
    correct: Mapped[bool] = mapped_column(Boolean)
    truncated: Mapped[bool] = mapped_column(Boolean)
    advantage: Mapped[float] = mapped_column(Float)
    sub_rewards: Mapped[dict[str, Any]] = mapped_column(JSONType, default=dict)
    # A multi-turn sample (`task.env`): the transcript as chat messages, and the episode's
    # counts {"turns", "tool_calls", "tool_errors"}. Null for single-turn samples.
    messages: Mapped[list[dict[str, Any]] | None] = mapped_column(JSONType, nullable=True)
    env: Mapped[dict[str, int] | None] = mapped_column(JSONType, nullable=True)
    bytes: Mapped[int] = mapped_column(Integer)        # counted against the job's storage cap
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class Checkpoint(Base):
    __tablename__ = "checkpoints"
    __table_args__ = (UniqueConstraint("job_id", "step"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    step: Mapped[int] = mapped_column(Integer)
    uri: Mapped[str] = mapped_column(Text)  # absolute path of the HF-format folder
    bytes: Mapped[int] = mapped_column(BigInteger)
    sha256: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class Dataset(Base):
    __tablename__ = "datasets"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    tenant_id: Mapped[int] = mapped_column(ForeignKey("tenants.id"), index=True)
    name: Mapped[str] = mapped_column(String(200))
    sha256: Mapped[str] = mapped_column(String(64))
    rows: Mapped[int] = mapped_column(Integer)
    bytes: Mapped[int] = mapped_column(BigInteger)
    uri: Mapped[str] = mapped_column(Text)  # absolute path of the stored JSONL file
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
