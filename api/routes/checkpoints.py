"""A job's checkpoints: the list, and each one as a `.tar.gz` of its HF-format folder.

A LoRA job's checkpoint downloads as PEFT's adapter by default, or (`?variant=merged`) as
the merged HF folder (`trainer.checkpoints.format`); a full fine-tuning checkpoint is already
an HF folder, so both variants serve it.

Downloads are archives built once when the checkpoint was recorded (`trainer.checkpoints.format`),
served by `FileResponse` (sendfile, no Python in the byte path), with
`Content-Length`, a strong `ETag` (the archive's quoted sha256), `X-Checksum-Sha256` for
clients that verify what they saved, and `If-None-Match` answered with 304.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from fastapi import APIRouter, Header, Query, Request, Response
from fastapi import Path as PathParam
from fastapi.responses import FileResponse

from store import jobs
from store.errors import NotFound
from store.tables import Checkpoint
from trainer.checkpoints import format as ckpt_format

from api.deps import SessionDep, TenantDep
from api.errors import ApiError
from api.submission import job_or_404
from api.schemas import CheckpointPublic, ListPublic

router = APIRouter(prefix="/jobs/{job_id}/checkpoints", tags=["checkpoints"])
MAX_STEP = 2**31 - 1  # the step column is a 32-bit integer: larger ids are a 422, not a 500
StepParam = Annotated[int, PathParam(ge=0, le=MAX_STEP)]


def _trains_an_adapter(job) -> bool:
    return bool(((job.spec or {}).get("model") or {}).get("lora"))


def _public(request: Request, ckpt: Checkpoint, lora: bool) -> CheckpointPublic:
    url = request.url_for("download_checkpoint", job_id=ckpt.job_id, step=str(ckpt.step))
    return CheckpointPublic(job_id=ckpt.job_id, step=ckpt.step, bytes=ckpt.bytes,
                            sha256=ckpt.sha256, created_at=ckpt.created_at,
                            kind="lora" if lora else "full", download_url=url.path,
                            merged_download_url=f"{url.path}?variant=merged" if lora else None)


@router.get("", response_model=ListPublic[CheckpointPublic])
def list_checkpoints(
    job_id: str, request: Request, session: SessionDep, tenant: TenantDep,
    limit: Annotated[int, Query(ge=1, le=100)] = 100,
    after: Annotated[int | None, Query(ge=-1, le=MAX_STEP,
                                       description="The last step of the previous page.")] = None,
) -> ListPublic[CheckpointPublic]:
    """Checkpoints by ascending step (older ones are deleted by rotation: keep_last)."""
    lora = _trains_an_adapter(job_or_404(session, tenant.id, job_id))
    rows = jobs.list_checkpoints(session, tenant.id, job_id, after=after, limit=limit + 1)
    return ListPublic[CheckpointPublic](data=[_public(request, c, lora) for c in rows[:limit]],
                                        has_more=len(rows) > limit)


def _etag_matches(if_none_match: str | None, etag: str) -> bool:
    if not if_none_match:
        return False
    if if_none_match.strip() == "*":
        return True
    # Weak comparison (RFC 9110 13.1.2): W/"x" matches "x".
    tags = {t.strip().removeprefix("W/") for t in if_none_match.split(",")}
    return etag in tags


@router.get(
    "/{step}/download",
    response_class=FileResponse,
    responses={200: {"content": {"application/gzip": {}}, "description": "The tar.gz archive."},
               304: {"description": "If-None-Match matched the ETag."},
               410: {"description": "The checkpoint's files were deleted (rotation)."}},
)
def download_checkpoint(
    job_id: str, step: StepParam, session: SessionDep, tenant: TenantDep,
    if_none_match: Annotated[str | None, Header()] = None,
    variant: Annotated[Literal["adapter", "merged"] | None, Query(
        description="lora jobs: adapter (the default: PEFT's files) or merged (an HF folder of the "
                    "base with the adapter merged in). Full fine-tuning: merged is the default "
                    "HF folder; adapter is a 422.")] = None,
) -> Response:
    """The checkpoint folder as a `.tar.gz`; extract it into an empty folder."""
    lora = _trains_an_adapter(job_or_404(session, tenant.id, job_id))
    if variant == "adapter" and not lora:
        raise ApiError(422, f"job {job_id} trains the full model (model.lora is null): it has no "
                            f"adapter; download its HF folder without variant", field="variant")
    ckpt = jobs.get_checkpoint(session, tenant.id, job_id, step)
    if ckpt is None:
        raise NotFound(f"job {job_id} has no checkpoint at step {step}")
    folder = Path(ckpt.uri)
    which = "merged" if variant == "merged" and lora else None
    try:
        # The worker built the default archive when it recorded the checkpoint; building here is
        # for the merged variant and older checkpoints (a sync route: it runs in the threadpool).
        archive = ckpt_format.cached_archive(folder, which) if folder.is_dir() else None
        archive = archive or ckpt_format.build_archive(folder, which)
    except FileNotFoundError:
        raise ApiError(410, f"checkpoint at step {step} of job {job_id} is no longer on disk "
                            f"(deleted by rotation or cleanup)") from None
    etag = f'"{archive.sha256}"'
    headers = {"ETag": etag, "X-Checksum-Sha256": archive.sha256, "Cache-Control": "private"}
    if _etag_matches(if_none_match, etag):
        return Response(status_code=304, headers=headers)
    # Our ETag is passed in, so FileResponse keeps it instead of its mtime-based one.
    return FileResponse(archive.path, media_type="application/gzip", headers=headers,
                        filename=f"{job_id}-step{step}{'-merged' if which else ''}.tar.gz")
