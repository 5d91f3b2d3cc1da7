"""Multi-turn environments: the episodes a trajectory talks to (base.py), three ways in, and the
registry that picks one from the spec's `task.env`.

- `type: tools` (tools_env.py): the tenant's Python functions and a code interpreter, run in
  the sandbox;
- `type: verifiers` (verifiers_env.py): an installed `verifiers` environment the operator lists
  in BRORL_ENVIRONMENTS;
- `type: openenv` (openenv_env.py): an OpenEnv server the operator lists in
  BRORL_OPENENV_SERVERS.

Each module is imported only when a job names its type (the verifiers library, an HTTP client
and the sandbox are not every job's business). Each has `build(env_spec, *, task, settings,
tag) -> Environment` and `check(...)`; verifiers and openenv also `task(env_spec, settings,
seed) -> Task`, the examples they bring when the job gives no reasoning_gym or dataset.
"""
from __future__ import annotations

import importlib
from typing import Any

MODULES = {"tools": "tools_env", "verifiers": "verifiers_env", "openenv": "openenv_env"}


def _module(env_spec: Any):
    kind = getattr(env_spec, "type", None)
    if kind not in MODULES:
        raise ValueError(f"task.env.type: {kind!r} is not one of {', '.join(MODULES)}")
    return importlib.import_module(f"{__name__}.{MODULES[kind]}")


def build_environment(env_spec: Any, *, task: Any = None, settings: Any = None, tag: str = "job") -> Any:
    """The job's `Environment` (base.py), built once per job; the caller closes it."""
    return _module(env_spec).build(env_spec, task=task, settings=settings, tag=tag)


def environment_task(env_spec: Any, settings: Any, seed: int) -> Any:
    """The examples an environment brings (verifiers: its dataset; openenv: reset seeds) as a
    `Task`; for tools, which brings none, a ValueError."""
    module = _module(env_spec)
    if not hasattr(module, "task"):
        raise ValueError(f"task.env.type {env_spec.type} brings no examples: give task.reasoning_gym "
                         "or task.dataset")
    return module.task(env_spec, settings, seed)


def check_environment(env_spec: Any, settings: Any = None) -> None:
    """A ValueError naming the field when the operator's deployment cannot run `env_spec`
    (a name not listed in BRORL_ENVIRONMENTS / BRORL_OPENENV_SERVERS, tools that do not parse):
    the API's submission check."""
    module = _module(env_spec)
    if env_spec.type == "tools":
        module.check(env_spec)
    else:
        module.check(env_spec, settings)
