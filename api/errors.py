"""One error shape for every 4xx and 5xx the API returns.

Every failure leaves the API as

    {"error": {"type": "not_found", "message": "job job_123 not found", "field": "..."}}

with `field` present only when one input field is to blame (validation errors, a dataset id
that is not the caller's). Routes raise `ApiError` (or a subclass) or let the store's
exceptions escape; the handlers registered by `install_error_handlers` turn both, plus
FastAPI's own validation and HTTP exceptions, into that shape. Unhandled exceptions become a
500 whose body says nothing about the internals (the traceback goes to the log only).
"""

from __future__ import annotations

import logging
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from store.errors import Fenced, IdempotencyConflict, InvalidTransition, NotFound
from trainer.spec import spec_errors

log = logging.getLogger(__name__)

# HTTP status -> the `type` string clients switch on. Anything else falls back to a
# slug of the standard reason phrase ("413" -> "request_entity_too_large" etc.).
_TYPES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
    410: "gone",
    413: "payload_too_large",
    422: "validation_error",
    500: "internal_error",
    503: "unavailable",
}


def error_type(status_code: int) -> str:
    if status_code in _TYPES:
        return _TYPES[status_code]
    try:
        return HTTPStatus(status_code).phrase.lower().replace(" ", "_").replace("-", "_")
    except ValueError:
        return "error"


def error_body(status_code: int, message: str, field: str | None = None,
               type_: str | None = None) -> dict[str, Any]:
    err: dict[str, Any] = {"type": type_ or error_type(status_code), "message": message}
    if field is not None:
        err["field"] = field
    return {"error": err}


def error_response(status_code: int, message: str, field: str | None = None,
                   type_: str | None = None,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(error_body(status_code, message, field, type_),
                        status_code=status_code, headers=headers)


class ApiError(Exception):
    """An expected failure with its status, message and (optionally) the field to blame."""

    def __init__(self, status_code: int, message: str, field: str | None = None,
                 type_: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status_code = status_code
        self.message = message
        self.field = field
        self.type = type_
        self.headers = headers


def field_error(field: str, message: str) -> ApiError:
    """A 422 blaming one field, for rules checked outside the spec (e.g. dataset ownership)."""
    return ApiError(422, f"{field}: {message}", field=field)


class _RequestErrors:
    """Adapts FastAPI's error list to the `.errors()` that `trainer.spec.spec_errors` reads.

    FastAPI prefixes request-body locations with "body" (and query ones with "query"); the
    prefix is dropped for the body so that field paths read exactly as in the spec
    ("rollout.schedule.0.n"), while query/header/path parameters keep theirs so that
    "query.limit" says where to look.
    """

    def __init__(self, errors: list[dict[str, Any]]):
        self._errors = errors

    def errors(self, include_url: bool = False) -> list[dict[str, Any]]:
        out = []
        for err in self._errors:
            loc = tuple(err.get("loc", ()))
            if loc[:1] == ("body",):
                loc = loc[1:]
            out.append({**err, "loc": loc})
        return out


def flatten_validation(errors: list[dict[str, Any]]) -> list[dict[str, str]]:
    """[{field, message}] with dotted paths, FieldError paths resolved as in the spec."""
    return spec_errors(_RequestErrors(errors))  # type: ignore[arg-type]


async def _validation_handler(_: Request, exc: RequestValidationError) -> JSONResponse:
    items = flatten_validation(list(exc.errors()))
    if not items:  # defensive: pydantic always reports at least one
        return error_response(422, "invalid request")
    message = "; ".join(f"{i['field']}: {i['message']}" for i in items)
    return error_response(422, message, field=items[0]["field"])


async def _http_handler(_: Request, exc: StarletteHTTPException) -> JSONResponse:
    detail = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
    return error_response(exc.status_code, detail, headers=getattr(exc, "headers", None))


async def _api_handler(_: Request, exc: ApiError) -> JSONResponse:
    return error_response(exc.status_code, exc.message, exc.field, exc.type, exc.headers)


async def _not_found_handler(_: Request, exc: NotFound) -> JSONResponse:
    return error_response(404, str(exc) or "not found")


async def _conflict_handler(_: Request, exc: Exception) -> JSONResponse:
    # InvalidTransition names the job's current state ("job ... is succeeded"), which is what
    # the caller needs to know; IdempotencyConflict says the key was used with another body.
    type_ = "idempotency_conflict" if isinstance(exc, IdempotencyConflict) else "conflict"
    return error_response(409, str(exc) or "conflict", type_=type_)


async def _unhandled_handler(request: Request, exc: Exception) -> JSONResponse:
    # Logged with its traceback, answered without it: internals stay on the server.
    log.exception("unhandled error on %s %s", request.method, request.url.path)
    return error_response(500, "internal server error")


def install_error_handlers(app: FastAPI) -> None:
    """Register every handler on `app` so no response escapes the error shape."""
    app.add_exception_handler(RequestValidationError, _validation_handler)  # type: ignore[arg-type]
    app.add_exception_handler(StarletteHTTPException, _http_handler)  # type: ignore[arg-type]
    app.add_exception_handler(ApiError, _api_handler)  # type: ignore[arg-type]
    app.add_exception_handler(NotFound, _not_found_handler)  # type: ignore[arg-type]
    app.add_exception_handler(InvalidTransition, _conflict_handler)
    app.add_exception_handler(IdempotencyConflict, _conflict_handler)
    # Fenced is a worker-side error; reaching the API would be a bug, so it is a 409 rather
    # than a generic 500 only to keep the message useful.
    app.add_exception_handler(Fenced, _conflict_handler)
    app.add_exception_handler(Exception, _unhandled_handler)
