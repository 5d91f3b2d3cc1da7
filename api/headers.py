"""Response headers and logs that protect the tenant's key: CSP everywhere, trusted hosts,
query strings out of the access log.

- Every response gets a Content-Security-Policy with `frame-ancestors 'none'` (and
  `X-Frame-Options: DENY`, `nosniff`, `no-referrer`) unless its route set its own: the
  dashboard's pages set theirs (`api.web.CSP`); `/docs` and `/redoc`, which share the
  dashboard's origin and so could read the key it keeps in sessionStorage, get a policy that
  allows Swagger UI's one inline script and nothing from elsewhere; static files and JSON
  get the dashboard's policy. No page of this origin can be framed by another site.
- `BRORL_ALLOWED_HOSTS` (comma-separated; default `*`) is starlette's TrustedHostMiddleware:
  a request for another Host is a 400, so a forged Host never reaches a redirect's Location.
- uvicorn's access log writes the path with its query string; keys sent as `?api_key=` are
  refused by the API but would still be written there. A filter on the `uvicorn.access`
  logger keeps each parameter's name and replaces its value.
"""

from __future__ import annotations

import logging
from urllib.parse import parse_qsl

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.web import CSP

DOCS_CSP = ("default-src 'self'; script-src 'self' 'unsafe-inline'; "
            "style-src 'self' 'unsafe-inline'; img-src 'self' data:; worker-src 'self' blob:; "
            "connect-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'; "
            "form-action 'self'")
DOCS_PATHS = ("/docs", "/redoc")
REDACTED = "<redacted>"


class SecurityHeadersMiddleware:
    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        csp = DOCS_CSP if scope["path"].startswith(DOCS_PATHS) else CSP
        extra = [(b"content-security-policy", csp.encode()), (b"x-frame-options", b"DENY"),
                 (b"x-content-type-options", b"nosniff"), (b"referrer-policy", b"no-referrer")]

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                present = {name.lower() for name, _ in headers}
                headers += [(k, v) for k, v in extra if k not in present]
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_headers)


def redact_query(path: str) -> str:
    """`/p?a=1&api_key=s` -> `/p?a=<redacted>&api_key=<redacted>`."""
    base, sep, query = path.partition("?")
    if not sep:
        return path
    names = [name for name, _ in parse_qsl(query, keep_blank_values=True)] or ["?"]
    return base + "?" + "&".join(f"{name}={REDACTED}" for name in names)


class RedactQueryFilter(logging.Filter):
    """Rewrites uvicorn's access-log record: (client, method, path?query, version, status)."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) >= 3 and isinstance(args[2], str):
            record.args = (*args[:2], redact_query(args[2]), *args[3:])
        return True


def install_access_log_filter() -> None:
    logger = logging.getLogger("uvicorn.access")
    if not any(isinstance(f, RedactQueryFilter) for f in logger.filters):
        logger.addFilter(RedactQueryFilter())
