"""Uploaded datasets: one row per JSONL file stored under the artifact dir (also the OpenAI
surface's `fine-tune` files, api/openai/files.py).

The API validates and writes the file first (store.artifacts.dataset_path with an id from
new_dataset_id()), then records it here, so a row never points at a half-written file.
"""

from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from store.tables import Dataset, Job, JobStatus, new_ulid


def new_dataset_id() -> str:
    return f"ds_{new_ulid()}"


def create_dataset(
    s: Session,
    tenant_id: int,
    name: str,
    sha256: str,
    rows: int,
    nbytes: int,
    uri: str,
    dataset_id: str | None = None,
) -> Dataset:
    """Record a stored dataset file; pass `dataset_id` when the file was named after it."""
    dataset = Dataset(
        id=dataset_id or new_dataset_id(), tenant_id=tenant_id, name=name, sha256=sha256,
        rows=rows, bytes=nbytes, uri=uri,
    )
    s.add(dataset)
    s.flush()
    return dataset


def get_dataset(s: Session, tenant_id: int, dataset_id: str) -> Dataset | None:
    """The tenant's dataset, or None (also when it belongs to another tenant)."""
    query = select(Dataset).where(Dataset.id == dataset_id, Dataset.tenant_id == tenant_id)
    return s.scalar(query)


def get_dataset_unscoped(s: Session, dataset_id: str) -> Dataset | None:
    """Any tenant's dataset: for the worker, which checks the job's tenant itself."""
    return s.get(Dataset, dataset_id)


def list_datasets(
    s: Session, tenant_id: int, limit: int = 100, after: str | None = None
) -> list[Dataset]:
    """The tenant's datasets, newest first; `after` is the last id of the previous page."""
    query = select(Dataset).where(Dataset.tenant_id == tenant_id)
    if after is not None:
        query = query.where(Dataset.id < after)
    return list(s.scalars(query.order_by(Dataset.id.desc()).limit(limit)))


def usage(s: Session, tenant_id: int) -> tuple[int, int]:
    """(datasets, bytes) the tenant has stored: what the upload quota is checked against."""
    count, nbytes = s.execute(
        select(func.count(Dataset.id), func.coalesce(func.sum(Dataset.bytes), 0))
        .where(Dataset.tenant_id == tenant_id)).one()
    return int(count), int(nbytes)


def active_job_using(s: Session, tenant_id: int, dataset_id: str) -> str | None:
    """The id of a queued, running or paused job of the tenant that reads this dataset (its
    worker opens the file when it starts or resumes), or None. The specs are read in Python:
    a tenant has few such jobs (the job quota), and JSON paths differ between backends."""
    active = (JobStatus.queued, JobStatus.running, JobStatus.paused)
    rows = s.execute(select(Job.id, Job.spec).where(Job.tenant_id == tenant_id,
                                                   Job.status.in_(active)).order_by(Job.id))
    for job_id, spec in rows:
        task = (spec or {}).get("task") or {}
        if (task.get("dataset") or {}).get("id") == dataset_id:
            return job_id
    return None


def delete_dataset(s: Session, tenant_id: int, dataset_id: str) -> Dataset | None:
    """Delete the tenant's dataset row and return it (None if unknown); the caller commits,
    then removes the file at its `uri`, so a row never points at a missing file."""
    dataset = get_dataset(s, tenant_id, dataset_id)
    if dataset is not None:
        s.delete(dataset)
        s.flush()
    return dataset
