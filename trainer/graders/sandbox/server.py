"""The program that runs INSIDE a grader sandbox: a server of grading requests that runs no
tenant code itself.

Standard library, `pyseccomp` and the modules beside it only (confine.py; server_core.py,
the machinery the modes share; server_tools.py, the tools mode), and run as a plain script
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
import io
import json
import math
import os
import resource
import signal
import struct
import sys
import time

# -I leaves the script's folder off sys.path: confine.py and server_*.py live beside this file.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import confine  # noqa: E402

import server_core as core  # noqa: E402
from server_core import (  # noqa: E402
    GRACE_S, LIMITS, Timeout, _CappedText, _collect, _death, _empty_tmp, _error, _fork,
    _on_alarm, _output_tail, _private_fds, _reap, _timed, recv, send)
from server_tools import serve_tools  # noqa: E402

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


def main():
    mode = sys.argv[1]
    LIMITS.update(json.loads(sys.argv[2]))  # in place: every module's LIMITS is this dict
    core.SERVER_PID = os.getpid()
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
