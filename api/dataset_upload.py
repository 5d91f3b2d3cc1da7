"""Receiving a dataset upload: the one path of `POST /v1/datasets` and OpenAI's `POST /v1/files`.

The body streams into a temp file beside the final location (`api.upload`), every line is
checked with the trainer's own rules (a bad line is a 422 naming its number), the file is
renamed into place and only then is its row inserted; a failing insert deletes the file.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool
from fastapi import Request

from store import datasets
from store.artifacts import dataset_path
from store.settings import Settings
from trainer.spec import text_problem

from api.errors import ApiError
from api.quotas import check_dataset_quota
from api.schemas import DatasetPublic
from api.upload import Upload, receive_upload

VALIDATE_TIMEOUT_S = 300  # ~0.4 s of CPU per 28 MB here: only a broken machine gets near it
VALIDATE_MEMORY_MB = 512  # one line at a time, lines at most max_dataset_line_bytes
IN_PROCESS_BYTES = 2 * 1024 * 1024  # ~30 ms of parsing: not worth a child process

# The request body is parsed by hand (streaming), so its schema is declared here for /docs.
UPLOAD_BODY = {
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


async def store_upload(request: Request, session: Session, settings: Settings, tenant_id: int,
                       check_fields: Callable[[Upload], None] | None = None) -> DatasetPublic:
    """Receive, validate and record a multipart JSONL upload: the one upload path of
    `POST /v1/datasets` and of the OpenAI-shaped `POST /v1/files` (api/openai/files.py), which passes
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
