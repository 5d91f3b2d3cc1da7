"""The grader sandbox server's "tools" mode (multi-turn tool environments,
trainer.rollouts.environments.tools_env): one child per tool call, which loads the tenant's
tools source, replays the trajectory's earlier calls with their output discarded (that is the
trajectory's state) and runs the call with its output captured and capped. Runs inside the
sandbox with server.py, which dispatches to `serve_tools`.
"""
import ast
import errno
import io
import json
import math
import os
import resource
import sys
import time

from server_core import (
    GRACE_S, LIMITS, Timeout, _CappedText, _collect, _death, _empty_tmp, _error, _fork, _reap,
    _timed)

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
