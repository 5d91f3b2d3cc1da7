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
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict

from starlette.types import ASGIApp, Receive, Scope, Send

from api.errors import error_response
from api.guards import bearer_key_id

MAX_BUCKETS = 100_000


class TokenBuckets:
    def __init__(self, rate: float, burst: int, clock=time.monotonic):
        self.rate, self.burst, self.clock = rate, burst, clock
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # tokens, when

    def take(self, key: str) -> float:
        """0 if a token was taken, else the seconds until one is available."""
        now = self.clock()
        tokens, when = self._buckets.pop(key, (float(self.burst), now))
        tokens = min(self.burst, tokens + (now - when) * self.rate)
        wait = 0.0
        if tokens >= 1:
            tokens -= 1
        else:
            wait = (1 - tokens) / self.rate
        self._buckets[key] = (tokens, now)
        if len(self._buckets) > MAX_BUCKETS:
            self._buckets.popitem(last=False)
        return wait


class RateLimitMiddleware:
    def __init__(self, app: ASGIApp, rate: float, burst: int):
        self.app = app
        self.buckets = TokenBuckets(rate, burst) if rate > 0 else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.buckets is not None and scope["type"] == "http" and scope["path"].startswith("/v1/"):
            key = bearer_key_id(scope)
            wait = self.buckets.take(key) if key is not None else 0.0
            if wait > 0:
                retry = str(max(1, math.ceil(wait)))
                await error_response(
                    429, f"rate limit of {self.buckets.rate:g} requests/s per API key exceeded; "
                         f"retry after {retry} s", type_="rate_limited",
                    headers={"Retry-After": retry})(scope, receive, send)
                return
        await self.app(scope, receive, send)
