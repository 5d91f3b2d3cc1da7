"""The job spec's `task` section: a reasoning-gym task or an uploaded dataset, and the reward
(a built-in verifier or a user's grader) (trainer/spec.py)."""
from __future__ import annotations

import difflib
import functools
import json
from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from trainer.spec_base import MAX_TASK_CONFIG_BYTES, FieldError, _Frozen

@functools.lru_cache(maxsize=1)
def reasoning_gym_task_names() -> tuple[str, ...]:
    """Registered reasoning-gym task names (imported lazily: it is not needed elsewhere)."""
    from reasoning_gym.factory import DATASETS

    return tuple(sorted(DATASETS))



def _small_json(value: dict[str, Any], limit: int) -> dict[str, Any]:
    """`value` when it is plain JSON (no NaN or Infinity) of at most `limit` bytes."""
    try:
        size = len(json.dumps(value, allow_nan=False))
    except (ValueError, TypeError, RecursionError):
        raise ValueError("must be plain JSON without NaN or Infinity") from None
    if size > limit:
        raise ValueError(f"is {size} bytes as JSON; at most {limit}")
    return value

class ReasoningGymTask(_Frozen):
    name: str = Field(..., min_length=1, max_length=200,
                      description="A registered reasoning-gym task, e.g. chain_sum (an unknown name is "
                                  "refused with the close matches).")
    config: dict[str, Any] = Field(
        default_factory=dict,
        description=f"The task's config fields, checked against the task's own config class "
                    f"(at most {MAX_TASK_CONFIG_BYTES} bytes as JSON).")
    train_size: int = Field(10_000, ge=1, le=10_000_000,
                            description="Training questions generated from the job's seed.")
    eval_size: int = Field(200, ge=1, le=100_000,
                           description="Held-out questions for evaluation (another seed).")
    eval_disjoint: bool = Field(
        True, description="Drop eval questions that also occur in the training split. A closed "
        "task space (e.g. one-digit sums) has few unseen questions: false samples eval from the "
        "same generator with another seed, overlaps allowed.")

    @field_validator("config")
    @classmethod
    def _small_config(cls, config: dict[str, Any]) -> dict[str, Any]:
        # Stored with the job and sent back on every read: a few KB, not megabytes of junk.
        return _small_json(config, MAX_TASK_CONFIG_BYTES)

    @field_validator("name")
    @classmethod
    def _registered(cls, name: str) -> str:
        names = reasoning_gym_task_names()
        if name not in names:
            close = difflib.get_close_matches(name, names, n=5, cutoff=0.5)
            hint = f"; close matches: {', '.join(close)}" if close else ""
            raise ValueError(f"unknown reasoning-gym task {name!r}{hint}")
        return name

    @model_validator(mode="after")
    def _config_is_valid(self) -> "ReasoningGymTask":
        # Bounds on every field (trainer.tasks.config_limits says which and why), then
        # reasoning-gym's own checks; any exception there is a problem with the config.
        from trainer.tasks.config_limits import ConfigProblem, check_config

        try:
            check_config(self.name, self.config)
        except ConfigProblem as exc:
            raise FieldError(exc.field, exc.message) from None
        return self


DEFAULT_VERIFIER = "exact"
DEFAULT_NUMERIC_TOLERANCE = 1e-6


class DatasetTask(_Frozen):
    id: str = Field(..., min_length=1, max_length=64,
                    description="An uploaded JSONL dataset (ds_..., from POST /v1/datasets).")
    # verifier and numeric_tolerance default to None ("the default"), not to their values: a
    # spec is stored with every default written out and re-validated by the worker, so "was it
    # given?" must be readable from the values themselves (a grader excludes both).
    verifier: Literal["exact", "numeric", "math", "regex"] | None = Field(
        None, description="How the extracted answer is compared with the row's answer (`answer`, "
        "else `reference_answer`): exact (equal after stripping whitespace), numeric (a plain "
        "number within numeric_tolerance), math (math-verify equivalence; arithmetic left to do "
        "is refused) or regex (the answer is a Python regular expression that must match the "
        "whole extraction). null: exact. Not with task.grader, which is then the reward.")
    eval_fraction: float = Field(0.05, gt=0, lt=1, description="Share of the rows held out for "
                                 "evaluation (a seeded split; at least one row on each side).")
    numeric_tolerance: float | None = Field(
        None, ge=0, le=1e6, description=f"Relative tolerance of the numeric verifier (absolute when "
        f"the answer is 0). null: {DEFAULT_NUMERIC_TOLERANCE:g}. Not with task.grader.")

    @property
    def verifier_name(self) -> str:
        """The verifier that scores the rows (the default when none was given)."""
        return self.verifier or DEFAULT_VERIFIER

    @property
    def tolerance(self) -> float:
        """The numeric verifier's tolerance (the default when none was given)."""
        return DEFAULT_NUMERIC_TOLERANCE if self.numeric_tolerance is None else self.numeric_tolerance


MAX_ENV_ARGS_BYTES = 16 * 1024
MAX_TOOLS_SOURCE_CHARS = 100_000
MAX_ENV_TURNS = 64
MAX_ENV_TOTAL_TOKENS = 131_072
ENV_TYPES_WITH_EXAMPLES = ("verifiers", "openenv")   # they supply prompts when the task gives none


class EnvSpec(_Frozen):
    """`task.env`: a multi-turn environment the model talks to (docs/agents.md)."""

    type: Literal["tools", "verifiers", "openenv"] = Field(
        ..., description="tools: your Python functions (and a code interpreter) as tools, run in the "
        "sandbox; verifiers: an installed `verifiers` environment the operator lists; openenv: an "
        "OpenEnv server the operator lists.")
    name: str | None = Field(
        None, min_length=1, max_length=200,
        description="verifiers: an environment id listed in BRORL_ENVIRONMENTS; openenv: a server "
                    "name listed in BRORL_OPENENV_SERVERS (never a URL); tools: not used.")
    args: dict[str, Any] = Field(
        default_factory=dict,
        description=f"verifiers: load_environment(**args); openenv: extra JSON for every reset "
                    f"(train_size, eval_size: how many examples). At most {MAX_ENV_ARGS_BYTES} bytes as JSON.")
    tools: str | None = Field(
        None, max_length=MAX_TOOLS_SOURCE_CHARS,
        description="type tools: Python source defining the tool functions (type hints and the "
                    "docstring give each tool's schema).")
    code_interpreter: bool = Field(False, description="type tools: add a `python` tool that runs code "
                                                      "in the sandbox and answers with what it printed.")
    tool_timeout_s: float = Field(10.0, gt=0, le=600, description="One tool call's time limit in seconds.")
    max_turns: int = Field(4, ge=1, le=MAX_ENV_TURNS, description="Model turns per episode.")
    max_total_tokens: int | None = Field(
        None, ge=1, le=MAX_ENV_TOTAL_TOKENS,
        description="The whole episode's completion tokens, the model's and the environment's "
                    "together; a trajectory that runs out is truncated. null: rollout.max_new_tokens. "
                    "Each model turn writes at most rollout.max_new_tokens of it.")
    reward: Literal["env", "grader", "sum"] | None = Field(
        None, description="env: the environment's own reward; grader: task.grader (or the built-in "
        "verifier) over the final transcript; sum: both added. null: env for verifiers and openenv, "
        "grader for tools.")

    @property
    def reward_mode(self) -> str:
        """The reward as run: `reward`, or the type's default."""
        if self.reward is not None:
            return self.reward
        return "grader" if self.type == "tools" else "env"

    @field_validator("args")
    @classmethod
    def _small_args(cls, args: dict[str, Any]) -> dict[str, Any]:
        return _small_json(args, MAX_ENV_ARGS_BYTES)

    @model_validator(mode="after")
    def _fits_its_type(self) -> "EnvSpec":
        if self.type == "tools":
            if self.name is not None or self.args:
                raise FieldError("task.env.name" if self.name is not None else "task.env.args",
                                 "is not used by type tools: give the tools' source in task.env.tools")
            if not self.tools and not self.code_interpreter:
                raise FieldError("task.env.tools", "type tools needs tool functions (task.env.tools) "
                                 "or code_interpreter: true")
            self._check_tools()
        else:
            if self.name is None:
                setting = "BRORL_ENVIRONMENTS" if self.type == "verifiers" else "BRORL_OPENENV_SERVERS"
                raise FieldError("task.env.name", f"type {self.type} needs a name listed in {setting}")
            for field in ("tools", "code_interpreter"):
                if getattr(self, field):
                    raise FieldError(f"task.env.{field}", f"is for type tools, not {self.type}")
        return self

    def _check_tools(self) -> None:
        # The tenant's source is parsed (never run) here, so a bad tool is a 422 at submission.
        from trainer.rollouts.environments.tools_env import ToolSourceError, check

        try:
            check(self)
        except ToolSourceError as exc:
            raise FieldError("task.env.tools", str(exc)) from None


class TaskSpec(_Frozen):
    reasoning_gym: ReasoningGymTask | None = Field(
        None, description="A generated reasoning-gym task. Give exactly one of reasoning_gym and dataset "
                          "(or neither, with a task.env of type verifiers or openenv).")
    dataset: DatasetTask | None = Field(
        None, description="An uploaded JSONL dataset: {prompt, answer} rows or OpenAI's RFT rows "
                          "{messages, ...} (docs/graders.md). Give exactly one of reasoning_gym "
                          "and dataset (or neither, with a task.env of type verifiers or openenv).")
    env: EnvSpec | None = Field(
        None, description="A multi-turn environment (tools, a verifiers environment, an OpenEnv "
                          "server): each rollout is an episode of model turns and environment "
                          "replies (docs/agents.md). null: single-turn.")
    prompt_template: str | None = Field(
        None, max_length=20_000,
        description="null: the default prompt asking for the answer inside <answer>...</answer> (a system "
                    "message for chat models); else a text containing {question}, used verbatim (a chat "
                    "model's template must carry its own chat markup).")
    reward: Literal["binary", "score"] = Field(
        "binary", description="binary: 1 when the verifier's (or grader's) score is 1, else 0; "
                              "score: the score itself (partial credit).")
    grader: dict[str, Any] | None = Field(
        None, description="Bring your own reward: a grader in OpenAI's reinforcement fine-tuning "
        "JSON (string_check, text_similarity, python, multi, score_model, label_model) or this "
        "service's code and verifier types (docs/graders.md, examples/graders/). It replaces the "
        "dataset's verifier or the reasoning-gym scorer; its `item` is the dataset row (or the "
        "reasoning-gym entry), its `sample` the completion. null: the built-in verifier.")
    grader_error_fraction: float = Field(
        0.5, gt=0, le=1, description="The job fails when more than this share of a step's "
        "samples have a grader error (the message names the error) for grader_error_steps "
        "steps in a row.")
    grader_error_steps: int = Field(
        3, ge=1, le=1000, description="Steps in a row over grader_error_fraction before the job "
                                      "fails.")

    @field_validator("prompt_template")
    @classmethod
    def _has_question(cls, v: str | None) -> str | None:
        if v is not None and "{question}" not in v:
            raise ValueError("must contain the placeholder {question}")
        return v

    @field_validator("grader")
    @classmethod
    def _valid_grader(cls, grader: dict[str, Any] | None) -> dict[str, Any] | None:
        if grader is not None:
            check_grader(grader, "task.grader")
        return grader

    @model_validator(mode="after")
    def _exactly_one(self) -> "TaskSpec":
        if self.reasoning_gym is not None and self.dataset is not None:
            raise FieldError("task", "give at most one of reasoning_gym or dataset")
        if self.reasoning_gym is None and self.dataset is None:
            if self.env is None or self.env.type not in ENV_TYPES_WITH_EXAMPLES:
                raise FieldError("task", "give exactly one of reasoning_gym or dataset (only a task.env of "
                                 "type verifiers or openenv brings its own examples)")
        return self

    @model_validator(mode="after")
    def _env_reward(self) -> "TaskSpec":
        if self.env is None:
            return self
        if self.env.reward_mode == "env" and self.grader is not None:
            raise FieldError("task.grader", "is not used with task.env.reward env (the environment's own "
                             "reward): set task.env.reward to grader or sum, or leave the grader out")
        if self.env.reward_mode != "env" and self.grader is None and self.reasoning_gym is None \
                and self.dataset is None and self.env.type == "openenv":
            raise FieldError("task.env.reward", f"{self.env.reward_mode} needs task.grader: an OpenEnv "
                             "server's examples carry no answer for a built-in verifier")
        return self

    @model_validator(mode="after")
    def _grader_or_verifier(self) -> "TaskSpec":
        # On values, never on which fields were set: the stored spec (defaults written out)
        # must re-validate as the submitted one did (tests/trainer/test_spec_roundtrip.py).
        if self.grader is not None and self.dataset is not None:
            for name in ("verifier", "numeric_tolerance"):
                if getattr(self.dataset, name) is not None:
                    raise FieldError(f"task.dataset.{name}", "give either task.grader or the "
                                     "dataset's verifier, not both: the grader is the reward "
                                     "(use a grader of type verifier for a built-in one)")
        return self


def _grader_path(loc: tuple) -> str:
    """A grader error's location without pydantic's union tags (`python`, `multi`, ...)."""
    from trainer.graders.schemas import GRADER_TYPES

    out: list[str] = []
    for i, part in enumerate(loc):
        tag_slot = i == 0 or (i >= 2 and loc[i - 2] == "graders")
        if tag_slot and part in GRADER_TYPES:
            continue
        out.append(str(part))
    return ".".join(out)


def check_grader(grader: Any, where: str) -> None:
    """FieldError naming `where.<path>` when `grader` is not a valid grader (trainer.graders)."""
    from trainer.graders.schemas import parse_grader

    try:
        parse_grader(grader)
    except ValidationError as exc:
        err = exc.errors(include_url=False)[0]
        path = _grader_path(tuple(err["loc"]))
        raise FieldError(f"{where}.{path}" if path else where,
                         err["msg"].removeprefix("Value error, ")) from None


# --------------------------------------------------------------------------- rollout
