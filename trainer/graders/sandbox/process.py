"""One sandboxed server process: how it is started on a given layer, its framed pipes, and
how it and everything it started are killed.

The layer is an argument (`Server(layer, ...)`): which layer works here is decided in
detect.py, which uses `self_test` from here to try one, and the pool (pool.py) starts its
servers here on the layer detect.py chose. Frames are a 4-byte big-endian length and JSON,
both ways. Kill = SIGKILL to the server's process group; bwrap's --die-with-parent and its
pid namespace take every process inside down with it, and every sandbox process carries the
server's token in its command line (`processes_with`), so nothing a sample started survives.
"""
from __future__ import annotations

import json
import os
import select
import signal
import struct
import subprocess
import threading
import time
import uuid
from typing import Any

from trainer.graders.sandbox.layer import (
    Limits, release_uid, server_command, server_env, take_uid)

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
    """The server died or stopped answering while an item was in flight."""


class Server:
    """One sandboxed server process, running as a uid of its own, and its framed pipes."""

    def __init__(self, layer: str, mode: str, limits: Limits, tag: str):
        self.token = f"{tag}-{uuid.uuid4().hex}"
        self._kill_lock, self._dead = threading.Lock(), False
        self.uid = take_uid()
        ids = {} if self.uid is None else {"user": self.uid, "group": self.uid,
                                           "extra_groups": []}
        try:
            self.proc = subprocess.Popen(
                server_command(layer, mode, limits, self.uid) + [self.token],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                env=server_env(layer), start_new_session=True, close_fds=True, **ids)
        except BaseException:
            release_uid(self.uid)
            raise
        self.served = 0
        try:
            hello = self.recv(START_TIMEOUT_S)
        except SandboxFault as exc:
            raise SandboxFault(f"sandbox did not start ({exc}){self._failed_start()}") from None
        except BaseException:
            self.kill()
            raise
        if not hello.get("ready"):
            self.kill()
            raise SandboxFault(f"sandbox did not start: {hello.get('error')}")

    def _failed_start(self) -> str:
        """Kill, and what the server or bwrap printed before its pipes were set up (a
        missing library, a path its uid cannot reach)."""
        self.kill(close_stderr=False)
        try:
            text = self.proc.stderr.read()[-600:].decode("utf-8", "replace").strip()
        except (OSError, ValueError):
            text = ""
        finally:
            self.proc.stderr.close()
        return f": {text.splitlines()[-1]}" if text else ""

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
        except (ValueError, RecursionError):
            raise SandboxFault("garbled reply") from None

    def kill(self, close_stderr: bool = True) -> None:
        """SIGKILL bwrap and every process of this sandbox, and wait until all are gone.

        --die-with-parent alone takes the pid namespace down too, but asynchronously; the
        caller is promised that nothing of the sandbox runs once this returns. Every process
        of the sandbox carries the server's unique token in its command line (forked
        children inherit it), which finds them whatever their parentage. Safe to call from
        several threads and more than once.
        """
        self.kill_processes()
        for pipe in (self.proc.stdin, self.proc.stdout) + (
                (self.proc.stderr,) if close_stderr else ()):
            try:
                pipe.close()
            except (OSError, ValueError):
                pass

    def kill_processes(self) -> None:
        """Only the processes: a thread reading this server's pipe sees its end, and the
        pipe stays open until that thread discards the server (no descriptor is reused
        under a reader)."""
        with self._kill_lock:
            if not self._dead:
                self._kill_all()
                self._dead = True

    def _kill_all(self) -> None:
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
        self.proc.wait()
        release_uid(self.uid)

    def alive(self) -> bool:
        return self.proc.poll() is None


SELF_TEST_SOURCE = "import decimal, json\ndef grade(sample, item):\n    return 1.0\n"


def self_test(layer: str) -> str:
    """'' when a server on `layer` starts and grades one sample (importing an extension
    module of the standard library after its uid drop), else why not."""
    limits = Limits(timeout_s=20.0)
    try:
        server = Server(layer, "python", limits, "brorl-layer-self-test")
    except (SandboxFault, OSError) as exc:
        return str(exc)
    try:
        server.send({"id": "self-test", "source": SELF_TEST_SOURCE, "items": [[{}, {}]],
                     "timeout_s": limits.timeout_s})
        reply = server.recv(limits.timeout_s + 10)
    except SandboxFault as exc:
        return f"sandbox failed: {exc}"
    finally:
        server.kill()
    if reply.get("reward") != 1.0:
        return f"sandbox failed: {reply.get('fault') or reply.get('details')}"
    return ""
