"""The program that runs INSIDE a grader sandbox: a long-lived server of grading requests.

Standard library plus `pyseccomp` only, and run as a plain script (`python -I runner.py
MODE LIMITS`): the sandbox shows it none of the project's code. Frames on stdin/stdout are a
4-byte length and JSON. Before any tenant code runs the runner
- moves its protocol pipes to private descriptors and points fds 0/1/2 at /dev/null and a
  private output file whose size RLIMIT_FSIZE caps (so printing 1 GB fails);
- sets rlimits (address space, open files, file size, no core files, processes) and marks
  itself non-dumpable (no /proc/<pid>/mem or fd access from its children);
- installs a seccomp filter (`_lock_down`): no fork/exec (so no fork bombs, daemons or
  shells), signals only to itself, no ptrace, no sockets but AF_UNIX;
- in the fallback layer (no bubblewrap), restricts itself with Landlock (`_landlock`).
Mode "python": the runner locks itself down, then runs `grade(sample, item)` in-process
for each sample of a request (compiled once per source), each under a wall-clock timer.
Mode "code": the runner stays unlocked (it must fork) but runs no tenant code; each program
runs in a forked child that locks itself down first and only returns its raw outputs. The
verdict (did the output match?) is computed outside the sandbox, by the caller, which never
sends the expected outputs in: a program cannot write its own score.
"""
import ctypes
import errno
import io
import json
import math
import os
import resource
import select
import signal
import socket
import struct
import sys
import tempfile
import time

LIMITS = {}


class Timeout(BaseException):
    """Raised by the per-sample timer; a BaseException so `except Exception` misses it."""


_armed = False


def _on_alarm(signum, frame):
    # Only while a sample runs: a stray SIGALRM (a grader may send itself one) must not
    # break the runner's own loop between samples.
    if _armed:
        raise Timeout()


def _read_exact(fd, n):
    chunks = []
    while n:
        chunk = os.read(fd, n)
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def recv(fd):
    (size,) = struct.unpack(">I", _read_exact(fd, 4))
    return json.loads(_read_exact(fd, size))


def send(fd, obj):
    data = json.dumps(obj, default=repr).encode()
    data = struct.pack(">I", len(data)) + data
    while data:
        data = data[os.write(fd, data):]


def _rlimits(address_space):
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_FSIZE, (LIMITS["file_bytes"],) * 2)
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
    resource.setrlimit(resource.RLIMIT_NPROC, (LIMITS["processes"],) * 2)
    if address_space:
        resource.setrlimit(resource.RLIMIT_AS, (LIMITS["memory_bytes"],) * 2)


def _lock_down():
    """The seccomp filter: deny process creation, exec, foreign signals, ptrace, sockets."""
    import pyseccomp as sc

    pid = os.getpid()
    deny = sc.ERRNO(errno.EPERM)
    f = sc.SyscallFilter(defaction=sc.ALLOW)
    for name in ("fork", "vfork", "execve", "execveat", "ptrace", "process_vm_writev",
                 "process_vm_readv", "pidfd_open", "pidfd_send_signal", "pidfd_getfd",
                 "tkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo", "setpgid", "setsid",
                 "unshare", "setns", "mount", "personality", "userfaultfd", "bpf",
                 "perf_event_open", "keyctl", "add_key", "request_key", "io_uring_setup"):
        f.add_rule(deny, name)
    # clone without CLONE_THREAD (0x10000) makes a process; threads stay allowed.
    f.add_rule(deny, "clone", sc.Arg(0, sc.MASKED_EQ, 0x10000, 0))
    # clone3 hides its flags in memory, where seccomp cannot look: ENOSYS makes libc fall
    # back to clone (what container runtimes do).
    f.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")
    f.add_rule(deny, "kill", sc.Arg(0, sc.NE, pid))
    f.add_rule(deny, "tgkill", sc.Arg(0, sc.NE, pid))
    if LIMITS.get("landlock"):
        # No network namespace here: no sockets at all (a Unix socket on the host's
        # filesystem could reach a database).
        f.add_rule(sc.ERRNO(errno.EAFNOSUPPORT), "socket")
        f.add_rule(sc.ERRNO(errno.EAFNOSUPPORT), "socketpair")
    else:
        f.add_rule(sc.ERRNO(errno.EAFNOSUPPORT), "socket", sc.Arg(0, sc.NE, socket.AF_UNIX))
        f.add_rule(sc.ERRNO(errno.EAFNOSUPPORT), "socketpair",
                   sc.Arg(0, sc.NE, socket.AF_UNIX))
    f.load()


def _landlock(read_paths):
    """The fallback layer's filesystem and network bounds (Linux Landlock, unprivileged).

    Read and execute only under `read_paths` (the Python installation and libraries) and
    read/write on /dev/null; nothing is writable (the output file was opened before). ABI 4+
    also forbids TCP bind/connect, ABI 6+ signals and abstract sockets outside the domain.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    abi = libc.syscall(444, None, 0, 1)  # landlock_create_ruleset(NULL, 0, VERSION)
    if abi < 1:
        raise OSError(ctypes.get_errno(), "Landlock is not available")
    fs = (1 << {1: 13, 2: 14, 3: 15, 4: 15}.get(abi, 16)) - 1
    attr = struct.pack("QQQ", fs, 3 if abi >= 4 else 0, 3 if abi >= 6 else 0)
    size = 8 if abi < 4 else 16 if abi < 6 else 24
    ruleset = libc.syscall(444, ctypes.c_char_p(attr[:size]), size, 0)
    if ruleset < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset failed")
    read, file_only = 1 | 4 | 8, 1 | 2 | 4 | (1 << 14) | (1 << 15)
    rules = [(p, read) for p in read_paths] + [(os.devnull, 2 | 4)]
    for path, access in rules:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        if not os.path.isdir(path):
            access &= file_only
        rule = struct.pack("=Qi", access & fs, fd)
        if libc.syscall(445, ruleset, 1, ctypes.c_char_p(rule), 0) < 0:
            raise OSError(ctypes.get_errno(), f"landlock_add_rule failed for {path}")
        os.close(fd)
    libc.prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS
    if libc.syscall(446, ruleset, 0) < 0:
        raise OSError(ctypes.get_errno(), "landlock_restrict_self failed")
    os.close(ruleset)


def _private_fds():
    """Protocol fds moved aside; 0 -> /dev/null, 1 and 2 -> the capped output file."""
    fd_in, fd_out = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    # A private, already-unlinked file: runners sharing a /tmp (the unsafe layer) never
    # see each other's output.
    out, path = tempfile.mkstemp(prefix="grader-output-", dir="/tmp")
    os.unlink(path)
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.close(null), os.close(out)
    return fd_in, fd_out


def _non_dumpable():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 4


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
    os.ftruncate(1, 0)
    os.lseek(1, 0, os.SEEK_SET)
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


# ---------------------------------------------------------------------------- python mode

_GRADERS = {}


def _grade_fn(source):
    if source not in _GRADERS:
        if len(_GRADERS) > 8:
            _GRADERS.clear()
        namespace = {"__name__": "grader"}
        exec(compile(source, "grader.py", "exec"), namespace)
        fn = namespace.get("grade")
        if not callable(fn):
            raise TypeError("source defines no grade(sample, item)")
        _GRADERS[source] = fn
    return _GRADERS[source]


def _one_python(source, sample, item, timeout_s):
    def run():
        value = _grade_fn(source)(sample, item)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"grade() returned {type(value).__name__}, not a number")
        value = float(value)
        if not math.isfinite(value):
            raise ValueError(f"grade() returned {value}")
        return value

    try:
        return {"reward": _timed(run, timeout_s), "error": None}
    except Timeout:
        return {"reward": None, "error": "timeout", "details": f"over {timeout_s} s"}
    except BaseException as exc:  # noqa: BLE001 - the tenant's error is the sample's result
        if isinstance(exc, (SystemExit, KeyboardInterrupt, GeneratorExit)):
            exc = RuntimeError(f"grade() raised {type(exc).__name__}")
        return {"reward": None, "error": "runtime", "details": _error(exc)}


def serve_python(fd_in, fd_out):
    """Grade samples in-process; quit (the pool starts a fresh runner for the rest) after a
    sample that left threads running or ran out of memory, which would otherwise slow down
    or fail the samples after it."""
    import threading

    _lock_down()
    while True:
        request = recv(fd_in)
        for sample, item in request["samples"]:
            result = _one_python(request["source"], sample, item, request["timeout_s"])
            result["output"] = _output_tail()
            result["restart"] = (threading.active_count() > 1
                                 or str(result.get("details", "")).startswith("MemoryError"))
            send(fd_out, result)
            if result["restart"]:
                os._exit(0)


# ---------------------------------------------------------------------------- code mode

class _CappedText(io.StringIO):
    def write(self, s):
        if self.tell() + len(s) > LIMITS["output_bytes"]:
            raise OSError(errno.EFBIG, "output limit exceeded")
        return super().write(s)


def _run_test(source, test, namespace, timeout_s):
    out = _CappedText()
    sys.stdout = out
    try:
        if "stdin" in test:
            sys.stdin = io.StringIO(test["stdin"])
            _timed(lambda: exec(compile(source, "program.py", "exec"),
                                {"__name__": "__main__"}), timeout_s)
            return {"stdout": out.getvalue()}
        value = _timed(lambda: eval(compile(test["call"], "test", "eval"), namespace),
                       timeout_s)
        if test.get("truth"):
            return {"value": bool(value)}
        json.dumps(value)  # a value JSON cannot carry is compared as its repr, i.e. fails
        return {"value": value}
    except Timeout:
        return {"error": "timeout"}
    except SystemExit as exc:  # sys.exit() in a stdin program ends that program normally
        if "stdin" in test and exc.code in (None, 0):
            return {"stdout": out.getvalue()}
        return {"error": _error(exc)}
    except BaseException as exc:  # noqa: BLE001
        return {"error": _error(exc)}
    finally:
        sys.stdout = sys.__stdout__


def _program_child(program, timeout_s, write_fd):
    """In the forked child: lock down, run every test, write raw results, exit."""
    for fd in range(3, 256):
        if fd != write_fd:
            try:
                os.close(fd)
            except OSError:
                pass
    cpu = int(math.ceil(timeout_s * len(program["tests"]))) + 1
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    _rlimits(address_space=True)
    _lock_down()
    namespace = {"__name__": "program"}
    results = []
    try:
        if any("call" in t for t in program["tests"]):
            _timed(lambda: exec(compile(program["source"], "program.py", "exec"), namespace),
                   timeout_s)
    except BaseException as exc:  # noqa: BLE001 - every call test then fails with this
        results = [{"error": _error(exc)} for _ in program["tests"]]
    if not results:
        results = [_run_test(program["source"], t, namespace, timeout_s)
                   for t in program["tests"]]
    data = json.dumps(results, default=repr).encode()
    while data:
        data = data[os.write(write_fd, data):]
    os._exit(0)


def _collect(pid, read_fd, deadline):
    chunks, size, cap = [], 0, 2 * LIMITS["output_bytes"] + 65536
    while True:
        left = deadline - time.monotonic()
        ready = select.select([read_fd], [], [], max(0.0, left))[0] if left > 0 else []
        if not ready:
            os.kill(pid, signal.SIGKILL)
            return None, "timeout"
        chunk = os.read(read_fd, 65536)
        if not chunk:
            break
        size += len(chunk)
        if size > cap:
            os.kill(pid, signal.SIGKILL)
            return None, "output limit exceeded"
        chunks.append(chunk)
    return b"".join(chunks), None


def _one_program(program, timeout_s):
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(read_fd)
            _program_child(program, timeout_s, write_fd)
        finally:
            os._exit(70)
    os.close(write_fd)
    deadline = time.monotonic() + timeout_s * len(program["tests"]) + 1.0
    try:
        data, error = _collect(pid, read_fd, deadline)
    finally:
        os.close(read_fd)
        _, status = os.waitpid(pid, 0)
    if error is None and os.WIFSIGNALED(status):
        error = f"killed by signal {os.WTERMSIG(status)}"
    if error is None:
        try:
            return {"results": json.loads(data), "error": None}
        except ValueError:
            error = "program corrupted its result stream"
    return {"results": None, "error": error}


def serve_code(fd_in, fd_out):
    while True:
        request = recv(fd_in)
        for program in request["programs"]:
            send(fd_out, _one_program(program, request["timeout_s"]))


def main():
    global LIMITS
    mode, LIMITS = sys.argv[1], json.loads(sys.argv[2])
    signal.signal(signal.SIGALRM, _on_alarm)
    import pyseccomp  # noqa: F401 - now, once: finding libseccomp runs ldconfig (a fork)
    fd_in, fd_out = _private_fds()
    if LIMITS.get("landlock"):
        _landlock(LIMITS["landlock"])
        os.chdir("/")
    else:
        os.chdir("/tmp")
    _rlimits(address_space=(mode == "python"))
    _non_dumpable()
    send(fd_out, {"ready": True, "pid": os.getpid()})
    try:
        (serve_python if mode == "python" else serve_code)(fd_in, fd_out)
    except EOFError:
        os._exit(0)


if __name__ == "__main__":
    main()
