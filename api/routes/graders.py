"""Graders over HTTP, in OpenAI's shapes: validate a grader, run one on a sample.

`POST /v1/graders/validate {grader}` -> `{grader}` or a 422 naming the field;
`POST /v1/graders/run {grader, model_sample, item}` -> OpenAI's run response (`reward`,
`sub_rewards`, `metadata` with the error flags). Both need a tenant key and count against
its rate limit like every /v1 route. Tenant Python and generated programs never run in this
process: `trainer.graders` sends them to its bubblewrap sandboxes (separate, locked-down
processes); this process only renders templates and computes the deterministic metrics.
The sandbox pools are started on the first run that needs them and shared by later calls.
"""

from __future__ import annotations

import threading
from importlib import metadata
from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field

from trainer.graders import (
    Grader, GraderRuntime, SandboxUnavailable, needs_sandbox, run_grader, sandbox_layer)
from trainer.graders.judges import JudgeError, get_judge
from trainer.graders.models import (
    LabelModelGrader, MultiGrader, ScoreModelGrader, TextSimilarityGrader)
from trainer.graders.similarity import UnsupportedMetric, check_metric

from api.deps import TenantDep
from api.errors import ApiError, field_error

router = APIRouter(prefix="/graders", tags=["graders"])
_lock = threading.Lock()
MAX_ITEM_KEYS = 1000


class ValidateRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    grader: Grader


class RunRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    grader: Grader
    model_sample: str | dict[str, Any] = Field(
        description="The model's output text, or OpenAI's sample object (output_text, ...).")
    item: dict[str, Any] = Field(default_factory=dict, description="The dataset row.")


def check_runnable(grader: Any, path: str = "grader") -> None:
    """422 for what validates but cannot run here: a metric or a judge this server lacks."""
    if isinstance(grader, (ScoreModelGrader, LabelModelGrader)):
        try:
            get_judge(grader.model)
        except JudgeError as exc:
            raise field_error(f"{path}.model", str(exc)) from None
    if isinstance(grader, TextSimilarityGrader):
        try:
            check_metric(grader.evaluation_metric)
        except UnsupportedMetric as exc:
            raise field_error(f"{path}.evaluation_metric", str(exc)) from None
    if isinstance(grader, MultiGrader):
        for key, sub in grader.graders.items():
            check_runnable(sub, f"{path}.graders.{key}")


def _runtime(request: Request) -> GraderRuntime:
    with _lock:
        runtime = getattr(request.app.state, "grader_runtime", None)
        if runtime is None:
            runtime = request.app.state.grader_runtime = GraderRuntime(pool_size=1)
        return runtime


@router.post("/validate")
def validate(body: ValidateRequest, tenant: TenantDep) -> dict[str, Any]:
    """The grader back when it is valid and runnable here; else a 422 naming the field."""
    check_runnable(body.grader)
    return {"grader": body.grader.model_dump(mode="json", exclude_none=True)}


@router.post("/run")
def run(body: RunRequest, request: Request, tenant: TenantDep) -> dict[str, Any]:
    """Grade one sample (python and code graders in the sandbox, never in this process)."""
    check_runnable(body.grader)
    if len(body.item) > MAX_ITEM_KEYS:
        raise field_error("item", f"at most {MAX_ITEM_KEYS} fields")
    if needs_sandbox(body.grader) and sandbox_layer() == "none":
        raise ApiError(503, "grader sandbox unavailable on this server: python and code "
                            "graders cannot run here (the operator must install bubblewrap)")
    try:
        return run_grader(body.grader, body.model_sample, body.item, _runtime(request))
    except SandboxUnavailable as exc:
        raise ApiError(503, str(exc)) from None


@router.get("/packages")
def packages(tenant: TenantDep) -> dict[str, Any]:
    """The Python packages a python grader can import here (name and version)."""
    found = {(d.metadata["Name"] or "").lower(): d.version for d in metadata.distributions()}
    found.pop("", None)
    from trainer.graders.corpora import available  # nltk corpora a grader can load offline

    return {"sandbox": sandbox_layer(),
            "packages": [{"name": n, "version": v} for n, v in sorted(found.items())],
            "nltk_corpora": available()}
