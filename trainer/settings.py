"""The environment variables the trainer reads on its own, in one place.

Everything else a run needs comes from the job spec; these are the machine's business
(how many threads, where to cache built models, how long ranks get to stop, what starts them), set by the
operator. Read fresh on each call, so a test or a worker can change them between runs.
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

PREFIX = "BRORL_"


# What BRORL_LAUNCHER may name: name -> "module:class" of a `trainer.distributed.launchers`
# Launcher, imported only when chosen (a launcher's library, e.g. ray, stays optional for
# deployments that do not use it). Kept here rather than with the launchers, which read these
# settings: reading the settings never imports a launcher.
LAUNCHERS: dict[str, str] = {"local": "trainer.distributed.local:LocalLauncher",
                             "ray": "trainer.distributed.ray_launcher:RayLauncher"}
DEFAULT_LAUNCHER = "local"
# A verifiers environment id (`vf.load_environment`'s): a package name, optionally "owner/name".
_ENV_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}(?:/[A-Za-z0-9][A-Za-z0-9._-]{0,99})?")


class TrainerSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix=PREFIX, extra="ignore")

    torch_threads: int | None = Field(None, ge=1, description="torch intra-op threads (default: usable CPUs)")
    cache_dir: Path = Field(default_factory=lambda: Path.home() / ".cache" / "brorl",
                            description="where builtin:tiny and other built models are cached")
    rank_stop_grace_s: float = Field(120.0, gt=0, description="seconds ranks get to stop before a kill")
    task_build_timeout_s: float = Field(600.0, gt=0, description="time a task's dataset may take to build")
    task_build_memory_mb: int = Field(8192, ge=64, description="memory a task's build may add")
    malloc: Literal["default", "mmap_threshold", "trim"] = Field(
        "default", description="how freed CPU tensors go back to the OS (trainer/malloc.py)")
    launcher: str = Field(DEFAULT_LAUNCHER, description="what starts a many-rank job's ranks (trainer.distributed.launchers)")
    # The ray launcher (trainer.distributed.ray_launcher); a multi-node job uses it whatever BRORL_LAUNCHER says.
    ray_address: str = Field("", description="the Ray cluster the ray launcher joins (ray.init's address)")
    ray_gpu_resource: str = Field("GPU", min_length=1, description="the Ray resource one rank takes "
                                  "(a custom one on CPU-only clusters)")
    ray_cpus_per_rank: float = Field(1.0, gt=0, description="CPUs reserved per rank in a node's bundle")
    ray_memory_per_rank_gb: float = Field(8.0, ge=0, description="host memory (GiB) reserved per rank in a "
                                          "node's bundle (0: none reserved)")
    ray_placement_timeout_s: float = Field(0.0, ge=0, description="how long a job waits for its nodes "
                                           "before it fails (0: until cancelled)")
    # Read (and checked) by trainer.rollouts.environments.openenv_env, which stays unimported here.
    openenv_servers: str = Field("", description='JSON {"name": "http://host:port" or {"url", ...}}: '
                                 "the OpenEnv servers a job may name in task.env.name")
    ray_shrink_after_s: float = Field(60.0, ge=0, description="how long a job with resources.min_nodes "
                                      "waits for all its nodes before it runs on fewer, when fewer exist")

    # The built-in tools environment (trainer/rollouts/environments/tools_env.py).
    tool_sandboxes: int | None = Field(None, ge=1, le=64, description="sandboxes one job's tool calls "
                                       "run in at once (default: one per CPU, 2 to 16)")
    # Multi-turn environments (trainer/rollouts/environments/verifiers_env.py).
    environments: Annotated[tuple[str, ...], NoDecode] = Field(
        (), description="comma list of the installed verifiers environment ids a job's task.env may name")

    @field_validator("environments", mode="before")
    @classmethod
    def _environment_ids(cls, v: object) -> object:
        if isinstance(v, str):
            v = [part.strip() for part in v.split(",") if part.strip()]
        if isinstance(v, (list, tuple)):
            for env_id in v:
                if not isinstance(env_id, str) or not _ENV_ID.fullmatch(env_id):
                    raise ValueError(f"{env_id!r} is not an environment id (letters, digits, and . _ - /)")
            return tuple(dict.fromkeys(v))
        return v

    @field_validator("launcher")
    @classmethod
    def _known_launcher(cls, v: str) -> str:
        if v not in LAUNCHERS:
            raise ValueError(f"no such launcher; choose one of {', '.join(sorted(LAUNCHERS))}")
        return v

    @field_validator("torch_threads", "tool_sandboxes", mode="before")
    @classmethod
    def _empty_is_unset(cls, v: object) -> object:
        return None if isinstance(v, str) and not v.strip() else v


def trainer_settings(env: Mapping[str, str] | None = None) -> TrainerSettings:
    """The settings from the process environment, or from `env` (tests); a bad value is a
    ValueError naming its variable."""
    try:
        if env is None:
            return TrainerSettings()
        fields = TrainerSettings.model_fields
        values = {k[len(PREFIX):].lower(): v for k, v in env.items()
                  if k.startswith(PREFIX) and k[len(PREFIX):].lower() in fields}
        return TrainerSettings(**values)
    except ValidationError as exc:
        err = exc.errors()[0]
        name = PREFIX + str(err["loc"][0]).upper()
        raise ValueError(f"{name}={err.get('input')!r}: {err['msg']}") from None
