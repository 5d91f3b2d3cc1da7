"""Datasets: upload a JSONL file (one JSON object a line: a string `prompt`, or OpenAI's RFT
`messages`; any other fields, such as `answer`, `reference_answer` or a code grader's `tests`,
are kept for the job's reward; docs/graders.md, Dataset formats), list, show.

An upload is all-or-nothing. The body streams into a temp file beside the final location
(`api.upload`: 413 as soon as it passes `settings.max_upload_bytes`), every line is checked
with the trainer's own rules (`count_valid_rows`, one line at a time, so memory stays at one
line; the API refuses exactly what the trainer could not read; a bad line is a 422 naming its number), then the file is renamed into place and only
then is its row inserted. Any failure on the way deletes the temp file and inserts nothing;
a failing insert deletes the renamed file too.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Query, Request, status
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from store import datasets
from store.artifacts import dataset_path
from store.errors import NotFound
from store.settings import Settings
from trainer.spec import text_problem

from api.deps import SessionDep, SettingsDep, TenantDep
from api.errors import ApiError
from api.quotas import check_dataset_quota
from api.schemas import DatasetPublic, ListPublic
from api.upload import Upload, receive_upload

log = logging.getLogger(__name__)

VALIDATE_TIMEOUT_S = 300  # ~0.4 s of CPU per 28 MB here: only a broken machine gets near it
VALIDATE_MEMORY_MB = 512  # one line at a time, lines at most max_dataset_line_bytes
IN_PROCESS_BYTES = 2 * 1024 * 1024  # ~30 ms of parsing: not worth a child process

router = APIRouter(prefix="/datasets", tags=["datasets"])

# The request body is parsed by hand (streaming), so its schema is declared here for /docs.
_UPLOAD_BODY = {
    "requestBody": {
        "required": True,
        "content": {"multipart/form-data": {"schema": {
            "type": "object",
            "required": ["file"],
            "properties": {
                "file": {"type": "string", "format": "binary",
                         "description": 'JSONL: one {"prompt": str, ...} or OpenAI RFT '
                                        '{"messages": [...], ...} object per line; `answer` or '
                                        '`reference_answer` (str or number) where the built-in '
                                        'verifier reads it. A bad line is a 422 naming the line '
                                        'and the field.'},
                "name": {"type": "string", "maxLength": 200,
                         "description": "Defaults to the file's name."},
            },
        }}},
    }
}


def _count_rows(path: Path, max_line_bytes: int) -> int:
    """Rows of a valid JSONL file, checked one line at a time; 422 naming the first bad line.

    Parsing every line of a large upload is seconds of pure-Python CPU: run in this process
    it would hold the GIL against every other tenant's requests, so a file over
    `IN_PROCESS_BYTES` is checked in a child process (`trainer.tasks.isolated`) while this
    thread only waits; a smaller one costs less than the child's start (~0.1-0.3 s)."""
    from trainer.tasks.isolated import TaskBuildError, count_rows_in_file, run_isolated

    if path.stat().st_size <= IN_PROCESS_BYTES:
        rows = count_rows_in_file(str(path), max_line_bytes)
    else:
        try:
            rows = run_isolated(count_rows_in_file, (str(path), max_line_bytes),
                                what="validating the dataset", timeout_s=VALIDATE_TIMEOUT_S,
                                memory_mb=VALIDATE_MEMORY_MB)
        except TaskBuildError as exc:
            raise ApiError(422, f"invalid dataset: {exc}", field="file") from None
    if isinstance(rows, str):
        raise ApiError(422, f"invalid dataset: {rows}", field="file")
    return rows


def _dataset_name(upload: Upload) -> str:
    name = (upload.fields.get("name") or upload.filename or "dataset").strip() or "dataset"
    if len(name) > 200:
        raise ApiError(422, "name: at most 200 characters", field="name")
    problem = text_problem(name)
    if problem is not None:  # the form field, or the file's name it defaults to
        raise ApiError(422, f"name: {problem}", field="name")
    return name


def _store(session: Session, settings: Settings, tenant_id: int, upload: Upload,
           name: str) -> DatasetPublic:
    """Validate the temp file, move it into place and record it (runs in a thread)."""
    assert upload.path is not None
    rows = _count_rows(upload.path, settings.max_dataset_line_bytes)
    check_dataset_quota(session, settings, tenant_id, incoming_bytes=upload.nbytes)
    dataset_id = datasets.new_dataset_id()
    final = dataset_path(settings, dataset_id)
    final.parent.mkdir(parents=True, exist_ok=True)
    os.replace(upload.path, final)  # same folder tree, so an atomic rename
    upload.path = None
    try:
        row = datasets.create_dataset(session, tenant_id, name=name, sha256=upload.sha256,
                                      rows=rows, nbytes=upload.nbytes, uri=str(final),
                                      dataset_id=dataset_id)
        session.commit()
    except BaseException:
        final.unlink(missing_ok=True)
        raise
    return DatasetPublic.model_validate(row)


@router.post("", status_code=status.HTTP_201_CREATED, response_model=DatasetPublic,
             openapi_extra=_UPLOAD_BODY,
             responses={413: {"description": "Over the upload size limit."},
                        422: {"description": "A bad line; the message names its number."}})
async def upload_dataset(request: Request, session: SessionDep, settings: SettingsDep,
                         tenant: TenantDep) -> DatasetPublic:
    """Upload a JSONL dataset (multipart: `file`, optional `name`)."""
    return await store_upload(request, session, settings, tenant.id)


async def store_upload(request: Request, session: Session, settings: Settings, tenant_id: int,
                       check_fields: Callable[[Upload], None] | None = None) -> DatasetPublic:
    """Receive, validate and record a multipart JSONL upload: the one upload path of this
    route and of the OpenAI-shaped `POST /v1/files` (api/openai/files.py), which passes
    `check_fields` to refuse its other form fields (`purpose`) before anything is stored."""
    # Checked before the body is read, in a short session of its own: the route's session
    # must not hold a connection while a (possibly slow) body streams in.
    with request.app.state.sessionmaker() as quota_session:
        check_dataset_quota(quota_session, settings, tenant_id)
    tmp_dir = dataset_path(settings, "x").parent  # the final folder: the move is a rename
    release = request.app.state.upload_slots.acquire(
        tenant_id, settings.max_concurrent_uploads_per_tenant)
    try:
        upload = await receive_upload(request, tmp_dir, settings.max_upload_bytes)
        try:
            if check_fields is not None:
                check_fields(upload)
            name = _dataset_name(upload)
            return await run_in_threadpool(_store, session, settings, tenant_id, upload, name)
        finally:
            upload.discard()  # a no-op once the file was moved into place
    finally:
        release()


@router.get("", response_model=ListPublic[DatasetPublic])
def list_datasets(
    session: SessionDep, tenant: TenantDep,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    after: Annotated[str | None, Query(max_length=64,
                                       description="The last dataset id of the previous page.")] = None,
) -> ListPublic[DatasetPublic]:
    """The caller's datasets, newest first."""
    rows = datasets.list_datasets(session, tenant.id, limit=limit + 1, after=after)
    return ListPublic[DatasetPublic](data=[DatasetPublic.model_validate(d) for d in rows[:limit]],
                                     has_more=len(rows) > limit)


@router.get("/{dataset_id}", response_model=DatasetPublic)
def get_dataset(dataset_id: str, session: SessionDep, tenant: TenantDep) -> DatasetPublic:
    row = datasets.get_dataset(session, tenant.id, dataset_id)
    if row is None:
        raise NotFound(f"dataset {dataset_id} not found")
    return DatasetPublic.model_validate(row)
