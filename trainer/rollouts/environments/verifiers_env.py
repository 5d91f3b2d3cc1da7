"""`verifiers` environments, run unchanged: an operator-installed MultiTurnEnv / ToolEnv /
SingleTurnEnv as a multi-turn `Environment` (base.py).

The operator installs an environment package (it exposes `load_environment(**args)`, the
library's convention) and lists its id in BRORL_ENVIRONMENTS; a job names it in `task.env`
(`type: verifiers`, `name`, `args`). `build` loads it with `vf.load_environment(name, **args)`
and `task` takes the job's examples from its `dataset` (and `eval_dataset`, or a held-out
share of `dataset`), each row kept whole in `Example.payload`.

How an episode runs. The library's own rollout loop (`MultiTurnEnv.rollout`, final in the
library) runs as it is: `init_state`, `setup_state`, the stop conditions (`is_completed`:
`max_turns`, a ToolEnv's "no tool called", `final_env_response`, errors, the env's
`timeout_seconds`), `env_response` through `get_prompt_messages`, `add_model_response`, and the
`@vf.cleanup` handlers in its `finally`. Only the model client is ours: each time the loop asks
the model for a turn, the request goes to the trainer's multi-turn driver
(`trainer.rollouts.multiturn`) instead of an HTTP endpoint. `Episode.start` returns the prompt
of the first request (the row's prompt with the env's system prompt and few-shot, as the
library composed them); `Episode.step` answers the pending request with the model's turn (its
text, the tool calls the driver parsed, and the context's and the turn's token ids with their
log-probs as the library's `ResponseTokens`, all as a `vf.Response`) and returns what the loop did
next: the messages the environment appended before its next request (tool results, a user
turn), or, when the loop ended, its `final_env_response` and `done`. `Episode.finish` scores
the finished state with the environment's rubric (`rubric.score_group` over the one rollout:
the library's default scoring path, the same rewards as `score_rollout` for per-rollout
functions) and returns `state["reward"]`. When the driver ends an episode first (its
`max_turns` or token budget), the pending request fails with `vf.OverlongPromptError`, which
the library handles as a context that ran out: `prompt_too_long`, `is_truncated`, then the
normal end and scoring.

Why the trainer, not the environment, drives generation (the contract prime-rl uses too):
the driver batches one engine call over every live trajectory of a step at each turn (an
environment calling a client per rollout would send one request at a time), and it keeps the
token ids the engine sampled, appending the environment's messages as context tokens. A chat
client would send the whole transcript back through the chat template at every turn, and
re-templated text is not what the model sampled (verl documents PPO breaking on exactly that).
No HTTP server or API key is involved, so it runs the same on a CPU as on a GPU.

What this means for environments that call the model themselves: not supported. An
environment whose class replaces `rollout` (EnvGroup, CLI-agent and sandbox-agent envs) or
`get_model_response` is refused at `build`, naming the method. A model request that does not
continue the episode's own transcript (an `env_response` that asks the policy something aside,
a `get_prompt_messages` that rewrites history) fails that episode with `UnsupportedEnvironment`
(counted in `env/errors`; the job carries on). Judges the rubric calls on its own client
(JudgeRubric) are not the policy and run as the environment wrote them. Rubrics with
group-level reward functions (`states`/`completions` arguments) are refused at `build`: an
episode is scored alone. Completion-style (string) prompts and multimodal content are refused.

Tools: a ToolEnv's `tool_defs` become the OpenAI function schemas the chat template is
rendered with (`Environment.tools`); the library turns a tool's exception or unparsable
arguments into a tool message, and each such message counts in `EnvReply.tool_errors` (so does
a turn whose tool call the driver could not parse, which the library sees as a turn without
tool calls). A ToolEnv's `stop_errors` end the episode as the library does, counted likewise.
An environment that raises anything else (a bug, an infrastructure error) fails that episode:
`step` raises, the driver records it with reward 0, the job carries on.

The environment's coroutines (the rollout loop, tools, rubric) all run on one event loop of the
environment's own, on a daemon thread (`LoopThread`), whatever loop the driver awaits from; its
resources (clients, sessions) stay on one loop. Loading never installs the library's process
signal handlers or atexit hooks (its `Environment.__post_init__` does; a worker owns its
signals): `Environment.close` runs the environment's teardown instead.

Tenant input: a job may only name an id the operator listed; `args` must be a JSON object whose
keys are the parameters `load_environment` declares (unless it takes `**kwargs`). The
environment's code is the operator's, trusted as installed; list only environments whose
arguments are safe in a tenant's hands.
"""
from __future__ import annotations

import asyncio
import contextvars
import json
import math
import time
import uuid
from typing import Any

from trainer.rollouts.environments.loop_thread import LoopThread
from trainer.rollouts.environments.base import AssistantTurn, EnvReply, Message
from trainer.tasks.base import Example
from trainer.rollouts.environments.verifiers_setup import (  # noqa: F401 (check, task, ... re-exported)
    CLOSE_TIMEOUT_S, EnvironmentFailed, MAX_ARGS_BYTES, MODEL_NAME, SETTING, UnsupportedEnvironment,
    _LOADED, _LOAD_LOCK, _get, _load, _text, _vf,
    check, environment_args, environment_id, listed_ids, load, task,
)


# ----------------------------------------------------------------------------- messages


def _tool_schema(tool: Any) -> dict[str, Any]:
    function = {"name": tool.name, "description": tool.description or "", "parameters": dict(tool.parameters)}
    return {"type": "function", "function": function}


def _arguments(text: str) -> Any:
    try:
        value = json.loads(text)
    except (TypeError, ValueError):
        return text
    return value if isinstance(value, dict) else text


def to_chat(message: Any) -> Message:
    """A library message (pydantic or dict) as the OpenAI-style dict the driver renders."""
    role = _get(message, "role")
    if role == "text":
        raise UnsupportedEnvironment("completion-style (text) messages are not supported")
    if role not in ("system", "user", "assistant", "tool"):
        raise UnsupportedEnvironment(f"a message with role {role!r} is not supported")
    out: Message = {"role": role, "content": _text(_get(message, "content"))}
    if role == "assistant":
        calls = _get(message, "tool_calls") or []
        if calls:
            out["tool_calls"] = []
            for call in calls:
                fn = _get(call, "function")
                name = _get(fn, "name") if fn is not None else _get(call, "name")
                arguments = _get(fn, "arguments") if fn is not None else _get(call, "arguments")
                out["tool_calls"].append({"id": _get(call, "id") or name, "type": "function", "function": {
                    "name": name,
                    "arguments": arguments if isinstance(arguments, dict) else _arguments(arguments)}})
    if role == "tool":
        out["tool_call_id"] = _get(message, "tool_call_id")
    return out


def _same(a: Any, b: Any) -> bool:
    return a is b or to_chat(a) == to_chat(b)


# ----------------------------------------------------------------------------- the loop thread


_EPISODE: contextvars.ContextVar["VerifiersEpisode | None"] = contextvars.ContextVar("vf_episode", default=None)


def _count_tool_errors(env: Any) -> None:
    """Wrap the instance's `call_tool` so a tool that raises counts in its episode's tool_errors;
    the exception goes on to the library, which answers with its error message (or stops)."""
    original = env.call_tool

    async def call_tool(*args: Any, **kwargs: Any) -> Any:
        try:
            return await original(*args, **kwargs)
        except Exception:
            episode = _EPISODE.get()
            if episode is not None:
                episode._tool_errors += 1
            raise

    env.call_tool = call_tool


# ----------------------------------------------------------------------------- episodes


class _Request:
    """One model request of the library's loop, waiting for the driver's turn."""

    def __init__(self, prompt: list[Any], tools: list[Any] | None, future: asyncio.Future):
        self.prompt, self.tools, self.future = prompt, tools, future


def _trainer_client_class(vf: Any) -> type:
    class TrainerClient(vf.Client):
        """The model client the library's loop holds: each request goes to the episode's driver."""

        def __init__(self, episode: "VerifiersEpisode"):
            super().__init__(None)
            self.episode = episode

        async def get_response(self, prompt: Any, model: str, sampling_args: Any, tools: Any = None,
                               **kwargs: Any) -> Any:
            return await self.episode._model_request(prompt, tools)

        def setup_client(self, config: Any) -> Any:
            return None

        async def to_native_tool(self, tool: Any) -> Any:
            return tool

        async def to_native_prompt(self, messages: Any) -> tuple[Any, dict]:
            return messages, {}

        async def get_native_response(self, *args: Any, **kwargs: Any) -> Any:
            raise UnsupportedEnvironment("the trainer's client answers get_response only")

        async def raise_from_native_response(self, response: Any) -> None:
            return None

        async def from_native_response(self, response: Any) -> Any:
            return response

        async def close(self) -> None:
            return None

    return TrainerClient


class VerifiersEpisode:
    """One trajectory: the library's rollout loop on the environment's loop (module docstring)."""

    def __init__(self, owner: "VerifiersEnvironment", example: Example, sample: int):
        self.owner, self.example, self.sample = owner, example, sample
        self._events: asyncio.Queue | None = None
        self._rollout: asyncio.Task | None = None
        self._pending: _Request | None = None
        self._context: list[Any] = []      # the prompt of the last request (library messages)
        self._opening = 0                  # messages in the first request's prompt
        self._turns_given = 0              # model turns handed to the library's loop
        self._state: Any = None
        self._failure: BaseException | None = None
        self._done = False
        self._scored = False
        self._reward: float | None = None
        self._tool_errors = 0

    # -- the library's side (on the environment's loop)

    async def _model_request(self, prompt: list[Any], tools: list[Any] | None) -> Any:
        future = asyncio.get_running_loop().create_future()
        await self._events.put(("request", _Request(list(prompt), tools, future)))
        return await future

    async def _run(self) -> None:
        env = self.owner.env
        _EPISODE.set(self)
        row = self.example.payload
        try:
            state = await env.rollout(row, self.owner.client_class(self), MODEL_NAME,
                                      dict(getattr(env, "sampling_args", {}) or {}))
            await self._events.put(("done", state))
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # noqa: BLE001 - handed to the driver's await as the episode's failure
            await self._events.put(("failed", exc))

    async def _next_event(self) -> tuple[str, Any]:
        kind, value = await self._events.get()
        if kind == "request":
            self._pending = value
        elif kind == "done":
            self._state = value
            self._done = True
        else:
            self._failure = value
            self._done = True
        return kind, value

    def _check_request(self, request: _Request) -> None:
        names = {_get(t, "name") for t in (request.tools or [])}
        if names != self.owner.tool_names:
            raise UnsupportedEnvironment(
                f"verifiers environment {self.owner.name!r}: a request with tools {sorted(names)} differs "
                f"from the environment's {sorted(self.owner.tool_names)} (per-example tools are not supported)")

    def _failed(self, exc: BaseException) -> Exception:
        if isinstance(exc, (UnsupportedEnvironment, EnvironmentFailed)):
            return exc
        return EnvironmentFailed(f"verifiers environment {self.owner.name!r} raised "
                                 f"{type(exc).__name__}: {str(exc)[:2000]}")

    async def _start(self) -> list[Message]:
        self._events = asyncio.Queue()
        self._rollout = asyncio.get_running_loop().create_task(self._run(), name=f"vf-episode-{self.sample}")
        kind, value = await self._next_event()
        if kind == "failed":
            raise self._failed(value) from value
        if kind == "done":
            reason = value.get("stop_condition")
            error = value.get("error")
            raise EnvironmentFailed(f"verifiers environment {self.owner.name!r} ended before the first model "
                                    f"turn ({reason}{': ' + repr(error) if error is not None else ''})")
        self._check_request(value)
        self._context = value.prompt
        self._opening = len(value.prompt)
        return [to_chat(m) for m in value.prompt]

    def _response(self, turn: AssistantTurn) -> Any:
        vf = self.owner.vf
        from verifiers.legacy.types import ResponseMessage, ResponseTokens, ToolCall, Usage

        calls = None
        if self.owner.tool_names and turn.tool_calls:
            calls = [ToolCall(id=c.id, name=c.name, arguments=json.dumps(c.arguments)) for c in turn.tool_calls]
        finish = "length" if turn.truncated else ("tool_calls" if calls else "stop")
        tokens = usage = None
        if turn.token_ids:
            # What the engine sampled, as the library's OpenAI client fills it from vLLM's
            # return_token_ids and logprobs: the context's ids (mask 0), the turn's ids (mask 1)
            # and their log-probs; the library keeps them in the state's trajectory steps.
            prompt, completion = list(turn.prompt_ids), list(turn.token_ids)
            tokens = ResponseTokens(prompt_ids=prompt, prompt_mask=[0] * len(prompt),
                                    completion_ids=completion, completion_mask=[1] * len(completion),
                                    completion_logprobs=[float(x) for x in turn.logprobs])
            usage = Usage(prompt_tokens=len(prompt), reasoning_tokens=0, completion_tokens=len(completion),
                          total_tokens=len(prompt) + len(completion))
        message = ResponseMessage(content=turn.text, tool_calls=calls, finish_reason=finish,
                                  is_truncated=turn.truncated, tokens=tokens)
        return vf.Response(id=f"brorl-{uuid.uuid4().hex}", created=int(time.time()), model=MODEL_NAME,
                           usage=usage, message=message)

    async def _answer(self, turn: AssistantTurn) -> tuple[str, Any]:
        request, self._pending = self._pending, None
        if request is None:
            raise RuntimeError("verifiers episode: a turn with no model request pending")
        self._turns_given += 1
        if not request.future.done():   # the env's own timeout may have cancelled it
            request.future.set_result(self._response(turn))
        return await self._next_event()

    async def _step(self, turn: AssistantTurn) -> EnvReply:
        if self._done:
            raise RuntimeError("verifiers episode: step after the episode ended")
        errors_before = self._tool_errors
        previous = self._context
        kind, value = await self._answer(turn)
        parse_error = 1 if (turn.parse_error and self.owner.tool_names) else 0
        calls = len(turn.tool_calls) if self.owner.tool_names else 0
        if kind == "failed":
            raise self._failed(value) from value
        if kind == "done":
            return self._ended(value, calls, parse_error + self._tool_errors - errors_before)
        self._check_request(value)
        known = len(previous) + 1          # the last prompt and the model's turn
        prompt = value.prompt
        if len(prompt) < known or not all(_same(a, b) for a, b in zip(prompt[:len(previous)], previous)):
            raise UnsupportedEnvironment(
                f"verifiers environment {self.owner.name!r} asked the model something that does not continue "
                "the episode's transcript (it calls the model itself or rewrites the history): not supported")
        self._context = prompt
        new = [to_chat(m) for m in prompt[known:]]
        return EnvReply(messages=new, done=False, tool_calls=calls,
                        tool_errors=parse_error + self._tool_errors - errors_before)

    def _ended(self, state: Any, calls: int, tool_errors: int) -> EnvReply:
        vf = self.owner.vf
        error = state.get("error")
        if error is not None and not isinstance(error, vf.ToolError):
            self._failure = EnvironmentFailed(f"verifiers environment {self.owner.name!r} stopped the episode "
                                              f"with {type(error).__name__}: {str(error)[:2000]}")
            raise self._failure from error
        if isinstance(error, vf.ToolError):
            tool_errors = max(tool_errors, 1)
        final = state.get("final_env_response") or []
        info = {"stop_condition": state.get("stop_condition"), "is_truncated": bool(state.get("is_truncated"))}
        if error is not None:
            info["error"] = f"{type(error).__name__}: {error}"
        return EnvReply(messages=[to_chat(m) for m in final], done=True, tool_calls=calls,
                        tool_errors=tool_errors, info=info)

    async def _finish(self, transcript: list[Message]) -> float | None:
        if self._scored:
            return self._reward
        self._scored = True
        if self._rollout is None or self._failure is not None:   # never started, or already failed
            return None
        vf = self.owner.vf
        while not self._done:
            if self._pending is None:
                await self._next_event()
                continue
            turn = self._unseen_turn(transcript)
            if turn is not None:
                await self._answer(turn)
                continue
            request, self._pending = self._pending, None
            if not request.future.done():
                request.future.set_exception(vf.OverlongPromptError(
                    "brorl: the episode's turn or token budget ended it"))
            await self._next_event()
        if self._failure is not None:      # the environment raised on the turn it had not seen
            raise self._failed(self._failure) from self._failure
        if self._state is None:
            return None
        state, env = self._state, self.owner.env
        state["timing"].scoring.start = time.time()
        if env.score_rollouts:
            await env.rubric.score_group([state])
        else:
            await env.rubric.dummy_score_group([state])
        state["timing"].scoring.end = time.time()
        await env.rubric.cleanup(state)
        reward = state.get("reward")
        self._reward = float(reward) if reward is not None and math.isfinite(float(reward)) else None
        return self._reward

    def _unseen_turn(self, transcript: list[Message]) -> AssistantTurn | None:
        """The model's last turn when the driver wrote one that `step` never got (a budget cut)."""
        written = sum(1 for m in transcript[self._opening:] if m.get("role") == "assistant")
        if written <= self._turns_given or not transcript or transcript[-1].get("role") != "assistant":
            return None
        from trainer.rollouts.environments.base import ToolCall as Call

        last = transcript[-1]
        calls = [Call(id=c.get("id") or "", name=c["function"]["name"],
                      arguments=c["function"]["arguments"] if isinstance(c["function"]["arguments"], dict) else {})
                 for c in last.get("tool_calls") or []]
        return AssistantTurn(text=_text(last.get("content")), tool_calls=calls, truncated=True)

    async def _close(self) -> None:
        rollout, self._rollout = self._rollout, None
        if rollout is not None and not rollout.done():
            if self._pending is not None and not self._pending.future.done():
                self._pending.future.cancel()
            rollout.cancel()
            try:
                await rollout  # the library's `finally` runs its cleanup handlers
            except BaseException:  # noqa: BLE001 - closing: nothing is left to report to
                pass
        self.owner._episodes.discard(self)

    # -- the driver's side (any loop)

    async def start(self) -> list[Message]:
        self.owner._episodes.add(self)
        return await self.owner.loop.run(self._start())

    async def step(self, turn: AssistantTurn) -> EnvReply:
        return await self.owner.loop.run(self._step(turn))

    async def finish(self, transcript: list[Message]) -> float | None:
        return await self.owner.loop.run(self._finish(transcript))

    async def close(self) -> None:
        await self.owner.loop.run(self._close())


class VerifiersEnvironment:
    """A loaded verifiers environment as the trainer's `Environment` (module docstring)."""

    def __init__(self, vf: Any, env: Any, name: str, tag: str = "job"):
        self.vf, self.env, self.name = vf, env, name
        defs = list(env.tool_defs or [])
        self.tools = [_tool_schema(t) for t in defs] or None
        self.tool_names = {t.name for t in defs}
        self.client_class = _trainer_client_class(vf)
        if self.tool_names and hasattr(env, "call_tool"):
            _count_tool_errors(env)
        self._episodes: set[VerifiersEpisode] = set()
        self._closed = False
        self.loop = LoopThread(f"verifiers-{name}-{tag}"[:60], CLOSE_TIMEOUT_S)

    def episode(self, example: Any, sample: int) -> VerifiersEpisode:
        if self._closed:
            raise RuntimeError(f"verifiers environment {self.name!r} is closed")
        return VerifiersEpisode(self, example, sample)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True

        async def shutdown() -> None:
            for episode in list(self._episodes):
                await episode._close()
            await self.env._teardown()

        try:
            self.loop.call(shutdown(), timeout=CLOSE_TIMEOUT_S)
        finally:
            self.loop.stop()


def build(env_spec: Any, *, task: Any = None, settings: Any = None, tag: str = "job") -> VerifiersEnvironment:
    """The environment `task.env` names (type verifiers), loaded and wrapped; an unlisted id, bad
    arguments, a load that fails or an unsupported environment is a ValueError that says which."""
    name = environment_id(env_spec, settings)
    args = environment_args(env_spec)
    with _LOAD_LOCK:
        env = _LOADED.pop((name, json.dumps(args, sort_keys=True)), None)
    if env is None:
        env = _load(name, args)
    return VerifiersEnvironment(_vf(), env, name, tag=tag)


__all__ = ["SETTING", "EnvironmentFailed", "UnsupportedEnvironment", "VerifiersEnvironment",
           "VerifiersEpisode", "build", "check", "environment_args", "environment_id", "listed_ids",
           "load", "task", "to_chat"]
