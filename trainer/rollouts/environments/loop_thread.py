"""An event loop on a daemon thread of its own: where an environment's coroutines live.

An environment's async resources (WebSocket sessions, a library's clients) are bound to the
loop that made them, while the multi-turn driver awaits from whatever loop it runs on; so the
OpenEnv and verifiers environments each keep one `LoopThread` and hand every coroutine to it.
"""
from __future__ import annotations

import asyncio
import threading
from concurrent.futures import Future
from typing import Any, Awaitable


class LoopThread:
    def __init__(self, name: str, stop_timeout_s: float):
        self.stop_timeout_s = stop_timeout_s
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self.thread.start()

    def submit(self, coro: Awaitable[Any]) -> Future:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    async def run(self, coro: Awaitable[Any]) -> Any:
        """Await `coro` from another loop: it runs on this one."""
        return await asyncio.wrap_future(self.submit(coro))

    def call(self, coro: Awaitable[Any], timeout: float | None = None) -> Any:
        """Run `coro` here and wait for it from a plain thread."""
        return self.submit(coro).result(timeout)

    def stop(self) -> None:
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=self.stop_timeout_s)
        if not self.thread.is_alive():
            self.loop.close()
