"""Pooled, long-lived sandboxes: a batch of samples is spread over a few runners.

Starting a sandbox costs tens of milliseconds, so a pool keeps `size` runners of one mode
alive and sends them chunks of work. A runner answers each item of a chunk with one frame
as soon as it is done, so when a runner dies or stops answering (a segfault, a C-level
hang, a killed process) the item in flight is known: it gets the fault as its result, the
runner is killed and replaced, and the rest of the chunk goes to the fresh runner. Every
item's wait is bounded (its timeout plus a grace), so a batch always ends.
Kill = SIGKILL to bwrap's process group; bwrap's --die-with-parent and its pid namespace
take every process inside down with it, so nothing a sample started survives.
"""
from __future__ import annotations

import concurrent.futures
import json
import os
import queue
import select
import signal
import struct
import subprocess
import threading
import time
import uuid
from typing import Any, Callable, Sequence

from trainer.graders.sandbox.layer import Limits, require_layer, runner_command, runner_env

START_TIMEOUT_S = 30.0
MAX_FRAME = 64 * 1024 * 1024


def processes_with(token: str) -> list[int]:
    """Live processes whose command line contains `token` (zombies have none)."""
    found, needle = [], token.encode()
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/cmdline", "rb") as f:
                    if needle in f.read():
                        found.append(int(name))
            except OSError:
                continue
    return found


class SandboxFault(Exception):
    """The runner died or stopped answering while an item was in flight."""


class Runner:
    """One sandboxed runner process and its framed pipes."""

    def __init__(self, layer: str, mode: str, limits: Limits, tag: str):
        self.token = f"{tag}-{uuid.uuid4().hex}"
        self.proc = subprocess.Popen(
            runner_command(layer, mode, limits) + [self.token], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=runner_env(layer),
            start_new_session=True, close_fds=True)
        self.served = 0
        try:
            hello = self.recv(START_TIMEOUT_S)
            if not hello.get("ready"):
                raise SandboxFault(f"sandbox did not start: {hello}")
        except BaseException:
            self.kill()
            raise

    def send(self, obj: Any) -> None:
        data = json.dumps(obj).encode()
        try:
            self.proc.stdin.write(struct.pack(">I", len(data)) + data)
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError) as exc:
            raise SandboxFault(f"sandbox is gone ({exc})") from None

    def _read(self, n: int, deadline: float) -> bytes:
        fd, out = self.proc.stdout.fileno(), bytearray()
        while len(out) < n:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise SandboxFault("unresponsive")
            chunk = os.read(fd, n - len(out))
            if not chunk:
                code = self.proc.poll()
                raise SandboxFault(f"sandbox died (exit status {code})" if code is not None
                                   else "sandbox closed its output")
            out += chunk
        return bytes(out)

    def recv(self, timeout_s: float) -> dict:
        deadline = time.monotonic() + timeout_s
        (size,) = struct.unpack(">I", self._read(4, deadline))
        if size > MAX_FRAME:
            raise SandboxFault("oversized reply")
        try:
            return json.loads(self._read(size, deadline))
        except ValueError:
            raise SandboxFault("garbled reply") from None

    def kill(self) -> None:
        """SIGKILL bwrap and every process of this sandbox, and wait until all are gone.

        --die-with-parent alone takes the pid namespace down too, but asynchronously; the
        caller is promised that nothing of the sandbox runs once this returns. Every process
        of the sandbox carries the runner's unique token in its command line (forked
        children inherit it), which finds them whatever their parentage.
        """
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline:
            left = processes_with(self.token)
            if not left:
                break
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            time.sleep(0.01)
        for pipe in (self.proc.stdin, self.proc.stdout):
            try:
                pipe.close()
            except OSError:
                pass
        self.proc.wait()

    def alive(self) -> bool:
        return self.proc.poll() is None


class SandboxPool:
    """`size` runners of one mode ("python" or "code"); thread-safe `map`."""

    def __init__(self, mode: str, size: int = 2, limits: Limits | None = None,
                 tag: str = "brorl-grader", max_served: int = 20000):
        self.layer = require_layer()
        self.mode, self.size = mode, max(1, size)
        self.limits = limits or Limits.from_env()
        self.tag, self.max_served = tag, max_served
        self._idle: queue.Queue[Runner] = queue.Queue()
        self._all: list[Runner] = []
        self._lock = threading.Lock()
        self._closed = False
        # bwrap's --die-with-parent is PR_SET_PDEATHSIG, which fires when the *thread* that
        # started it ends: runners are started from this one long-lived thread, not from
        # a batch's short-lived workers (whose exit would SIGKILL them after every batch).
        self._spawner = concurrent.futures.ThreadPoolExecutor(1, "sandbox-spawner")

    def _start(self) -> Runner:
        runner = self._spawner.submit(Runner, self.layer, self.mode, self.limits,
                                      self.tag).result()
        with self._lock:
            self._all.append(runner)
        return runner

    def _discard(self, runner: Runner) -> None:
        runner.kill()
        with self._lock:
            if runner in self._all:
                self._all.remove(runner)

    def _acquire(self) -> Runner:
        try:
            runner = self._idle.get_nowait()
        except queue.Empty:
            return self._start()
        if runner.alive() and runner.served < self.max_served:
            return runner
        self._discard(runner)
        return self._start()

    def _run_chunk(self, chunk: list[tuple[int, Any]], make_request: Callable[[list], dict],
                   item_timeout_s: float, results: list) -> None:
        """Results of a chunk's items; a fault is charged to the item in flight."""
        todo = list(chunk)
        spare_retry = True
        while todo:
            try:
                runner = self._acquire()
            except (SandboxFault, OSError) as exc:
                for index, _ in todo:
                    results[index] = {"fault": f"sandbox could not start: {exc}"}
                return
            restart, reused, answered = False, runner.served > 0, False
            try:
                runner.send(make_request([payload for _, payload in todo]))
                while todo and not restart:
                    index, _ = todo[0]
                    results[index] = runner.recv(item_timeout_s)
                    answered = True
                    todo.pop(0)
                    runner.served += 1
                    # The runner quits after a sample that left it unfit (stray threads,
                    # memory exhausted); the rest of the chunk goes to a fresh one.
                    restart = bool(results[index].pop("restart", False))
            except SandboxFault as exc:
                self._discard(runner)
                if reused and not answered and spare_retry:
                    # A reused runner that died while idle is not this item's fault: one
                    # retry on a fresh runner before the item is charged.
                    spare_retry = False
                    continue
                index, _ = todo.pop(0)
                results[index] = {"fault": str(exc)}
                continue
            if restart:
                self._discard(runner)
            else:
                self._idle.put(runner)

    def map(self, payloads: Sequence[Any], make_request: Callable[[list], dict],
            item_timeout_s: float, chunk: int = 32) -> list[dict]:
        """One reply per payload, in order: the runner's frame or {"fault": why}."""
        if self._closed:
            raise RuntimeError("sandbox pool is closed")
        results: list = [None] * len(payloads)
        indexed = list(enumerate(payloads))
        per = max(1, min(chunk, -(-len(indexed) // self.size)))
        chunks = [indexed[i:i + per] for i in range(0, len(indexed), per)]
        work: queue.Queue = queue.Queue()
        for c in chunks:
            work.put(c)

        def worker() -> None:
            while True:
                try:
                    c = work.get_nowait()
                except queue.Empty:
                    return
                self._run_chunk(c, make_request, item_timeout_s, results)

        threads = [threading.Thread(target=worker, daemon=True)
                   for _ in range(min(self.size, len(chunks)))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return results

    def close(self) -> None:
        self._closed = True
        with self._lock:
            runners, self._all = list(self._all), []
        for runner in runners:
            runner.kill()
        self._spawner.shutdown(wait=True)

    def __enter__(self) -> "SandboxPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
