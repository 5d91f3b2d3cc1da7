"""`/v1/fine_tuning/alpha/graders/run` and `/validate`: OpenAI's paths for the native grader
handlers (api/routes/graders.py; `/v1/graders/*` stays). The handlers are the same functions,
registered again here under OpenAI's error shape, so `client.fine_tuning.alpha.graders.run(...)`
with only `base_url` changed gets the same answers as the native route.
"""

from __future__ import annotations

from fastapi import APIRouter

from api.openai.errors import OpenAIRoute
from api.routes import graders

router = APIRouter(prefix="/fine_tuning/alpha/graders", tags=["openai: graders"],
                   route_class=OpenAIRoute)
router.add_api_route("/validate", graders.validate, methods=["POST"],
                     name="openai_validate_grader")
router.add_api_route("/run", graders.run, methods=["POST"], name="openai_run_grader")
