"""`task.env.type: tools`: the tenant's Python functions as tools, and a code interpreter.

The spec's `tools` text defines plain functions; every public one (no leading underscore) is a
tool whose OpenAI schema comes from its signature, type hints and docstring
(`tool_schema.schemas`). `code_interpreter: true` adds a `python` tool (argument `code`) that
runs code and answers with what it printed (stdout and stderr, the value of a final
expression, or the error). `check(env_spec)` validates all of it at submission by parsing
alone: no tenant code ever runs in the API or trainer process.

Where the code runs. Every call runs in the grader sandbox (`trainer.graders.sandbox`, mode
"tools"): a server per sandbox, started once per environment (a job) and pooled, forks one
seccomp-confined child per call under the grader limits (memory, processes, files, no
network); the call has `tool_timeout_s` (at most the operator's BRORL_GRADER_TIMEOUT_S), its
printed output is capped by BRORL_GRADER_OUTPUT_KB and the answer the model reads by
`MAX_CONTENT_CHARS`. The calls of one turn from all live episodes (the driver awaits their
`step`s together) are gathered and sent to the pool as one batch, spread over its servers.

Per-trajectory state: replay. A tool call's child loads the tools source afresh, replays the
trajectory's earlier tool calls (those that returned or raised, in order, with their output
discarded and `random` seeded per trajectory, so they draw the same numbers) and then runs
the call; a code interpreter call likewise replays the trajectory's earlier cells. So module
globals a tool changes (`NOTES = []` ... `NOTES.append(x)`) and files it writes under /tmp
persist along the trajectory's tool calls, the interpreter's variables, functions, imports and
files along its cells, and neither is ever seen by another trajectory (each call's child is
fresh, and /tmp is emptied after every call). The tools and the interpreter keep their state
apart: the model's code never runs in a process that holds the tools' state, so it cannot read
or rewrite what a tool (or `_reward`) keeps; nothing of the example (its answer) is ever sent
to the sandbox. Within a job this is state isolation, not secrecy: a child is forked from a
server whose memory held the batch's requests (other trajectories' calls of the same job; the
child drops its references to them, but a determined program could read raw memory); another
tenant's never share a server. Why replay rather than a child kept alive per trajectory:
- nothing lives between calls, so nothing can be left running: an episode that is abandoned,
  cancelled or never closed holds no process, and `close()` has nothing to stop;
- any server of the pool can serve any call, so the pool keeps its bounds, its spread of a
  batch over servers and its recovery from a killed server unchanged, and a call that hangs
  or crashes loses no other trajectory's state;
- the cost is re-running earlier calls, bounded by `max_turns` and given its own time budget
  (twice the earlier calls' measured time, plus a second); tool calls are typically
  milliseconds. Calls that timed out, crashed their process or hit the output cap are not
  replayed (their effects are undefined). What does not replay exactly: the clock, other
  random generators (numpy's: seed them in the tools source), and work whose result depends
  on the iteration order of a set of strings (each server has its own hash seed).

Errors. A malformed call (the driver's parse error, an unknown tool, arguments that are not
a JSON object or do not fit the schema: checked here, before any sandbox trip), a tool that
raises, hangs, prints past the cap, tries to fork, read outside its sandbox or open a socket:
each answers with a role "tool" message whose content starts with "error:" and counts in
`EnvReply.tool_errors`; the episode carries on and `step` does not raise for it.

The episode. `start()` is the example's prompt: a dataset row's `messages` as they are, else
one user turn with the question rendered as single-turn prompts render it (`task.prompt_template`,
else the question and the <answer></answer> instruction); naming the tools is the chat
template's job (`Environment.tools`). `step()` answers each tool call of a turn in order; a turn
without a tool call (the model answered) ends the episode. The reward comes from the task's
grader or built-in verifier over the final answer (`task.env.reward: grader`, the default for
tools). With `reward: env` or `sum` the tools source must define `_reward(messages)` (the final
transcript, OpenAI-style messages) returning a number: it runs in the sandbox after the
trajectory's tool calls are replayed, so it can judge the state the tools left (a booking
made, a file written); the interpreter's cells are not part of that state.
"""
from __future__ import annotations

import ast
import asyncio
import json
import math
import os
import threading
import zlib
from typing import Any, Callable

from trainer.rollouts.environments.base import AssistantTurn, EnvReply, Message, ToolCall
from trainer.rollouts.environments.tool_schema import (
    PYTHON_TOOL, ToolSourceError, schemas, validate_arguments)

MAX_CONTENT_CHARS = 4096        # what the model reads of one tool answer
MAX_CALLS_PER_TURN = 16         # further calls of one turn are answered with an error
REWARD_FUNCTION = "_reward"
MAX_POOL_SIZE = 16              # sandboxes of one environment by default: one per CPU, 2 .. 16
GRACE_S = 5.0                   # past the server's own deadline, before the pool gives up


def _get(spec: Any, name: str, default: Any = None) -> Any:
    if isinstance(spec, dict):
        return spec.get(name, default)
    return getattr(spec, name, default)


def _reward_mode(env_spec: Any) -> str:
    """The spec's reward as run (EnvSpec.reward_mode: null is grader for tools)."""
    return _get(env_spec, "reward_mode") or _get(env_spec, "reward") or "grader"


def _defines(source: str | None, name: str) -> bool:
    if not source:
        return False
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    return any(isinstance(n, ast.FunctionDef) and n.name == name for n in tree.body)


def check(env_spec: Any) -> list[dict[str, Any]]:
    """The tools' OpenAI schemas, or a ValueError (ToolSourceError) naming what is wrong.
    Parses only: nothing of the tenant's runs here."""
    source = _get(env_spec, "tools")
    tools = schemas(source, bool(_get(env_spec, "code_interpreter", False)))
    timeout = _get(env_spec, "tool_timeout_s", 10.0)
    if timeout is not None and (not isinstance(timeout, (int, float)) or timeout <= 0):
        raise ToolSourceError("tool_timeout_s must be a positive number of seconds")
    if _reward_mode(env_spec) in ("env", "sum") and not _defines(source, REWARD_FUNCTION):
        raise ToolSourceError(f"reward: {_reward_mode(env_spec)} needs the tools source to "
                              f"define {REWARD_FUNCTION}(messages) returning a number (the "
                              "built-in tools environment has no reward of its own)")
    return tools


def build(env_spec: Any, *, task: Any = None, settings: Any = None,
          tag: str = "brorl-tools") -> "ToolsEnvironment":
    """The registry's entry point (trainer/rollouts/environments/__init__.py dispatches
    `task.env.type: tools` here)."""
    return ToolsEnvironment(env_spec, task=task, settings=settings, tag=tag)


class ToolsEnvironment:
    """A job's built-in tools: the schemas, and the sandbox pool every call runs in."""

    name = "tools"

    def __init__(self, env_spec: Any, *, task: Any = None, settings: Any = None,
                 tag: str = "brorl-tools", limits: Any = None, pool_size: int | None = None):
        from trainer.graders.sandbox.layer import Limits
        from trainer.graders.sandbox.pool import SandboxPool

        self.tools: list[dict[str, Any]] = check(env_spec)
        self._schemas = {t["function"]["name"]: t for t in self.tools}
        self.source: str | None = _get(env_spec, "tools")
        self.code_interpreter = bool(_get(env_spec, "code_interpreter", False))
        self.reward_mode = _reward_mode(env_spec)
        self.limits = limits or Limits.from_env()
        self.timeout_s = float(min(_get(env_spec, "tool_timeout_s", 10.0) or 10.0,
                                   self.limits.timeout_s))
        self.template = _get(task, "prompt_template")
        # A turn's calls wait on the slowest server's share: as many sandboxes as CPUs
        # (calls that hang on a timer hold a server without using its CPU).
        size = pool_size or _get(settings, "tool_sandboxes") or min(
            MAX_POOL_SIZE, max(2, os.cpu_count() or 1))
        self.tag = tag
        self.pool = SandboxPool("tools", int(size), self.limits, tag)
        # The job's stop check (`trainer.stop`), polled while a batch of calls runs: what it
        # raises kills the batch's sandboxes and is raised from every waiting `step`.
        self.stop_check: Callable[[], None] | None = None
        self._queues: dict[Any, list] = {}
        self._map_lock = threading.Lock()
        self._closed = False

    def episode(self, example: Any, sample: int) -> "ToolsEpisode":
        return ToolsEpisode(self, example, sample)

    def close(self) -> None:
        """Kill every sandbox of this environment; nothing of it runs afterwards."""
        self._closed = True
        self.pool.close()

    # ------------------------------------------------------------------ running calls

    async def run(self, item: dict[str, Any]) -> dict[str, Any]:
        """One call's sandbox result ({"error", "content", "seconds"} or {"fault"}). Calls
        submitted in the same turn of the event loop go to the pool as one batch."""
        if self._closed:
            raise RuntimeError("the tools environment is closed")
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        queue = self._queues.setdefault(loop, [])
        queue.append((item, future))
        if len(queue) == 1:
            loop.create_task(self._flush(loop))
        return await future

    async def _flush(self, loop: Any) -> None:
        # Let every episode awaited in this turn queue its call before the batch goes.
        for _ in range(3):
            await asyncio.sleep(0)
        batch = self._queues.pop(loop, [])
        if not batch:
            return
        try:
            results = await asyncio.to_thread(self._map, [item for item, _ in batch])
        except BaseException as exc:  # noqa: BLE001 - each waiting episode gets it
            for _, future in batch:
                if not future.done():
                    future.set_exception(exc if isinstance(exc, Exception)
                                         else RuntimeError(repr(exc)))
            if not isinstance(exc, Exception):
                raise
            return
        for (_, future), result in zip(batch, results):
            if not future.done():
                future.set_result(result)

    def _map(self, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        replay = max(float(i.get("replay_s") or 0.0) for i in items)
        wait = self.timeout_s * 2 + min(replay, self.limits.timeout_s) + 2.0 + GRACE_S
        with self._map_lock:  # one batch at a time: the pool's server bound holds
            return self.pool.map(items, lambda chunk: {"items": chunk,
                                                       "timeout_s": self.timeout_s,
                                                       "cap_s": self.limits.timeout_s},
                                 item_timeout_s=wait, chunk=4, stop_check=self.stop_check)


def _tool_message(call: ToolCall | None, content: str) -> Message:
    return {"role": "tool", "tool_call_id": call.id if call else "",
            "name": call.name if call else "", "content": content}


def _error_text(text: str) -> str:
    return "error: " + text[:MAX_CONTENT_CHARS]


class ToolsEpisode:
    """One trajectory: its prompt, its replayable calls, its counts."""

    def __init__(self, env: ToolsEnvironment, example: Any, sample: int):
        self.env, self.example, self.sample = env, example, sample
        question = getattr(example, "question", "")
        self.seed = zlib.crc32(f"{question}\0{sample}".encode("utf-8", "replace"))
        # The calls a later call replays, and their measured seconds: the tools' and the
        # code interpreter's apart (see the module's docstring).
        self.history: dict[bool, list[dict[str, Any]]] = {False: [], True: []}
        self.replay_s: dict[bool, float] = {False: 0.0, True: 0.0}
        self.tool_calls = self.tool_errors = 0
        self.closed = False

    async def start(self) -> list[Message]:
        payload = getattr(self.example, "payload", None)
        messages = payload.get("messages") if isinstance(payload, dict) else None
        if messages is not None:
            from trainer.tasks.messages import parse_messages

            return [dict(m) for m in parse_messages(messages)]
        from trainer.tasks.prompts import render_prompt

        text = render_prompt(self.example.question, self.env.template).rstrip("\n")
        return [{"role": "user", "content": text}]

    def _item(self, name: str, arguments: dict[str, Any], *, interpreter: bool = False,
              reward: bool = False) -> dict[str, Any]:
        return {"name": name, "arguments": arguments, "interpreter": interpreter,
                "reward": reward, "source": None if interpreter else self.env.source,
                "history": list(self.history[interpreter]),
                "seed": self.seed, "replay_s": 2 * self.replay_s[interpreter] + 1.0,
                "max_chars": MAX_CONTENT_CHARS}

    async def _call(self, call: ToolCall) -> tuple[str, bool]:
        """(content, failed) of one call."""
        schema = self.env._schemas.get(call.name)
        if schema is None:
            return _error_text(f"no tool named {call.name[:100]!r}; the tools are "
                               f"{', '.join(self.env._schemas)}"), True
        why = validate_arguments(schema, call.arguments)
        if why is not None:
            return _error_text(why), True
        interpreter = self.env.code_interpreter and call.name == PYTHON_TOOL
        result = await self.env.run(self._item(call.name, call.arguments,
                                               interpreter=interpreter))
        if not isinstance(result, dict) or "fault" in result:
            result = result if isinstance(result, dict) else {"fault": "no answer"}
            return _error_text(f"the tool's sandbox failed: {result['fault']}"), True
        error = result.get("error")
        if error in (None, "raised"):
            self.history[interpreter].append({"name": call.name, "arguments": call.arguments,
                                              "interpreter": interpreter})
            self.replay_s[interpreter] += float(result.get("seconds") or 0.0)
        if error is None:
            return result.get("content", ""), False
        return _error_text(result.get("content") or error), True

    async def step(self, turn: AssistantTurn) -> EnvReply:
        if self.closed:
            raise RuntimeError("the episode is closed")
        messages: list[Message] = []
        errors = 0
        if turn.parse_error is not None:
            messages.append(_tool_message(None, _error_text(
                f"could not read the tool call: {turn.parse_error}")))
            errors += 1
        if not turn.tool_calls and turn.parse_error is None:
            return EnvReply(done=True)
        for n, call in enumerate(turn.tool_calls):
            if n >= MAX_CALLS_PER_TURN:
                content, failed = _error_text(f"too many tool calls in one turn (at most "
                                              f"{MAX_CALLS_PER_TURN}); this one did not "
                                              "run"), True
            else:
                content, failed = await self._call(call)
            errors += failed
            messages.append(_tool_message(call, content))
        calls = len(turn.tool_calls) + (turn.parse_error is not None)
        self.tool_calls += calls
        self.tool_errors += errors
        return EnvReply(messages=messages, done=False, tool_calls=calls, tool_errors=errors)

    async def finish(self, transcript: list[Message]) -> float | None:
        """None (the grader or verifier scores the final answer), or with `reward: env` or
        `sum` the tools source's `_reward(messages)`, run after replaying the trajectory;
        a reward that fails raises (the driver records it and gives the trajectory 0)."""
        if self.env.reward_mode not in ("env", "sum"):
            return None
        messages = json.loads(json.dumps(transcript, default=str))
        result = await self.env.run(self._item(REWARD_FUNCTION, {"messages": messages},
                                               reward=True))
        if "fault" in result or result.get("error") is not None:
            raise RuntimeError(f"{REWARD_FUNCTION}() failed: "
                               f"{result.get('fault') or result.get('content')}")
        try:
            value = float(json.loads(result.get("content") or "null"))
        except (TypeError, ValueError):
            value = math.nan
        if not math.isfinite(value):
            raise RuntimeError(f"{REWARD_FUNCTION}() returned {result.get('content')!r}, "
                               "not a finite number")
        return value

    async def close(self) -> None:
        # Nothing of an episode runs between its calls (see the module's docstring).
        self.closed = True
