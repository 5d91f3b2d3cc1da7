"""`/v1/files` with `purpose: fine-tune`: OpenAI's files API over this service's datasets.

A file is a dataset (the same row, id `ds_...`, the same file on disk): it is uploaded through
the native upload path (`api.dataset_upload.store_upload`: streaming, the size limit, the
dataset quota, every line checked with the trainer's rules, a bad line named), so
`GET /v1/datasets` lists it and `training_file` takes its id. Only `fine-tune` is served:
another purpose is a 400 naming `purpose` before anything is stored. Delete refuses (409) a
file that a queued, running or paused job still reads.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request
from fastapi.responses import FileResponse

from store import datasets

from api.deps import SessionDep, SettingsDep, TenantDep
from api.openai.errors import OpenAIError, OpenAIRoute, bad_request
from api.openai.objects import file_object
from api.dataset_upload import UPLOAD_BODY, store_upload
from api.upload import Upload

router = APIRouter(prefix="/files", tags=["openai: files"], route_class=OpenAIRoute)
PURPOSE = "fine-tune"

_FILES_BODY = {"requestBody": {"required": True, "content": {"multipart/form-data": {"schema": {
    "type": "object", "required": ["file", "purpose"],
    "properties": {**UPLOAD_BODY["requestBody"]["content"]["multipart/form-data"]["schema"]
                   ["properties"], "purpose": {"type": "string", "enum": [PURPOSE]}},
}}}}}


def _check_purpose(upload: Upload) -> None:
    purpose = upload.fields.get("purpose")
    if purpose != PURPOSE:
        raise bad_request("purpose", f"{purpose!r} is not served here; upload training files "
                                     f"with purpose {PURPOSE!r}")


def _file_or_404(session: Any, tenant_id: int, file_id: str) -> Any:
    row = datasets.get_dataset(session, tenant_id, file_id)
    if row is None:
        raise OpenAIError(404, f"No such File object: {file_id}", param="id", code="not_found")
    return row


@router.post("", openapi_extra=_FILES_BODY)
async def upload_file(request: Request, session: SessionDep, settings: SettingsDep,
                      tenant: TenantDep) -> dict[str, Any]:
    """Upload a JSONL training file (multipart `file`, `purpose=fine-tune`)."""
    stored = await store_upload(request, session, settings, tenant.id,
                                check_fields=_check_purpose)
    return file_object(_file_or_404(session, tenant.id, stored.id))


@router.get("")
def list_files(session: SessionDep, tenant: TenantDep,
               limit: Annotated[int, Query(ge=1, le=10_000)] = 10_000,
               after: Annotated[str | None, Query(max_length=64)] = None,
               order: Literal["desc"] = "desc",
               purpose: Annotated[str | None, Query(max_length=64)] = None) -> dict[str, Any]:
    """The caller's files, newest first (only `order=desc`)."""
    if purpose is not None and purpose != PURPOSE:
        return {"object": "list", "data": [], "has_more": False}
    rows = datasets.list_datasets(session, tenant.id, limit=limit + 1, after=after)
    data = [file_object(r) for r in rows[:limit]]
    return {"object": "list", "data": data, "has_more": len(rows) > limit,
            "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None}


@router.get("/{file_id}")
def retrieve_file(file_id: str, session: SessionDep, tenant: TenantDep) -> dict[str, Any]:
    return file_object(_file_or_404(session, tenant.id, file_id))


@router.get("/{file_id}/content", response_class=FileResponse)
def file_content(file_id: str, session: SessionDep, tenant: TenantDep) -> FileResponse:
    row = _file_or_404(session, tenant.id, file_id)
    return FileResponse(row.uri, media_type="application/jsonl", filename=row.name)


@router.delete("/{file_id}")
def delete_file(file_id: str, session: SessionDep, tenant: TenantDep) -> dict[str, Any]:
    """Delete the file and its dataset; 409 while a queued, running or paused job reads it."""
    _file_or_404(session, tenant.id, file_id)
    user = datasets.active_job_using(session, tenant.id, file_id)
    if user is not None:
        raise OpenAIError(409, f"file {file_id} is in use by job {user} (cancel it, or wait "
                               f"until it finishes)", param="id", code="file_in_use")
    row = datasets.delete_dataset(session, tenant.id, file_id)
    uri = row.uri if row is not None else None
    session.commit()
    if uri:  # after the commit: a row never points at a missing file
        Path(uri).unlink(missing_ok=True)
    return {"id": file_id, "object": "file", "deleted": True}
