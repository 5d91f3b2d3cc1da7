"""Datasets: upload a JSONL file (one JSON object a line: a string `prompt`, or OpenAI's RFT
`messages`; any other fields, such as `answer`, `reference_answer` or a code grader's `tests`,
are kept for the job's reward; docs/graders.md, Dataset formats), list, show.

The upload path itself is `api.dataset_upload` (shared with OpenAI's `POST /v1/files`).
An upload is all-or-nothing. The body streams into a temp file beside the final location
(`api.upload`: 413 as soon as it passes `settings.max_upload_bytes`), every line is checked
with the trainer's own rules (`count_valid_rows`, one line at a time, so memory stays at one
line; the API refuses exactly what the trainer could not read; a bad line is a 422 naming its number), then the file is renamed into place and only
then is its row inserted. Any failure on the way deletes the temp file and inserts nothing;
a failing insert deletes the renamed file too.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request, status

from store import datasets
from store.errors import NotFound

from api.deps import SessionDep, SettingsDep, TenantDep
from api.schemas import DatasetPublic, ListPublic
from api.dataset_upload import UPLOAD_BODY, store_upload

router = APIRouter(prefix="/datasets", tags=["datasets"])


@router.post("", status_code=status.HTTP_201_CREATED, response_model=DatasetPublic,
             openapi_extra=UPLOAD_BODY,
             responses={413: {"description": "Over the upload size limit."},
                        422: {"description": "A bad line; the message names its number."}})
async def upload_dataset(request: Request, session: SessionDep, settings: SettingsDep,
                         tenant: TenantDep) -> DatasetPublic:
    """Upload a JSONL dataset (multipart: `file`, optional `name`)."""
    return await store_upload(request, session, settings, tenant.id)


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
