"""The program that runs INSIDE a grader sandbox: a server of grading requests that runs no
tenant code itself.

Standard library, `pyseccomp` and confine.py beside it only, and run as a plain script
(`python -I server.py MODE CONFIG`): the sandbox shows it none of the project's other code. Frames on its stdin/stdout are
a 4-byte length and JSON. At start the server
- asks to die with its parent (no server outlives the service) and moves its protocol pipes to
  private descriptors; fds 0/1/2 become /dev/null and a private, unlinked output file whose
  size RLIMIT_FSIZE caps;
- restricts itself with Landlock in the fallback layer, sets no-new-privileges,
  its rlimits (address space, files, file size, processes, no core, no real-time or raised
  priority) and marks itself non-dumpable (no /proc/<pid>/mem, fd or ptrace access to it).
Tenant code runs only in children the server forks (`_child`): each closes every descriptor
but its result pipe, sets fresh rlimits (so nothing an earlier program did to its limits
carries over), and installs the allow-list seccomp filter before any tenant
code runs. A child's results come back through its own pipe; the server checks each one and
frames it, tagged with the request's id and the item's index, so a child can never write a
frame the caller reads. Mode "python": one child grades a request's samples in turn
(`grade(sample, item)`, compiled once per child), each under a timer; a child that crashes,
hangs or leaves threads behind is killed and the next sample gets a fresh one. Mode "code":
one child per program, which returns only its raw outputs; the verdict is computed by the
caller, which never sends the expected outputs in. Mode "tools" (multi-turn tool
environments, trainer.rollouts.environments.tools_env): one child per tool call, which loads
the tenant's tools source, replays the trajectory's earlier calls with their output
discarded (that is the trajectory's state) and runs the call with its output captured and
capped; /tmp is emptied after every call. Between requests /tmp is emptied.
"""
import ast
import errno
import io
import json
import math
import os
import resource
import select
import signal
import struct
import sys
import tempfile
import time

# -I leaves the script's folder off sys.path: confine.py lives beside this file.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import confine  # noqa: E402

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


# ---------------------------------------------------------------------------- python mode

_GRADERS = {}


def _grade_fn(source):
    if source not in _GRADERS:
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


def _count_threads():
    """A flag list that fills when tenant code starts a thread. `_thread._count()` alone
    misses a thread that has not begun to run yet; `threading` takes the wrapped function
    when the grader imports it (the server never imports threading)."""
    import _thread

    started, start = [], _thread.start_new_thread

    def counted(*args, **kwargs):
        started.append(1)
        return start(*args, **kwargs)

    _thread.start_new_thread = counted
    return lambda: bool(started) or _thread._count() > 0


def _python_child(request, start):
    """The child's work: grade samples start.. in turn, one frame each; stop after a sample
    that started threads or ran out of memory (the server forks a fresh child for the rest:
    a stray thread must not touch the samples after its own)."""

    def work(write_fd):
        threads_started = _count_threads()
        for sample, item in request["items"][start:]:
            result = _one_python(request["source"], sample, item, request["timeout_s"])
            result["output"] = _output_tail()
            result["restart"] = threads_started() or str(
                result.get("details", "")).startswith("MemoryError")
            send(write_fd, result)
            if result["restart"]:
                return
    return work


def _checked_python(reply):
    """Only the fields a result has, of the types it has: nothing else crosses."""
    if not isinstance(reply, dict):
        raise ValueError("not a result")
    reward = reply.get("reward")
    if reward is not None and (isinstance(reward, bool) or not isinstance(reward, (int, float))
                               or not math.isfinite(reward)):
        raise ValueError("bad reward")
    error = reply.get("error")
    if error not in (None, "timeout", "runtime"):
        raise ValueError("bad error")
    return {"reward": reward, "error": error, "details": str(reply.get("details") or "")[:2000],
            "output": str(reply.get("output") or "")[:2048]}


def serve_python(request, reply):
    items, timeout_s, n = request["items"], request["timeout_s"], 0
    while n < len(items):
        pid, read_fd = _fork(_python_child(request, n))
        exited = False
        try:
            while n < len(items):
                try:
                    raw = recv(read_fd, time.monotonic() + timeout_s + GRACE_S, 1 << 20)
                    result = _checked_python(raw)
                    restart = raw.get("restart") is True
                except TimeoutError:
                    reply(n, {"reward": None, "error": "timeout",
                              "details": f"over {timeout_s} s (killed)"})
                    n += 1
                    break
                except EOFError:
                    status = _reap(pid, read_fd, kill=False)
                    exited = True
                    if n < len(items):  # the child died on this sample (or quit unfit)
                        reply(n, {"fault": f"grader process {_death(status)}"})
                        n += 1
                    break
                except (ValueError, struct.error, RecursionError):
                    reply(n, {"fault": "grader process corrupted its result stream"})
                    n += 1
                    break
                reply(n, result)
                n += 1
                if restart:
                    break
        finally:
            if not exited:
                _reap(pid, read_fd)


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


def _program_work(program, timeout_s, budget_s):
    def work(write_fd):
        cpu = int(math.ceil(budget_s)) + 1
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
        namespace = {"__name__": "program"}
        results = []
        try:
            if any("call" in t for t in program["tests"]):
                _timed(lambda: exec(compile(program["source"], "program.py", "exec"),
                                    namespace), timeout_s)
        except BaseException as exc:  # noqa: BLE001 - every call test then fails with this
            results = [{"error": _error(exc)} for _ in program["tests"]]
        if not results:
            results = [_run_test(program["source"], t, namespace, timeout_s)
                       for t in program["tests"]]
        data = json.dumps(results, default=repr).encode()
        while data:
            data = data[os.write(write_fd, data):]
    return work


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


def _one_program(program, timeout_s, cap_s):
    # Each test has its own timer; the program as a whole has the operator's per-sample
    # bound too, whatever the number of tests.
    budget_s = min(timeout_s * max(1, len(program["tests"])), cap_s)
    pid, read_fd = _fork(_program_work(program, timeout_s, budget_s))
    data, error = _collect(read_fd, time.monotonic() + budget_s + 1.0)
    status = _reap(pid, read_fd, kill=error is not None)
    if error is None and os.WIFSIGNALED(status):
        error = f"killed by signal {os.WTERMSIG(status)}"
    if error is None:
        try:
            results = json.loads(data)
            json.dumps(results)  # what cannot travel back (nested too deep) is a failure here
            return {"results": results, "error": None}
        except (ValueError, RecursionError):
            error = "program corrupted its result stream"
    return {"results": None, "error": error}


def serve_code(request, reply):
    for n, program in enumerate(request["items"]):
        reply(n, _one_program(program, request["timeout_s"], request["cap_s"]))


# ---------------------------------------------------------------------------- tools mode

class _Discard(io.TextIOBase):
    """Where a replayed call's output goes: nowhere (and never over a limit)."""

    def writable(self):
        return True

    def write(self, s):
        return len(s)


def _cut(text, limit):
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n[... {len(text) - limit} more characters cut]"


def _tool_text(value, printed):
    """A tool's answer as text: a str as it is, None as what it printed, anything else as
    JSON (its repr where JSON cannot carry it)."""
    if value is None:
        return printed
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value)
    except (TypeError, ValueError, RecursionError):
        return repr(value)


def _run_cell(code, namespace):
    """Run a code interpreter cell: statements, then the value of a final expression
    printed (as a notebook shows it)."""
    tree = ast.parse(code, "<cell>")
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    exec(compile(tree, "<cell>", "exec"), namespace)
    if last is not None:
        value = eval(compile(last, "<cell>", "eval"), namespace)
        if value is not None:
            print(repr(value))


def _call_tool(call, tools, shell):
    """Run one call (output already redirected); its return value."""
    if call.get("interpreter"):
        return _run_cell(call["arguments"]["code"], shell)
    fn = tools.get(call["name"])
    if not callable(fn) or (call["name"].startswith("_") and not call.get("reward")):
        raise NameError(f"no tool named {call['name']!r}")
    return fn(**call["arguments"])


def _where(exc):
    """' (line N)' of the innermost frame of the tenant's own code, if any."""
    tb, line = exc.__traceback__, None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename in ("<cell>", "tools.py"):
            line = tb.tb_lineno
        tb = tb.tb_next
    if isinstance(exc, SyntaxError):
        return ""  # its message names the line
    return f" (line {line})" if line else ""


def _tool_work(items, n, timeout_s, replay_s):
    """A child's work: load the tools, replay the trajectory's earlier calls with their
    output discarded (the trajectory's state), then run the call with its output captured."""
    item = items[n]

    def work(write_fd):
        import random

        for other in items:  # the batch's other calls are none of this one's business
            if other is not item:
                other.clear()

        cpu = int(math.ceil(timeout_s * 2 + replay_s)) + 1
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
        random.seed(item["seed"])  # replays draw the same numbers as the first run
        tools, shell = {"__name__": "tools"}, {"__name__": "__main__"}
        limit = item["max_chars"]
        result = None
        sys.stdout = sys.stderr = _Discard()
        start = time.monotonic()
        if item.get("source") is not None:
            try:
                _timed(lambda: exec(compile(item["source"], "tools.py", "exec"), tools),
                       timeout_s)
            except Timeout:
                result = {"error": "timeout", "content": f"loading the tools took over "
                          f"{timeout_s:g} s"}
            except BaseException as exc:  # noqa: BLE001 - the tenant's error, reported
                result = {"error": "setup", "content": "loading the tools failed: "
                          + _error(exc) + _where(exc)}
        if result is None and item["history"]:
            def replay():
                for earlier in item["history"]:
                    if item.get("reward") and earlier.get("interpreter"):
                        # The reward judges what the tools did: the model's own code
                        # (which could reach the tools' globals) is not replayed for it.
                        continue
                    try:
                        _call_tool(earlier, tools, shell)
                    except Timeout:
                        raise
                    except BaseException:  # noqa: BLE001 - it failed the first time too
                        pass
            try:
                _timed(replay, replay_s)
            except Timeout:
                result = {"error": "replay", "content": "restoring this conversation's "
                          f"state (its earlier calls) took over {replay_s:g} s"}
        if result is None:
            out = _CappedText()
            sys.stdout = sys.stderr = out
            began = time.monotonic()
            def call():
                value = _call_tool(item, tools, shell)
                # Under the timer too: a returned object's repr is the tenant's code.
                return (out.getvalue() if item.get("interpreter")
                        else _tool_text(value, out.getvalue()))

            try:
                result = {"error": None, "content": _cut(_timed(call, timeout_s), limit)}
            except Timeout:
                result = {"error": "timeout", "content": f"the call took over {timeout_s:g} s"}
            except BaseException as exc:  # noqa: BLE001 - the tool's error is the answer
                capped = isinstance(exc, OSError) and exc.errno == errno.EFBIG
                printed = "" if capped else out.getvalue()
                text = _error(exc) + _where(exc)
                if capped:
                    text = (f"output limit exceeded: the call printed over "
                            f"{LIMITS['output_bytes']} bytes")
                result = {"error": "output" if capped else "raised",
                          "content": _cut(text + (f"\n[output before the error]\n{printed}"
                                                  if printed else ""), limit)}
            result["seconds"] = time.monotonic() - began
        sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__
        result["total_s"] = time.monotonic() - start
        data = json.dumps(result).encode()
        while data:
            data = data[os.write(write_fd, data):]
    return work


_TOOL_ERRORS = (None, "raised", "timeout", "setup", "replay", "output", "crashed")


def _checked_tool(raw):
    """Only the fields a tool result has, of the types it has: nothing else crosses."""
    if not isinstance(raw, dict) or raw.get("error") not in _TOOL_ERRORS:
        raise ValueError("not a tool result")
    seconds = raw.get("seconds")
    if seconds is not None and (isinstance(seconds, bool) or not isinstance(
            seconds, (int, float)) or not math.isfinite(seconds)):
        raise ValueError("bad seconds")
    return {"error": raw["error"], "content": str(raw.get("content") or ""),
            "seconds": seconds}


def _one_tool(items, n, timeout_s, cap_s):
    replay_s = max(0.0, min(float(items[n].get("replay_s") or 0.0), cap_s))
    budget_s = timeout_s * 2 + replay_s  # loading the tools, replaying, the call
    pid, read_fd = _fork(_tool_work(items, n, timeout_s, replay_s))
    data, error = _collect(read_fd, time.monotonic() + budget_s + GRACE_S)
    status = _reap(pid, read_fd, kill=error is not None)
    if error == "timeout":
        return {"error": "timeout", "content": f"the call took over {timeout_s:g} s (killed)",
                "seconds": None}
    if error is None and os.WIFSIGNALED(status):
        error = _death(status)
    if error is None and not data:
        error = f"the tool's process {_death(status)}"
    if error is None:
        try:
            return _checked_tool(json.loads(data))
        except (ValueError, RecursionError):
            error = "the tool's process corrupted its result stream"
    return {"error": "output" if "limit" in error else "crashed", "content": error,
            "seconds": None}


def serve_tools(request, reply):
    """One fresh child per call: nothing of one call (or trajectory) is there for the next
    but what it replays itself."""
    for n, item in enumerate(request["items"]):
        reply(n, _one_tool(request["items"], n, request["timeout_s"], request["cap_s"]))
        _empty_tmp()
        try:
            os.ftruncate(1, 0)
            os.lseek(1, 0, os.SEEK_SET)
        except OSError:
            pass


def main():
    global LIMITS, SERVER_PID
    mode, LIMITS = sys.argv[1], json.loads(sys.argv[2])
    SERVER_PID = os.getpid()
    confine.die_with(LIMITS.get("parent"))
    signal.signal(signal.SIGALRM, _on_alarm)
    import pyseccomp  # noqa: F401 - now, once: finding libseccomp runs ldconfig (a fork)
    fd_in, fd_out = _private_fds()
    try:
        confine.no_new_privileges_and_not_dumpable()  # Landlock needs it first
        if LIMITS.get("landlock") is not None:
            confine.landlock(LIMITS["landlock"])
            os.chdir("/")
        else:
            os.chdir("/tmp")
        confine.rlimits(LIMITS)
    except Exception as exc:  # noqa: BLE001 - the caller is told why, and nothing runs
        send(fd_out, {"ready": False, "error": _error(exc)})
        os._exit(1)
    send(fd_out, {"ready": True, "pid": os.getpid(), "uid": os.getuid()})
    serve = {"python": serve_python, "code": serve_code, "tools": serve_tools}[mode]
    try:
        while True:
            request = recv(fd_in)
            rid = request["id"]
            serve(request, lambda n, result: send(fd_out, {**result, "id": rid, "i": n}))
            _empty_tmp()
    except EOFError:
        os._exit(0)


if __name__ == "__main__":
    main()
