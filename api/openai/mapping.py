"""OpenAI's reinforcement fine-tuning request -> this service's JobSpec, and back for display.

The mapping (docs/migrating-from-openai.md has the table and the reasons):

| OpenAI                               | JobSpec                                                   |
| ------------------------------------ | --------------------------------------------------------- |
| `model`                              | `model.path` (builtin:tiny, a folder under the roots)     |
| `training_file`                      | `task.dataset.id` (a file here is a dataset)              |
| `method.reinforcement.grader`        | `task.grader` (reward `score`: OpenAI trains on the score)|
| `seed`                               | `seed`                                                    |
| `suffix`                             | `name` (default `rft-<training_file>`)                    |
| `batch_size`                         | `rollout.schedule[0].prompts_per_step` (auto: min(16, rows)) |
| `n_epochs`                           | `rollout.schedule[0].steps` = ceil(epochs x train rows / batch) (auto: 1) |
| `compute_multiplier`                 | `rollout.schedule[0].n` = round(16 x multiplier), 2..4096 (auto: 16) |
| `learning_rate_multiplier`           | `optim.lr` = 1e-6 x multiplier (auto: 1e-6)               |
| `eval_interval`                      | `eval.every` (auto: the spec's default, 50)               |
| `eval_samples`                       | `eval.samples_per_prompt`, `eval.k` cut to it (auto: 16)  |
| `reasoning_effort`                   | `rollout.max_new_tokens`: default/low 256, medium 1024, high 4096 |

BroRL's own settings travel in a `brorl` object beside OpenAI's fields (the SDK's
`extra_body={"brorl": {...}}`): any part of a JobSpec except what the OpenAI fields own
(`model.path`, `task.dataset.id`, `task.grader`, `name`, `seed`, `spec_version`), merged over
the mapped spec and validated with it; errors name `brorl.<path>`. A `brorl.rollout.schedule`
(the broadening schedule, N per stage) replaces the one-stage schedule that `n_epochs`,
`batch_size` and `compute_multiplier` make, so giving both is refused as ambiguous.
"""

from __future__ import annotations

import copy
import math
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from trainer.spec import FieldError, JobSpec, spec_errors
from trainer.spec_base import _first_bad_text

from api.openai.errors import bad_request

BASE_LR = 1e-6       # OptimSpec's default: learning_rate_multiplier 1 keeps it
BASE_N = 16          # the default schedule's first stage: compute_multiplier 1 keeps it
DEFAULT_BATCH = 16
DEFAULT_EVAL_K = (1, 4, 16)
DEFAULT_EVAL_FRACTION = 0.05  # DatasetTask's default held-out share
EFFORT_TOKENS = {"default": 256, "low": 256, "medium": 1024, "high": 4096}
MAX_METADATA_KEYS, MAX_METADATA_KEY, MAX_METADATA_VALUE = 16, 64, 512
# What the OpenAI fields set; `brorl` may not set them a second time.
OWNED_BY_OPENAI = ("spec_version", "name", "seed", "model.path", "task.dataset.id", "task.grader",
                   "task.reasoning_gym")
SCHEDULE_HYPERPARAMETERS = ("n_epochs", "batch_size", "compute_multiplier")

Auto = Literal["auto"]


class Hyperparameters(BaseModel):
    """OpenAI's `ReinforcementHyperparameters` with this service's bounds."""

    model_config = ConfigDict(extra="forbid")
    # The bounds sit on the number, not the union: pydantic applies a Field's bounds to
    # every member, and comparing "auto" with a number raised a TypeError (a 500).
    batch_size: Auto | Annotated[int, Field(ge=1, le=8192)] | None = None
    compute_multiplier: Auto | Annotated[float, Field(gt=0, le=256)] | None = None
    eval_interval: Auto | Annotated[int, Field(ge=1, le=1_000_000)] | None = None
    eval_samples: Auto | Annotated[int, Field(ge=1, le=4096)] | None = None
    learning_rate_multiplier: Auto | Annotated[float, Field(gt=0, le=10_000)] | None = None
    n_epochs: Auto | Annotated[int, Field(ge=1, le=1000)] | None = None
    reasoning_effort: Literal["default", "low", "medium", "high"] | None = None


class Reinforcement(BaseModel):
    model_config = ConfigDict(extra="forbid")
    grader: dict[str, Any]
    hyperparameters: Hyperparameters = Field(default_factory=Hyperparameters)


class Method(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["reinforcement", "supervised", "dpo"]
    reinforcement: Reinforcement | None = None
    supervised: dict[str, Any] | None = None
    dpo: dict[str, Any] | None = None


class JobCreate(BaseModel):
    """`POST /v1/fine_tuning/jobs` as the SDK sends it, plus this service's `brorl` object."""

    model_config = ConfigDict(extra="forbid")
    model: str = Field(..., min_length=1, max_length=4096)
    training_file: str = Field(..., min_length=1, max_length=64)
    method: Method | None = None
    validation_file: str | None = Field(None, max_length=64)
    suffix: str | None = Field(None, min_length=1, max_length=64)
    seed: int | None = Field(None, ge=0, le=2**32 - 1)
    metadata: dict[str, str] | None = None
    hyperparameters: dict[str, Any] | None = Field(
        None, description="OpenAI's deprecated top-level (supervised) hyperparameters: refused.")
    integrations: list[dict[str, Any]] | None = None
    brorl: dict[str, Any] | None = Field(
        None, description="BroRL's own settings: part of a JobSpec merged over the mapping.")


def check_text(body: JobCreate) -> None:
    """400 naming the first string a database would refuse (NUL, a lone surrogate), before
    an id is looked up or anything stored: PostgreSQL fails on them with a 500 otherwise."""
    found = _first_bad_text(body.model_dump(exclude_none=True), "")
    if found is not None:
        raise bad_request(*found)


def _value(v: Any, default: Any) -> Any:
    return default if v is None or v == "auto" else v


def _check_shape(body: JobCreate) -> Reinforcement:
    """The parts of the request this service refuses: another method, integrations,
    the deprecated top-level hyperparameters, oversized metadata."""
    if body.method is None:
        raise bad_request("method", "give method {type: reinforcement, reinforcement: {grader, "
                                    "hyperparameters}}: this service trains with RL only")
    if body.method.type != "reinforcement":
        raise bad_request("method.type", f"{body.method.type!r} fine-tuning is not served here; "
                                         f"only 'reinforcement'")
    if body.method.reinforcement is None:
        raise bad_request("method.reinforcement", "required when method.type is reinforcement")
    if body.hyperparameters:
        raise bad_request("hyperparameters", "the top-level hyperparameters are OpenAI's "
                          "deprecated supervised ones; use method.reinforcement.hyperparameters")
    if body.integrations:
        raise bad_request("integrations", "integrations (Weights & Biases) are not supported "
                                          "here; metrics are at GET /v1/jobs/{id}/metrics")
    meta = body.metadata or {}
    if len(meta) > MAX_METADATA_KEYS:
        raise bad_request("metadata", f"at most {MAX_METADATA_KEYS} keys")
    for key, value in meta.items():
        if len(key) > MAX_METADATA_KEY:
            raise bad_request(f"metadata.{key[:64]}", f"keys are at most {MAX_METADATA_KEY} characters")
        if len(value) > MAX_METADATA_VALUE:
            raise bad_request(f"metadata.{key}", f"values are at most {MAX_METADATA_VALUE} characters")
    return body.method.reinforcement


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """`extra` deep-merged over `base` (objects merge, anything else replaces)."""
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _has_path(tree: dict[str, Any], dotted: str) -> bool:
    node: Any = tree
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def _fraction_at(tree: dict[str, Any], dotted: str, default: float) -> float:
    """The number at `dotted` when it is one in (0, 1), else `default` (the spec's own
    validation then names a bad value)."""
    node: Any = tree
    for part in dotted.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    ok = isinstance(node, (int, float)) and not isinstance(node, bool) and 0 < node < 1
    return float(node) if ok else default


def train_rows(rows: int, eval_fraction: float) -> int:
    """Rows left for training after the held-out split (trainer.tasks.dataset_task.split)."""
    if rows < 2:
        return max(rows, 1)
    return rows - min(max(1, round(rows * eval_fraction)), rows - 1)


def resolved_hyperparameters(hp: Hyperparameters, rows: int, eval_fraction: float) -> dict[str, Any]:
    """Every hyperparameter with `auto` replaced by what this service uses."""
    usable = train_rows(rows, eval_fraction)
    batch = int(_value(hp.batch_size, min(DEFAULT_BATCH, usable)))
    epochs = int(_value(hp.n_epochs, 1))
    return {
        "batch_size": batch,
        "n_epochs": epochs,
        "compute_multiplier": float(_value(hp.compute_multiplier, 1.0)),
        "learning_rate_multiplier": float(_value(hp.learning_rate_multiplier, 1.0)),
        "eval_interval": _value(hp.eval_interval, None),
        "eval_samples": int(_value(hp.eval_samples, 16)),
        "reasoning_effort": hp.reasoning_effort or "default",
    }


def build_spec(body: JobCreate, rows: int) -> tuple[JobSpec, dict[str, Any]]:
    """The JobSpec for an OpenAI request on a training file of `rows` rows, and the
    `client_meta` stored with the job (what the spec does not hold). Raises OpenAIError 400
    naming the request field (`method.reinforcement.hyperparameters.batch_size`, ...)."""
    rl = _check_shape(body)
    brorl = body.brorl or {}
    for path in OWNED_BY_OPENAI:
        if _has_path(brorl, path):
            raise bad_request(f"brorl.{path}", "set by the OpenAI fields (model, training_file, "
                              "method.reinforcement.grader, suffix, seed); not here")
    hp = rl.hyperparameters
    given_schedule = _has_path(brorl, "rollout.schedule")
    for name in SCHEDULE_HYPERPARAMETERS:
        if given_schedule and _value(getattr(hp, name), None) is not None:
            raise bad_request(f"method.reinforcement.hyperparameters.{name}",
                              "conflicts with brorl.rollout.schedule, which sets the steps, "
                              "prompts a step and N itself; give one of them")
    eval_fraction = _fraction_at(brorl, "task.dataset.eval_fraction", DEFAULT_EVAL_FRACTION)
    resolved = resolved_hyperparameters(hp, rows, eval_fraction)
    batch, epochs = resolved["batch_size"], resolved["n_epochs"]
    n = min(4096, max(2, round(BASE_N * resolved["compute_multiplier"])))
    steps = max(1, math.ceil(epochs * train_rows(rows, eval_fraction) / batch))
    samples = resolved["eval_samples"]
    spec: dict[str, Any] = {
        "name": body.suffix or f"rft-{body.training_file}",
        "model": {"path": body.model},
        "task": {"dataset": {"id": body.training_file}, "grader": rl.grader, "reward": "score"},
        "rollout": {"schedule": [{"n": n, "prompts_per_step": batch, "steps": steps}],
                    "max_new_tokens": EFFORT_TOKENS[resolved["reasoning_effort"]]},
        "optim": {"lr": BASE_LR * resolved["learning_rate_multiplier"]},
        "eval": {"samples_per_prompt": samples,
                 "k": sorted({k for k in DEFAULT_EVAL_K if k <= samples} | {samples})},
    }
    if body.seed is not None:
        spec["seed"] = body.seed
    if resolved["eval_interval"] is not None:
        spec["eval"]["every"] = resolved["eval_interval"]
    if given_schedule:
        spec["rollout"].pop("schedule")
    spec = _merge(spec, brorl)
    try:
        parsed = JobSpec.model_validate(spec)
    except (ValidationError, FieldError) as exc:
        problems = spec_errors(exc) if isinstance(exc, ValidationError) else [
            {"field": exc.path, "message": exc.message}]
        first = problems[0]
        raise bad_request(request_field(first["field"], brorl), first["message"]) from None
    meta = {"api": "openai", "suffix": body.suffix, "metadata": body.metadata or {},
            "validation_file": body.validation_file, "seed_given": body.seed is not None,
            "hyperparameters": resolved if not given_schedule else {
                k: v for k, v in resolved.items() if k not in SCHEDULE_HYPERPARAMETERS},
            "brorl": brorl or None}
    return parsed, meta


# A spec field -> the request field that set it, for error messages (longest prefix first).
_FIELD_OF = [
    ("task.dataset.id", "training_file"), ("task.grader", "method.reinforcement.grader"),
    ("model.path", "model"), ("model", "model"), ("name", "suffix"), ("seed", "seed"),
    ("rollout.schedule", "method.reinforcement.hyperparameters"),
    ("rollout.max_new_tokens", "method.reinforcement.hyperparameters.reasoning_effort"),
    ("optim.lr", "method.reinforcement.hyperparameters.learning_rate_multiplier"),
    ("eval.every", "method.reinforcement.hyperparameters.eval_interval"),
    ("eval.samples_per_prompt", "method.reinforcement.hyperparameters.eval_samples"),
    ("eval.k", "method.reinforcement.hyperparameters.eval_samples"),
]


def request_field(spec_field: str, brorl: dict[str, Any] | None = None) -> str:
    """The request field to blame for a problem with `spec_field` of the mapped spec."""
    if brorl and _has_path(brorl, spec_field.split(".0")[0].split(".[")[0]):
        return f"brorl.{spec_field}"
    for prefix, field in _FIELD_OF:
        if spec_field == prefix or spec_field.startswith(prefix + "."):
            rest = spec_field[len(prefix):]
            return field + rest if prefix in ("task.grader",) else field
    return f"brorl.{spec_field}"
