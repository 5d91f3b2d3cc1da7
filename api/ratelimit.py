"""Per-key rate limiting: a token bucket per API key, 429 with `Retry-After` when it is empty.

`rate_limit_per_s` tokens flow in per second up to `rate_limit_burst`; each `/v1` request
with a bearer key takes one. The defaults (20/s, burst 40) leave a browser dashboard polling
about once a second per page, plus its stream, far below the limit, while a client that loops
as fast as it can is slowed to 20 requests/s. Buckets live in this process (no Redis
round trip per request, and the embedded SQLite stack has no Redis): with several API
processes each has its own bucket, so the effective limit is per process. At most
`MAX_BUCKETS` keys are tracked; past that the least recently used are dropped (a dropped
bucket starts full again, which only ever errs towards letting a request through).
A token bucket is a dozen lines; the libraries for it (slowapi, limits) add a storage layer
and per-route decorators this app does not need.

Requests without a key are limited per client address instead: unauthenticated routes
(`/metrics`, `/readyz`, `/openapi.json`, `/docs`, the dashboard and its static files) share a
bucket of `anon_rate_limit_per_s` per address, and every 401 takes a token from the
address's failed-authentication bucket (`auth_failures_per_s`); once that is empty, the
address's requests are 429 before any key lookup, unless they carry a key found valid
recently (api.deps' cache). Guessing keys, or hammering the probes, then costs the server a
dictionary lookup per request. The address is the ASGI client's: behind a reverse proxy,
run uvicorn with `--proxy-headers` and `--forwarded-allow-ips` so that it is the real client's.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from store.settings import Settings

from api.errors import error_response
from api.deps import cached_tenant
from api.guards import bearer_key_id, bearer_token

MAX_BUCKETS = 100_000


class TokenBuckets:
    def __init__(self, rate: float, burst: int, clock=time.monotonic):
        self.rate, self.burst, self.clock = rate, burst, clock
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # tokens, when

    def take(self, key: str, cost: int = 1) -> float:
        """0 if a token was taken (`cost` 0: only looked at), else the seconds until one is
        available."""
        now = self.clock()
        tokens, when = self._buckets.pop(key, (float(self.burst), now))
        tokens = min(self.burst, tokens + (now - when) * self.rate)
        wait = 0.0
        if tokens >= 1:
            tokens -= cost
        else:
            wait = (1 - tokens) / self.rate
        self._buckets[key] = (tokens, now)
        if len(self._buckets) > MAX_BUCKETS:
            self._buckets.popitem(last=False)
        return wait


def _too_many(wait: float, what: str):
    retry = str(max(1, math.ceil(wait)))
    return error_response(429, f"{what}; retry after {retry} s", type_="rate_limited",
                          headers={"Retry-After": retry})


def _address(scope: Scope) -> str:
    client = scope.get("client")
    return client[0] if client else "unknown"


class RateLimitMiddleware:
    def __init__(self, app: ASGIApp, settings: Settings):
        self.app = app
        s = settings
        self.buckets = (TokenBuckets(s.rate_limit_per_s, s.rate_limit_burst)
                        if s.rate_limit_per_s > 0 else None)
        self.anon = (TokenBuckets(s.anon_rate_limit_per_s, s.anon_rate_limit_burst)
                     if s.anon_rate_limit_per_s > 0 else None)
        self.failures = (TokenBuckets(s.auth_failures_per_s, s.auth_failures_burst)
                         if s.auth_failures_per_s > 0 else None)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        refusal = self._refusal(scope)
        if refusal is not None:
            await refusal(scope, receive, send)
            return
        if self.failures is None:
            await self.app(scope, receive, send)
            return
        address = _address(scope)

        async def counting_send(message: Message) -> None:
            if message["type"] == "http.response.start" and message["status"] == 401:
                self.failures.take(address)
            await send(message)

        await self.app(scope, receive, counting_send)

    def _refusal(self, scope: Scope):
        """The 429 response for this request, or None to let it through."""
        key = bearer_key_id(scope) if scope["path"].startswith("/v1/") else None
        address = _address(scope)
        if self.failures is not None:
            wait = self.failures.take(address, cost=0)
            token = bearer_token(scope)
            if wait > 0 and (token is None or cached_tenant(scope["app"].state, token) is None):
                return _too_many(wait, "too many failed authentications from this address")
        if key is not None:
            wait = self.buckets.take(key) if self.buckets is not None else 0.0
            if wait > 0:
                return _too_many(wait, f"rate limit of {self.buckets.rate:g} requests/s per "
                                       f"API key exceeded")
            return None
        if self.anon is not None:
            wait = self.anon.take(address)
            if wait > 0:
                return _too_many(wait, f"rate limit of {self.anon.rate:g} requests/s per "
                                       f"address without an API key exceeded")
        return None
