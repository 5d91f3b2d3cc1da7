"""Text the database cannot store is refused at the edge, before any route runs.

PostgreSQL refuses NUL in text and JSONB columns (SQLite stores it, so the same request
used to be a 201 there and a 500 here). Every string a request carries into a query
passes through here or through the job spec's own check (`trainer.spec.text_problem`):
- a path holding NUL names nothing that can exist: 404, as any other unknown id;
- a query parameter (`after` cursors) or a header (`Idempotency-Key`) holding NUL is a
  422 naming it (`query.after`, `header.idempotency-key`).
Percent-decoding with UTF-8 replaces invalid bytes, so NUL is the one character left to
refuse here; lone surrogates can only arrive in JSON bodies and multipart fields, which the
spec and the upload route check.
"""

from __future__ import annotations

from urllib.parse import parse_qsl

from starlette.types import ASGIApp, Receive, Scope, Send

from api.errors import error_response

NUL = "\x00"


def _problem(scope: Scope) -> tuple[int, str, str | None] | None:
    if NUL in scope.get("path", ""):
        return 404, "not found", None
    query = scope.get("query_string", b"").decode("latin-1")
    for name, value in parse_qsl(query, keep_blank_values=True):
        if NUL in name or NUL in value:
            field = f"query.{name.replace(NUL, '')}"
            return 422, f"{field}: must not contain NUL (\\u0000) characters", field
    for name, value in scope.get("headers", ()):
        if b"\x00" in value:
            field = f"header.{name.decode('latin-1')}"
            return 422, f"{field}: must not contain NUL characters", field
    return None


class StorableTextMiddleware:
    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        problem = _problem(scope) if scope["type"] == "http" else None
        if problem is None:
            await self.app(scope, receive, send)
            return
        status, message, field = problem
        await error_response(status, message, field=field)(scope, receive, send)
