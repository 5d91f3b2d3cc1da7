"""OpenAI's error shape on the OpenAI-compatible routes, so the `openai` SDK raises its usual
exceptions (NotFoundError, BadRequestError, ...) with `.param` and `.code` filled.

    {"error": {"message": "...", "type": "invalid_request_error", "param": "...", "code": "..."}}

`OpenAIRoute` is the route class of every router in this package: it turns what a handler
or a dependency raises (the native `ApiError`, the store's NotFound / InvalidTransition /
IdempotencyConflict, FastAPI's validation errors) into that shape. A validation problem is a
400 there, as OpenAI answers it (the native API says 422). `code` carries the native error
type (`not_found`, `quota_exceeded`, ...). Errors raised before routing (the rate limiter,
the request guards) keep the native shape `{"error": {"type", "message"}}`, which the SDK
also reads (it takes `message` and raises by status). Answers the SDK must not retry (a
conflict, a quota) carry `x-should-retry: false`: its default is to retry 409 and 429.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException as StarletteHTTPException

from store.errors import IdempotencyConflict, InvalidTransition, NotFound

from api.errors import ApiError, error_type, flatten_validation

# OpenAI's `type` by status; everything else is an invalid request.
_OPENAI_TYPES = {401: "authentication_error", 403: "permission_error", 404: "invalid_request_error",
                 429: "rate_limit_error", 500: "server_error", 503: "server_error"}


class OpenAIError(Exception):
    """A failure to answer in OpenAI's shape; `param` names the request field to blame."""

    def __init__(self, status_code: int, message: str, param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status_code, self.message, self.param = status_code, message, param
        self.code, self.headers = code, headers


def bad_request(param: str, message: str) -> OpenAIError:
    """A 400 blaming one request field (the SDK raises BadRequestError with `.param`)."""
    return OpenAIError(400, f"{param}: {message}", param=param, code="invalid_value")


def openai_error_response(status: int, message: str, param: str | None = None,
                          code: str | None = None,
                          headers: dict[str, str] | None = None) -> JSONResponse:
    if status == 422:  # OpenAI answers invalid input with 400
        status = 400
    body = {"error": {"message": message, "type": _OPENAI_TYPES.get(status, "invalid_request_error"),
                      "param": param, "code": code or error_type(status)}}
    out = dict(headers or {})
    if status in (409, 429):  # a conflict or a quota: the same request fails the same way
        out.setdefault("x-should-retry", "false")
    return JSONResponse(body, status_code=status, headers=out)


# pydantic names the member of a union that failed (`literal['auto']`, `int`, ...) in the
# location; the request field is what a user must see.
_UNION_TAG = re.compile(r"^(literal\[.*\]|int|float|str|bool|none|list\[.*\]|dict\[.*\]|"
                        r"function-.*|constrained-.*|tagged-union\[.*\])$")


def _untagged(err: dict[str, Any]) -> dict[str, Any]:
    loc = tuple(p for p in err.get("loc", ()) if not (isinstance(p, str) and _UNION_TAG.match(p)))
    return {**err, "loc": loc}


def _merged(items: list[dict[str, str]]) -> list[dict[str, str]]:
    """One item per field: a union's members each report the same field."""
    out: dict[str, list[str]] = {}
    for item in items:
        out.setdefault(item["field"], []).append(item["message"])
    return [{"field": f, "message": " or ".join(dict.fromkeys(m))} for f, m in out.items()]


def to_openai_error(exc: Exception) -> JSONResponse | None:
    """The OpenAI-shaped answer for an expected failure, None for an unexpected one."""
    if isinstance(exc, OpenAIError):
        return openai_error_response(exc.status_code, exc.message, exc.param, exc.code,
                                     exc.headers)
    if isinstance(exc, RequestValidationError):
        items = _merged(flatten_validation([_untagged(e) for e in exc.errors()]))
        message = "; ".join(f"{i['field']}: {i['message']}" for i in items) or "invalid request"
        return openai_error_response(400, message, items[0]["field"] if items else None,
                                     "invalid_value")
    if isinstance(exc, ApiError):
        return openai_error_response(exc.status_code, exc.message, exc.field,
                                     exc.type or error_type(exc.status_code), exc.headers)
    if isinstance(exc, NotFound):
        return openai_error_response(404, str(exc) or "not found", code="not_found")
    if isinstance(exc, IdempotencyConflict):
        return openai_error_response(409, str(exc), code="idempotency_conflict")
    if isinstance(exc, InvalidTransition):
        return openai_error_response(409, str(exc), code="conflict")
    if isinstance(exc, StarletteHTTPException):
        detail = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
        return openai_error_response(exc.status_code, detail, headers=getattr(exc, "headers", None))
    return None


class OpenAIRoute(APIRoute):
    """A route whose expected failures answer in OpenAI's error shape."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def route(request: Request) -> Response:
            try:
                return await handler(request)
            except Exception as exc:
                answer = to_openai_error(exc)
                if answer is None:
                    raise  # the app's handler logs it and answers a bare 500
                return answer

        return route
