"""The OpenAI-compatible surface: a script written for OpenAI's fine-tuning API runs here with
`base_url` and `api_key` changed (docs/migrating-from-openai.md).

`/v1/files` (files.py), `/v1/fine_tuning/jobs` (jobs.py, mapped onto JobSpec by mapping.py,
answered with objects.py's OpenAI objects) and `/v1/fine_tuning/alpha/graders/*` (graders.py), `/v1/chat/completions` and `/v1/completions`
(completions.py, on the tenant's checkpoints),
with OpenAI's error shape (errors.py). Every route reuses the native dependencies, store calls
and creation path: the same tenants, quotas, rate limits, idempotency and jobs.
"""

from __future__ import annotations

from fastapi import APIRouter

from api.openai import completions, files, graders, jobs


def openai_router() -> APIRouter:
    """The OpenAI-shaped routes, to include under `/v1`."""
    router = APIRouter()
    for module in (files, graders, jobs, completions):
        router.include_router(module.router)
    return router
