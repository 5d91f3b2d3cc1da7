"""Graders over HTTP, in OpenAI's shapes: validate a grader, run one on a sample.

`POST /v1/graders/validate {grader}` -> `{grader}` or a 422 naming the field;
`POST /v1/graders/run {grader, model_sample, item}` -> OpenAI's run response (`reward`,
`sub_rewards`, `metadata` with the error flags). Both need a tenant key and count against
its rate limit like every /v1 route. Tenant Python and generated programs never run in this
process: `trainer.graders` sends them to its bubblewrap sandboxes (separate, locked-down
processes); this process only renders templates and computes the deterministic metrics.
Each run that needs a sandbox gets sandboxes of its own, killed when it returns (no
process ever serves two calls, so none serves two tenants); the built-in verifiers' process
pools (this project's code) are shared, at most four, idle ones closed.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from importlib import metadata
from typing import Any, Iterator

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field

from trainer.graders import (
    Grader, GraderRuntime, SandboxUnavailable, needs_sandbox, run_grader, sandbox_layer)
from trainer.graders.settings import grader_settings
from trainer.graders.verifier_cache import VerifierScorers

from api.deps import TenantDep
from api.errors import ApiError, field_error
from api.submission import check_runnable

router = APIRouter(prefix="/graders", tags=["graders"])
_lock = threading.Lock()
MAX_ITEM_KEYS = 1000
SLOT_WAIT_S = 10.0
VERIFIER_IDLE_S = 300.0
TAG = "brorl-api-grader"  # in every API sandbox's command line (tests look for leftovers)


class ValidateRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    grader: Grader


class RunRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    grader: Grader
    model_sample: str | dict[str, Any] = Field(
        description="The model's output text, or OpenAI's sample object (output_text, ...).")
    item: dict[str, Any] = Field(default_factory=dict, description="The dataset row.")


def _verifiers(request: Request) -> VerifierScorers:
    """The process's built-in verifier scorers: this project's code, shared, bounded, idle
    ones closed (trainer.graders.verifier_cache)."""
    with _lock:
        shared = getattr(request.app.state, "grader_verifiers", None)
        if shared is None:
            shared = request.app.state.grader_verifiers = VerifierScorers(
                max_entries=4, idle_s=VERIFIER_IDLE_S)
        return shared


def _sandbox_slots(request: Request) -> threading.BoundedSemaphore:
    with _lock:
        slots = getattr(request.app.state, "grader_slots", None)
        if slots is None:
            slots = request.app.state.grader_slots = threading.BoundedSemaphore(
                grader_settings().grader_api_concurrency)
        return slots


@contextmanager
def call_runtime(request: Request, grader: Any) -> Iterator[GraderRuntime]:
    """A runtime of this call's own: its sandboxes serve this call alone and are killed when
    it returns, so nothing one tenant's grader leaves behind meets another's. Calls that
    need a sandbox hold one of BRORL_GRADER_API_CONCURRENCY slots (a 503 with Retry-After
    when none frees up within SLOT_WAIT_S), which bounds the sandboxes and their memory."""
    slots = _sandbox_slots(request) if needs_sandbox(grader) else None
    if slots is not None and not slots.acquire(timeout=SLOT_WAIT_S):
        raise ApiError(503, "every grader sandbox of this server is busy; retry shortly",
                       headers={"Retry-After": "1"})
    try:
        with GraderRuntime(pool_size=1, tag=TAG, verifiers=_verifiers(request)) as runtime:
            yield runtime
    finally:
        if slots is not None:
            slots.release()


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
        with call_runtime(request, body.grader) as runtime:
            return run_grader(body.grader, body.model_sample, body.item, runtime)
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
