"""Slow and greedy clients: body size and time limits, send timeouts, a per-key concurrency cap.

One pure ASGI middleware (BaseHTTPMiddleware would buffer responses and break streaming):

- JSON and other non-multipart bodies are read here, up to `max_json_bytes` (413 past it),
  and replayed to the app; a body that stalls for `body_idle_timeout_s` or is not complete
  after `body_timeout_s` is a 408. Multipart uploads stream to `api.upload`, which reads
  through the same timed `receive` (an `ApiError(408)` reaches the route's error handler).
- Every `send` must complete within `send_idle_timeout_s`: a client that stops reading a
  download or a stream is dropped instead of holding the connection for ever.
- Requests in flight per API key are capped at `max_concurrent_per_key` (429), and open
  metric streams at `max_streams_per_key` (429), so one key cannot occupy every worker
  thread or connection; requests without a key, at `max_concurrent_per_address` per client
  address. Counters live in this process: with several API processes the cap
  is per process.
The key is identified by a hash of the bearer token; unknown keys get their own counter but
are answered 401 (auth runs in a short session of its own, see api.deps) before any work.
A `/v1` request with a body is authenticated here, before one byte of the body is read: a
client without a valid key cannot hold a connection open by trickling a body (a 401 right
after its headers).
"""

from __future__ import annotations

import hashlib
import math
import time
from collections import defaultdict

import anyio
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from store.settings import Settings

from api.errors import ApiError, error_response

STREAM_SUFFIX = "/metrics/stream"


def bearer_key_id(scope: Scope) -> str | None:
    """A short hash of the request's bearer token, or None when it sends none."""
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            scheme, _, token = value.partition(b" ")
            if scheme.lower() == b"bearer" and token.strip():
                return hashlib.sha256(token.strip()).hexdigest()[:32]
    return None


def bearer_token(scope: Scope) -> str | None:
    """The request's bearer token, or None when it sends none."""
    value = _header(scope, b"authorization") or b""
    scheme, _, token = value.partition(b" ")
    token = token.strip()
    return token.decode("latin-1") if scheme.lower() == b"bearer" and token else None


async def _authenticated(scope: Scope) -> bool:
    from api.deps import tenant_for_key

    token = bearer_token(scope)
    return token is not None and await tenant_for_key(scope["app"].state, token) is not None


def _header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return value
    return None


class _Deadline:
    """`receive` with an idle timeout per message and a total deadline for the body."""

    def __init__(self, receive: Receive, idle_s: float, total_s: float):
        self._receive = receive
        self._idle = idle_s
        self._end = time.monotonic() + total_s
        self.done = False

    async def __call__(self) -> Message:
        if self.done:  # after the body: a disconnect wait (streams) is not a body timeout
            return await self._receive()
        budget = min(self._idle, self._end - time.monotonic())
        with anyio.move_on_after(max(budget, 0)) as scope:
            message = await self._receive()
        if scope.cancelled_caught:
            raise ApiError(408, "the request body arrived too slowly; send it faster or smaller",
                           type_="request_timeout")
        if message["type"] != "http.request" or not message.get("more_body", False):
            self.done = True
        return message


class GuardMiddleware:
    def __init__(self, app: ASGIApp, settings: Settings):
        self.app = app
        self.s = settings
        self.in_flight: dict[str, int] = defaultdict(int)
        self.streams: dict[str, int] = defaultdict(int)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        key = bearer_key_id(scope) if scope["path"].startswith("/v1/") else None
        is_stream = scope["path"].endswith(STREAM_SUFFIX)
        counters, cap = (self.streams, self.s.max_streams_per_key) if is_stream else (
            self.in_flight, self.s.max_concurrent_per_key)
        who = "API key"
        if key is None:  # no key: counted per client address instead
            client = scope.get("client")
            key, cap = f"addr:{client[0] if client else '?'}", self.s.max_concurrent_per_address
            who = "address without an API key"
        if counters[key] >= cap:
            what = "open metric streams" if is_stream else "requests in flight"
            await error_response(429, f"too many {what} for this {who} (at most {cap})",
                                 type_="too_many_requests", headers={"Retry-After": "1"})(
                scope, receive, send)
            return
        counters[key] += 1
        try:
            await self._guarded(scope, receive, send)
        finally:
            counters[key] -= 1
            if counters[key] <= 0:
                del counters[key]

    async def _guarded(self, scope: Scope, receive: Receive, send: Send) -> None:
        timed = _Deadline(receive, self.s.body_idle_timeout_s, self.s.body_timeout_s)
        send = self._timed_send(send)
        ctype = (_header(scope, b"content-type") or b"").lower()
        if scope["method"] in ("GET", "HEAD", "DELETE", "OPTIONS"):
            await self.app(scope, timed, send)
            return
        if scope["path"].startswith("/v1/") and not await _authenticated(scope):
            await error_response(401, "missing or invalid API key: send `Authorization: Bearer "
                                 "<key>`", headers={"WWW-Authenticate": "Bearer"})(
                scope, receive, send)
            return
        if ctype.startswith(b"multipart/form-data"):
            await self.app(scope, timed, send)
            return
        try:
            body = await self._read_body(scope, timed)
        except ApiError as exc:
            await error_response(exc.status_code, exc.message, type_=exc.type)(scope, receive, send)
            return
        await self.app(scope, _replay(body, receive), send)

    async def _read_body(self, scope: Scope, receive: _Deadline) -> bytes:
        limit = self.s.max_json_bytes
        length = _header(scope, b"content-length")
        if length is not None and length.isdigit() and int(length) > limit:
            raise ApiError(413, f"request body exceeds the limit of {limit} bytes")
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                break
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise ApiError(413, f"request body exceeds the limit of {limit} bytes")
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        return b"".join(chunks)

    def _timed_send(self, send: Send) -> Send:
        timeout = self.s.send_idle_timeout_s

        async def timed_send(message: Message) -> None:
            # fail_after raises TimeoutError: the app stops and the server drops the connection.
            with anyio.fail_after(timeout if math.isfinite(timeout) else None):
                await send(message)

        return timed_send


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()  # later calls wait for the disconnect, as the server's would

    return replay
