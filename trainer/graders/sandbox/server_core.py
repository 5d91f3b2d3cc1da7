"""The grader sandbox server's machinery shared by its modes (server.py runs the modes): the
frames, the per-sample timer, the server's own set-up, and the children tenant code runs in.

Runs inside the sandbox with server.py: standard library and confine.py only. `LIMITS` is
filled in place by server.py's `main` (so every module's `LIMITS` is the same dict) and
`SERVER_PID` set there.
"""
import errno
import io
import json
import os
import select
import signal
import struct
import sys
import tempfile
import time

import confine


LIMITS = {}
SERVER_PID = 0
GRACE_S = 2.0  # past a sample's own timer, before the server kills its child


class Timeout(BaseException):
    """Raised by the per-sample timer; a BaseException so `except Exception` misses it."""


_armed = False


def _on_alarm(signum, frame):
    # Only while a sample runs: a stray SIGALRM (a grader may send itself one) must not
    # break the child's own loop between samples.
    if _armed:
        raise Timeout()


def _read_exact(fd, n, deadline=None):
    chunks = []
    while n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise TimeoutError
        chunk = os.read(fd, n)
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def recv(fd, deadline=None, max_size=64 * 1024 * 1024):
    (size,) = struct.unpack(">I", _read_exact(fd, 4, deadline))
    if size > max_size:
        raise ValueError("oversized frame")
    return json.loads(_read_exact(fd, size, deadline))


def send(fd, obj):
    data = json.dumps(obj, default=repr).encode()
    data = struct.pack(">I", len(data)) + data
    while data:
        data = data[os.write(fd, data):]


# ---------------------------------------------------------------- the server's own setup

def _private_fds():
    """Protocol fds moved aside; 0 -> /dev/null, 1 and 2 -> the capped output file."""
    fd_in, fd_out = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    # A private, already-unlinked file: servers sharing a /tmp (the unsafe layer) never
    # see each other's output.
    out, path = tempfile.mkstemp(prefix="grader-output-", dir="/tmp")
    os.unlink(path)
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.close(null), os.close(out)
    return fd_in, fd_out


def _empty_tmp():
    """Nothing one request left in /tmp is there for the next: bubblewrap's private tmpfs
    only (elsewhere /tmp is the host's, and nothing of the sandbox can write there)."""
    if not LIMITS.get("private_tmp"):
        return
    for root, dirs, files in os.walk("/tmp", topdown=False):
        for name in files + dirs:
            path = os.path.join(root, name)
            try:
                if name in dirs and not os.path.islink(path):
                    os.chmod(path, 0o700)
                    os.rmdir(path)
                else:
                    os.unlink(path)
            except OSError:
                pass


# ---------------------------------------------------------------- inside a child

def _reset_streams():
    """Fresh sys.stdout/err on fds 1/2: a stream whose flush failed (file size limit) keeps
    its unwritten buffer and would fail again on every later sample."""
    for name, fd in (("stdout", 1), ("stderr", 2)):
        stream = getattr(sys, name)
        try:
            stream.flush()
        except (OSError, ValueError):
            replacement = open(os.dup(fd), "w", encoding="utf-8", errors="replace")
            setattr(sys, name, replacement)
            setattr(sys, f"__{name}__", replacement)


def _output_tail():
    _reset_streams()
    try:
        size = os.lseek(1, 0, os.SEEK_END)
        os.lseek(1, max(0, size - 2048), os.SEEK_SET)
        tail = os.read(1, 2048).decode("utf-8", "replace")
    except OSError:
        tail = ""
    try:
        os.ftruncate(1, 0)
        os.lseek(1, 0, os.SEEK_SET)
    except OSError:
        pass
    return tail


def _timed(fn, timeout_s):
    global _armed
    _armed = True
    signal.setitimer(signal.ITIMER_REAL, timeout_s)
    try:
        return fn()
    finally:
        _armed = False
        signal.setitimer(signal.ITIMER_REAL, 0)


def _error(exc):
    name = type(exc).__name__
    return f"{name}: {exc}"[:2000]


def _child(write_fd, work):
    """In a forked child: lose every descriptor but fds 0-2 and the result pipe, die with
    the server, fresh limits, the filter; then `work(write_fd)` and exit."""
    try:
        os.closerange(3, write_fd)
        os.closerange(write_fd + 1, 1024)
        confine.die_with(SERVER_PID)
        confine.rlimits(LIMITS)
        confine.lock_down(LIMITS)
        work(write_fd)
    finally:
        os._exit(0)


def _fork(work):
    """(pid, read fd) of a child running `work`."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        _child(write_fd, work)
    os.close(write_fd)
    return pid, read_fd


def _reap(pid, read_fd, kill=True):
    """Kill (if asked) and wait for a child; its wait status."""
    if kill:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    os.close(read_fd)
    return os.waitpid(pid, 0)[1]


def _death(status):
    if os.WIFSIGNALED(status):
        return f"killed by signal {os.WTERMSIG(status)}"
    return f"exited with status {os.WEXITSTATUS(status)}"



def _collect(read_fd, deadline):
    chunks, size, cap = [], 0, 2 * LIMITS["output_bytes"] + 65536
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([read_fd], [], [], left)[0]:
            return None, "timeout"
        chunk = os.read(read_fd, 65536)
        if not chunk:
            return b"".join(chunks), None
        size += len(chunk)
        if size > cap:
            return None, "output limit exceeded"
        chunks.append(chunk)


class _CappedText(io.StringIO):
    def write(self, s):
        if self.tell() + len(s) > LIMITS["output_bytes"]:
            raise OSError(errno.EFBIG, "output limit exceeded")
        return super().write(s)
