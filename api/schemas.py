"""Public response models: what clients see of each entity, and the list envelope.

One `...Public` model per table (the full-stack template's naming), built from the ORM row
with `from_attributes`; internal columns (tenant, lease, idempotency hash, file paths) are
simply not fields here, so they cannot leak. Shapes follow the OpenAI fine-tuning API where
it fits: every object carries `object`, lists are `{"object": "list", "data", "has_more"}`.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Generic, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from store.models import EventType, JobStatus

T = TypeVar("T")


class _Public(BaseModel):
    model_config = ConfigDict(from_attributes=True)


class ListPublic(BaseModel, Generic[T]):
    """A page of objects; `has_more` says whether asking again with `after` gives more."""

    object: Literal["list"] = "list"
    data: list[T]
    has_more: bool = False


class JobSummary(_Public):
    """A job in a list: everything but the spec (which can be kilobytes per job)."""

    id: str
    object: Literal["job"] = "job"
    name: str
    status: JobStatus
    created_at: datetime
    started_at: datetime | None = None
    finished_at: datetime | None = None
    attempt: int = Field(description="How many times a worker claimed the job (0 while queued).")
    cancel_requested: bool
    step: int = Field(description="The last step that wrote metrics.")
    total_steps: int
    error: str | None = None
    warning: str | None = Field(None, description="The trainer's latest warning (e.g. the job "
                                                  "cannot learn, and which field to change).")


class JobPublic(JobSummary):
    spec: dict[str, Any] = Field(description="The job spec as stored, defaults filled in.")


class EventPublic(_Public):
    id: int = Field(description="Increasing; pass the last one seen as `after`.")
    object: Literal["job.event"] = "job.event"
    job_id: str
    type: EventType
    data: dict[str, Any] = Field(default_factory=dict)
    created_at: datetime


class MetricPublic(_Public):
    """One training step. The step's numbers are nested under `values` (not flattened):
    metric names such as `step` or `eval/pass@1` must not collide with the envelope."""

    object: Literal["job.metric"] = "job.metric"
    step: int
    values: dict[str, Any]
    created_at: datetime


class CheckpointPublic(_Public):
    object: Literal["job.checkpoint"] = "job.checkpoint"
    job_id: str
    step: int
    bytes: int = Field(description="Size of the checkpoint folder, as the worker recorded it.")
    sha256: str = Field(description="Checksum the worker recorded for the folder's contents; "
                                    "the archive's own checksum is the download's ETag.")
    created_at: datetime
    download_url: str


class DatasetPublic(_Public):
    id: str
    object: Literal["dataset"] = "dataset"
    name: str
    rows: int
    bytes: int
    sha256: str = Field(description="sha256 of the uploaded file, as received.")
    created_at: datetime


class StatusPublic(BaseModel):
    status: str
    checks: dict[str, str] | None = None
