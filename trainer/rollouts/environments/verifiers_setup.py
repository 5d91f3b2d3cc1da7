"""A verifiers environment's setting, loading and task: what `verifiers_env` builds on.

The ids a job may name (BRORL_ENVIRONMENTS), a job's `args` checked against the environment's
`load_environment`, loading without the library's process hooks, the environments the trainer
cannot drive refused, and the job's `Task` built from the environment's dataset. The episodes
that run it are in verifiers_env.py (its docstring says how and why).
"""
from __future__ import annotations

import inspect
import json
import math
import random
import threading
from typing import Any

from trainer.tasks.base import Example, Task, VerifierSpec

SETTING = "BRORL_ENVIRONMENTS"
INSTALL_HINT = "install the agents extra (`make install` does; pyproject.toml says how)"
MAX_ARGS_BYTES = 64 * 1024          # task.env.args as JSON
MAX_TRAIN_EXAMPLES = 100_000        # a larger dataset is sampled (by the job's seed) down to this
MAX_EVAL_EXAMPLES = 10_000
HELD_OUT_FRACTION = 0.1             # eval share of `dataset` when the env has no eval_dataset
MAX_HELD_OUT = 256
CLOSE_TIMEOUT_S = 30.0
MAX_KEPT = 2                        # environments task() loaded, kept for the build() that follows
MODEL_NAME = "brorl-policy"         # what the library's state["model"] says


class UnsupportedEnvironment(ValueError):
    """The environment does something the trainer cannot drive (the message says what)."""


class EnvironmentFailed(RuntimeError):
    """The environment raised during an episode (a bug or its infrastructure, not the model)."""


# ----------------------------------------------------------------------------- spec and setting


def _get(obj: Any, name: str, default: Any = None) -> Any:
    if isinstance(obj, dict):
        return obj.get(name, default)
    return getattr(obj, name, default)


def listed_ids(settings: Any = None) -> tuple[str, ...]:
    """The environment ids BRORL_ENVIRONMENTS lists (`settings`: TrainerSettings, a dict of
    fields, or None for the process's settings)."""
    value = _get(settings, "environments", None) if settings is not None else None
    if value is None:
        from trainer.settings import trainer_settings

        value = trainer_settings().environments
    if isinstance(value, str):
        value = [part.strip() for part in value.split(",") if part.strip()]
    return tuple(value)


def environment_id(env_spec: Any, settings: Any = None) -> str:
    """The id `task.env.name` names; a missing or unlisted one is a ValueError naming the setting."""
    name = _get(env_spec, "name")
    listed = listed_ids(settings)
    if not name:
        raise ValueError(f"task.env.name: a verifiers environment names one of the ids in {SETTING}")
    if name not in listed:
        shown = ", ".join(listed) or "none listed"
        raise ValueError(f"task.env.name: {str(name)[:100]!r} is not a verifiers environment listed in "
                         f"{SETTING} ({shown}); the operator installs and lists the environments a job may name")
    return name


def environment_args(env_spec: Any) -> dict[str, Any]:
    """`task.env.args` checked: a JSON object with string keys, at most MAX_ARGS_BYTES."""
    args = _get(env_spec, "args") or {}
    if not isinstance(args, dict):
        raise ValueError("task.env.args: a JSON object of load_environment's arguments")
    for key in args:
        if not isinstance(key, str) or not key.isidentifier():
            raise ValueError(f"task.env.args: {str(key)[:100]!r} is not an argument name")
    try:
        text = json.dumps(args, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"task.env.args: not JSON ({exc})") from None
    if len(text.encode()) > MAX_ARGS_BYTES:
        raise ValueError(f"task.env.args: more than {MAX_ARGS_BYTES} bytes of JSON")
    return json.loads(text)   # a copy the environment cannot change under the spec


def check(env_spec: Any, settings: Any = None) -> None:
    """The submission check (no loading): the id is listed and the arguments are a JSON object."""
    environment_id(env_spec, settings)
    environment_args(env_spec)


# ----------------------------------------------------------------------------- loading


def _vf() -> Any:
    try:
        import verifiers as vf
        import verifiers.legacy.envs.environment  # noqa: F401 - the classes below, loaded now
    except ImportError as exc:
        raise ValueError(f"task.env: the verifiers library is not installed here ({exc}); {INSTALL_HINT}") from None
    return vf


_LOAD_LOCK = threading.Lock()
_LOADED: dict[tuple[str, str], Any] = {}   # task() loads; the next build() of the same spec takes it


class _NoProcessHooks:
    """Stands in for `signal` and `atexit` in the library's environment module while one loads:
    its `__post_init__` would replace the process's SIGINT/SIGTERM handlers (and fails outright
    off the main thread) and register an atexit teardown; the owner runs teardown instead."""

    SIGINT, SIGTERM = 2, 15

    @staticmethod
    def signal(*_args: Any) -> None:
        return None

    @staticmethod
    def register(func: Any, *_args: Any, **_kwargs: Any) -> Any:
        return func

    @staticmethod
    def default_int_handler(*_args: Any) -> None:
        raise KeyboardInterrupt


def _load(name: str, args: dict[str, Any]) -> Any:
    vf = _vf()
    from verifiers.legacy.envs import environment as env_module
    from verifiers.legacy.utils.env_utils import import_env_module

    try:
        module = import_env_module(name)
    except ImportError as exc:
        raise ValueError(f"task.env.name {name!r}: its package is not importable here ({exc}); "
                         f"the operator installs each environment listed in {SETTING}") from None
    load = getattr(module, "load_environment", None)
    if not callable(load):
        raise ValueError(f"task.env.name {name!r}: module {module.__name__!r} has no load_environment")
    params = inspect.signature(load).parameters
    if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        unknown = sorted(set(args) - set(params))
        if unknown:
            raise ValueError(f"task.env.args: {name!r} takes no argument {', '.join(map(repr, unknown))} "
                             f"(it takes: {', '.join(params) or 'none'})")
    with _LOAD_LOCK:
        saved = env_module.signal, env_module.atexit
        env_module.signal = env_module.atexit = _NoProcessHooks
        try:
            env = vf.load_environment(name, **args)
        except Exception as exc:  # noqa: BLE001 - whatever the package raised, named for the job's error
            cause = exc.__cause__ or exc
            raise ValueError(f"task.env: verifiers environment {name!r} failed to load: "
                             f"{type(cause).__name__}: {str(cause)[:2000]}") from exc
        finally:
            env_module.signal, env_module.atexit = saved
    _check_supported(vf, env, name)
    return env


def _check_supported(vf: Any, env: Any, name: str) -> None:
    """Refuse, at build, what the driver cannot run faithfully (see the module's docstring)."""
    if not isinstance(env, vf.Environment):
        raise ValueError(f"task.env.name {name!r}: load_environment returned a {type(env).__name__}, "
                         "not a verifiers Environment")
    if not isinstance(env, vf.MultiTurnEnv):
        raise UnsupportedEnvironment(
            f"verifiers environment {name!r} is a {type(env).__name__}, not a MultiTurnEnv (SingleTurnEnv, "
            "MultiTurnEnv, ToolEnv and their subclasses run here): it runs its own rollout and calls the "
            "model itself, which the trainer does not support")
    base_rollout = vf.MultiTurnEnv.rollout
    if type(env).rollout is not base_rollout:
        raise UnsupportedEnvironment(
            f"verifiers environment {name!r} ({type(env).__name__}) replaces rollout(): it drives the model "
            "itself, which the trainer does not support")
    if type(env).get_model_response is not vf.Environment.get_model_response:
        raise UnsupportedEnvironment(
            f"verifiers environment {name!r} ({type(env).__name__}) replaces get_model_response(): it calls "
            "the model itself, which the trainer does not support")
    if getattr(env, "message_type", "chat") != "chat":
        raise UnsupportedEnvironment(f"verifiers environment {name!r}: completion-style prompts are not supported")
    if env.rubric is not None and env.rubric.has_group_rewards:
        raise UnsupportedEnvironment(
            f"verifiers environment {name!r}: its rubric has group-level reward functions; the trainer "
            "scores each episode alone")


def load(env_spec: Any, settings: Any = None) -> Any:
    """The verifiers environment a spec names, loaded (a listed id and checked arguments)."""
    name = environment_id(env_spec, settings)
    return _load(name, environment_args(env_spec))


# ----------------------------------------------------------------------------- the task


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            kind = _get(part, "type")
            if kind != "text":
                raise UnsupportedEnvironment(f"message content of type {kind!r} is not supported (text only)")
            parts.append(str(_get(part, "text") or ""))
        return "".join(parts)
    raise UnsupportedEnvironment(f"message content of type {type(content).__name__} is not supported")


def _jsonable(row: dict[str, Any], name: str, index: int) -> dict[str, Any]:
    try:
        return json.loads(json.dumps(row, allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"verifiers environment {name!r}: dataset row {index} is not JSON ({exc})") from None


def _example(row: dict[str, Any], name: str, index: int) -> Example:
    row = _jsonable(row, name, index)
    prompt = row.get("prompt")
    if not isinstance(prompt, list) or not prompt or not all(isinstance(m, dict) for m in prompt):
        raise UnsupportedEnvironment(f"verifiers environment {name!r}: dataset row {index} has no chat prompt "
                                     "(a list of messages); completion-style prompts are not supported")
    # Arrow gives every message every key of the column (None where a message has none).
    row["prompt"] = prompt = [{k: v for k, v in m.items() if v is not None} for m in prompt]
    users = [m for m in prompt if isinstance(m, dict) and m.get("role") == "user"]
    question = _text(users[-1].get("content")) if users else ""
    answer = row.get("answer", "")
    answer = answer if isinstance(answer, str) else json.dumps(answer)
    return Example(question=question, answer=answer, payload=row)


def _rows(dataset: Any, limit: int, rng: random.Random) -> list[dict[str, Any]]:
    n = len(dataset)
    idx = sorted(rng.sample(range(n), limit)) if n > limit else list(range(n))
    return [dict(dataset[i]) for i in idx]


def task(env_spec: Any, settings: Any = None, seed: int = 0) -> Task:
    """The job's examples from the environment's datasets: train from `dataset`, eval from
    `eval_dataset`, or, without one, a held-out share of `dataset` (HELD_OUT_FRACTION, at most
    MAX_HELD_OUT) drawn by `seed`. Each example's payload is its row (prompt messages, answer,
    info, task, example_id and the other columns), JSON as the library formatted it."""
    name = environment_id(env_spec, settings)
    args = environment_args(env_spec)
    env = _load(name, args)
    rng = random.Random(seed)
    train_ds = env.get_dataset() if (env.dataset is not None or env.dataset_source is not None) else None
    if train_ds is None or len(train_ds) == 0:
        raise ValueError(f"verifiers environment {name!r} has no training dataset (its `dataset` is empty)")
    has_eval = env.eval_dataset is not None or env.eval_dataset_source is not None
    eval_ds = env.get_eval_dataset() if has_eval else None
    train_rows = _rows(train_ds, MAX_TRAIN_EXAMPLES, rng)
    if eval_ds is not None:
        eval_rows = _rows(eval_ds, MAX_EVAL_EXAMPLES, rng)
    else:
        order = list(range(len(train_rows)))
        rng.shuffle(order)
        n_eval = min(MAX_HELD_OUT, math.ceil(HELD_OUT_FRACTION * len(order))) if len(order) > 1 else 0
        held = set(order[:n_eval])
        eval_rows = [train_rows[i] for i in sorted(held)]
        train_rows = [r for i, r in enumerate(train_rows) if i not in held]
    with _LOAD_LOCK:
        _LOADED[(name, json.dumps(args, sort_keys=True))] = env
        while len(_LOADED) > MAX_KEPT:       # a task built without a build after it
            _LOADED.pop(next(iter(_LOADED)))
    return Task(name=f"verifiers:{name}",
                train=[_example(r, name, i) for i, r in enumerate(train_rows)],
                eval=[_example(r, name, i) for i, r in enumerate(eval_rows)],
                verifier_spec=VerifierSpec.of("dataset", verifier="exact"))
