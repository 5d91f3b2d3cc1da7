"""Pooled sandboxes of one owner: a batch of samples is spread over a few servers.

A pool belongs to one owner (a job in the worker, one call in the API: `GraderRuntime`), so
no server ever serves two tenants. Starting a sandbox costs tens of milliseconds, so a pool
keeps at most `size` servers of one mode alive while its owner lives and sends them chunks
of work. Each request carries a fresh id; a server answers each item with one frame tagged
with that id and the item's index (anything else is a fault). When a server dies or stops
answering the item in flight is known: it gets the fault as its result, the server is
killed and replaced, and the rest of the chunk goes to a fresh server. Every item's wait is
bounded, so a batch always ends, and `map` polls its caller's stop check while it waits: a
cancel kills the servers within a fraction of a second.
A server is one `Server` of process.py (started, framed and killed there) on the layer that
detect.py found; a pool with no layer that meets the bar is refused (`require_layer`).
"""
from __future__ import annotations

import concurrent.futures
import queue
import threading
import time
import uuid
from typing import Any, Callable, Sequence

from trainer.graders.sandbox.detect import require_layer
from trainer.graders.sandbox.layer import Limits
from trainer.graders.sandbox.process import SandboxFault, Server

POLL_S = 0.2  # how often a waiting batch looks at its stop check


class Cancelled(Exception):
    """The batch was stopped from outside (its caller's stop check)."""


class SandboxPool:
    """At most `size` servers of one mode ("python" or "code") for one owner; `map`."""

    def __init__(self, mode: str, size: int = 2, limits: Limits | None = None,
                 tag: str = "brorl-grader", max_served: int = 20000):
        self.layer = require_layer()
        self.mode, self.size = mode, max(1, size)
        self.limits = limits or Limits.from_env()
        self.tag, self.max_served = tag, max_served
        self._idle: queue.Queue[Server] = queue.Queue()
        self._all: list[Server] = []
        self._lock = threading.Lock()
        self._closed = False
        self._cancel = threading.Event()
        self._batches = 0                     # maps in flight (close() waits them out)
        self._quiet = threading.Condition(self._lock)
        # bwrap's --die-with-parent is PR_SET_PDEATHSIG, which fires when the *thread* that
        # started it ends: servers are started from this one long-lived thread, not from
        # a batch's short-lived workers (whose exit would SIGKILL them after every batch).
        self._spawner = concurrent.futures.ThreadPoolExecutor(1, "sandbox-spawner")

    def _start(self) -> Server:
        server = self._spawner.submit(Server, self.layer, self.mode, self.limits,
                                      self.tag).result()
        with self._lock:
            self._all.append(server)
        return server

    def _discard(self, server: Server) -> None:
        server.kill()
        with self._lock:
            if server in self._all:
                self._all.remove(server)

    def _acquire(self) -> Server:
        if self._cancel.is_set():
            raise Cancelled
        try:
            server = self._idle.get_nowait()
        except queue.Empty:
            return self._start()
        if server.alive() and server.served < self.max_served:
            return server
        self._discard(server)
        return self._start()

    def _run_chunk(self, chunk: list[tuple[int, Any]], make_request: Callable[[list], dict],
                   item_timeout_s: float, results: list) -> None:
        """Results of a chunk's items; a fault is charged to the item in flight."""
        todo = list(chunk)
        spare_retry = True
        while todo:
            try:
                server = self._acquire()
            except Cancelled:
                return
            except (SandboxFault, OSError) as exc:
                for index, _ in todo:
                    results[index] = {"fault": f"sandbox could not start: {exc}"}
                return
            if self._cancel.is_set():  # stopped while this server was starting
                self._discard(server)
                return
            reused, answered = server.served > 0, False
            rid = uuid.uuid4().hex
            try:
                server.send({**make_request([payload for _, payload in todo]), "id": rid})
                for n in range(len(todo)):
                    reply = server.recv(item_timeout_s)
                    if reply.pop("id", None) != rid or reply.pop("i", None) != n:
                        raise SandboxFault("reply does not match its request")
                    results[todo[0][0]] = reply
                    answered = True
                    todo.pop(0)
                    server.served += 1
            except SandboxFault as exc:
                self._discard(server)
                if self._cancel.is_set():
                    return
                if reused and not answered and spare_retry:
                    # A reused server that died while idle is not this item's fault: one
                    # retry on a fresh server before the item is charged.
                    spare_retry = False
                    continue
                index, _ = todo.pop(0)
                results[index] = {"fault": str(exc)}
                continue
            self._idle.put(server)

    def map(self, payloads: Sequence[Any], make_request: Callable[[list], dict],
            item_timeout_s: float, chunk: int = 32,
            stop_check: Callable[[], None] | None = None) -> list[dict]:
        """One reply per payload, in order: the server's frame or {"fault": why}.

        `stop_check` is called every POLL_S while the batch runs; whatever it raises (the
        trainer's StopRequested) kills this pool's servers and is raised from here."""
        with self._lock:
            if self._closed:
                raise RuntimeError("sandbox pool is closed")
            self._batches += 1
        try:
            return self._map(payloads, make_request, item_timeout_s, chunk, stop_check)
        finally:
            with self._lock:
                self._batches -= 1
                self._quiet.notify_all()

    def _map(self, payloads, make_request, item_timeout_s, chunk, stop_check) -> list[dict]:
        results: list = [None] * len(payloads)
        indexed = list(enumerate(payloads))
        per = max(1, min(chunk, -(-len(indexed) // self.size)))
        chunks = [indexed[i:i + per] for i in range(0, len(indexed), per)]
        work: queue.Queue = queue.Queue()
        for c in chunks:
            work.put(c)

        def worker() -> None:
            while not self._cancel.is_set():
                try:
                    c = work.get_nowait()
                except queue.Empty:
                    return
                self._run_chunk(c, make_request, item_timeout_s, results)

        threads = [threading.Thread(target=worker, daemon=True)
                   for _ in range(min(self.size, len(chunks)))]
        for t in threads:
            t.start()
        try:
            for t in threads:
                while t.is_alive():
                    t.join(POLL_S)
                    if stop_check is not None:
                        stop_check()
        except BaseException:
            self._stop_all(threads)
            raise
        # Only a close() during the batch leaves an item unanswered.
        return [{"fault": "the sandbox pool was closed"} if r is None else r for r in results]

    def _stop_all(self, threads: list[threading.Thread]) -> None:
        """Kill every server (their waits end at once) and let the batch's threads go. A
        thread may be starting a server right now: kill again until every thread is out."""
        self._cancel.set()
        while any(t.is_alive() for t in threads):
            with self._lock:
                servers = list(self._all)
            for server in servers:
                server.kill_processes()
            for t in threads:
                t.join(POLL_S / 4)
        while not self._idle.empty():
            self._discard(self._idle.get_nowait())
        with self._lock:
            killed = list(self._all)
        for server in killed:
            self._discard(server)
        self._cancel.clear()

    def close(self, wait_s: float = 30.0) -> None:
        """Kill every server; nothing of the pool runs once this returns. A batch still in
        flight (another thread's `map`) is stopped first: its servers' processes are killed
        (its reads end), it takes no more work, and it returns a fault for every item it
        had not answered; the pipes are closed after it is out (never under a reader)."""
        with self._lock:
            self._closed = True
            if self._batches:
                self._cancel.set()
        deadline = time.monotonic() + wait_s
        while True:
            with self._lock:
                servers = list(self._all)
                if not self._batches or time.monotonic() >= deadline:
                    break
            for server in servers:
                server.kill_processes()
            with self._lock:
                self._quiet.wait(POLL_S / 4)
        with self._lock:
            servers, self._all = list(self._all), []
        for server in servers:
            server.kill()
        self._spawner.shutdown(wait=True)

    def __enter__(self) -> "SandboxPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
