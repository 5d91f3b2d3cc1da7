"""What an evaluation compares: the body of `POST /v1/jobs/{id}/evaluations` and `brorl evaluate`.

An evaluation samples one or more checkpoints of a job (by step, `"latest"` or `"best"`) and,
unless `base` is false, the model the job started from, `n` times on each of `prompts` held-out
prompts (the job's eval split, or another task's), and reports pass@k with confidence intervals
per model side by side (docs/evaluation.md). Like the job spec it is a frozen pydantic model,
importable without torch, whose violations name their field. Every sampling setting left null
is the job's own evaluation setting (`eval.samples_per_prompt`, `eval.k`, `eval.temperature`,
`eval.top_p`, `rollout.max_new_tokens`, `rollout.engine`), so by default an evaluation measures
exactly what the job's eval/pass@k curve measured, on more prompts or samples if asked.

The service stores the spec resolved (`resolved`): `checkpoints` become steps (how "latest" and
"best" were picked is written in `picked`) and every null sampling setting is filled in, so
every attempt of an evaluation compares the same checkpoints in the same way.
"""
from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import Field, model_validator

from trainer.probe_spec import DEFAULT_CHUNK_SAMPLES, PROBE_MAX_PROMPTS
from trainer.spec import TINY_MIN_NEW_TOKENS, TINY_MODEL, FieldError, JobSpec, LimitsSpec, TaskSpec, _Frozen

MAX_CHECKPOINTS = 8
MAX_N = 1024
MAX_K = 8
CheckpointChoice = Union[Annotated[int, Field(ge=0)], Literal["latest", "best"]]


class Picked(_Frozen):
    """How one evaluated step was chosen (filled in by the service)."""

    step: int
    asked: list[str] = Field(description='What named it: "latest", "best" or the step itself.')
    why: str = ""


class EvaluationSpec(_Frozen):
    """Checkpoints of a job (and its base) on held-out prompts: pass@k with intervals."""

    spec_version: Literal[1] = 1
    checkpoints: list[CheckpointChoice] = Field(
        default_factory=lambda: ["latest"], min_length=1, max_length=MAX_CHECKPOINTS,
        description='Steps of the job\'s checkpoints, "latest" (the newest stored) or "best" (the '
                    "stored checkpoint whose step has the highest eval/pass@1 the training recorded).")
    base: bool = Field(True, description="Also evaluate the model the job started from (its model, "
                                         "or the checkpoint it continued), and compare each checkpoint with it.")
    task: TaskSpec | None = Field(None, description="Held-out prompts of another task or uploaded "
                                                    "dataset; null: the job's task (its eval split).")
    prompts: int | None = Field(None, ge=1, le=PROBE_MAX_PROMPTS,
                                description="The first this many eval prompts; null: the whole eval split "
                                            f"(its first {PROBE_MAX_PROMPTS}).")
    n: int | None = Field(None, ge=1, le=MAX_N, description="Samples per prompt; null: the job's "
                                                             "eval.samples_per_prompt.")
    k: list[Annotated[int, Field(ge=1, le=MAX_N)]] | None = Field(
        None, min_length=1, max_length=MAX_K, description="The k of each pass@k (pass@1 is always "
                                                          "reported); each at most n. Null: the job's eval.k.")
    temperature: float | None = Field(None, gt=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    max_new_tokens: int | None = Field(None, ge=1, le=131_072)
    engine: Literal["auto", "vllm", "hf"] | None = None
    seed: int = Field(0, ge=0, le=2**32 - 1, description="Sampling seed; every model gets the same "
                                                          "draws (common random numbers).")
    chunk_samples: int = Field(DEFAULT_CHUNK_SAMPLES, ge=16, le=65_536,
                               description="Samples per generation call (memory bound).")
    limits: LimitsSpec = Field(default_factory=LimitsSpec)
    # Filled in by the service (a value in a request body is ignored):
    job: str | None = Field(None, max_length=64, description="The evaluated job (from the URL).")
    picked: list[Picked] = Field(default_factory=list, description="How each step was chosen.")

    @model_validator(mode="after")
    def _k_within_n(self) -> "EvaluationSpec":
        if self.n is not None and self.k is not None and (bad := [k for k in self.k if k > self.n]):
            raise FieldError("k", f"{bad} exceed n ({self.n})")
        return self

    @property
    def resolved(self) -> bool:
        return all(isinstance(c, int) for c in self.checkpoints) and self.n is not None

    def ks(self) -> list[int]:
        """The k reported: 1 and the asked ones, ascending (resolved specs only)."""
        return sorted({1, *(self.k or [])})


def filled(spec: EvaluationSpec, job: JobSpec, job_id: str, picked: list[Picked]) -> EvaluationSpec:
    """`spec` with the job's settings in place of its nulls and its checkpoints as steps.
    FieldError naming the field when the result does not hold together (k > n, too few tokens
    for builtin:tiny)."""
    n = spec.n or job.eval.samples_per_prompt
    k = spec.k if spec.k is not None else [k for k in job.eval.k if k <= n]
    if bad := [x for x in k if x > n]:
        raise FieldError("k", f"{bad} exceed n ({n})")
    max_new = spec.max_new_tokens or job.rollout.max_new_tokens
    if job.model.path == TINY_MODEL and max_new < TINY_MIN_NEW_TOKENS:
        raise FieldError("max_new_tokens", f"{max_new} is too short for builtin:tiny, which writes one "
                         f"character per token: use at least {TINY_MIN_NEW_TOKENS}")
    update: dict[str, Any] = {
        "checkpoints": [p.step for p in picked], "picked": picked, "job": job_id, "n": n, "k": k or [1],
        "temperature": spec.temperature or job.eval.temperature, "top_p": spec.top_p or job.eval.top_p,
        "max_new_tokens": max_new, "engine": spec.engine or job.rollout.engine,
        "task": spec.task or job.task,
    }
    return EvaluationSpec.model_validate({**spec.model_dump(mode="json"),
                                          **{key: _plain(v) for key, v in update.items()}})


def _plain(value: Any) -> Any:
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value.model_dump(mode="json") if hasattr(value, "model_dump") else value


def sampling_job_spec(spec: EvaluationSpec, job: JobSpec) -> JobSpec:
    """The job spec the evaluation samples with: the job's own (its model, seed and so its eval
    split and builtin:tiny's warm start), with the evaluation's task and sampling."""
    data = job.model_dump(mode="json")
    data["task"] = spec.task.model_dump(mode="json") if spec.task else data["task"]
    data["rollout"].update({"max_new_tokens": spec.max_new_tokens, "engine": spec.engine})
    data["eval"].update({"samples_per_prompt": spec.n, "k": [k for k in spec.ks()],
                         "temperature": spec.temperature, "top_p": spec.top_p})
    data["continue_from"] = None  # the evaluation loads the folders it is given
    return JobSpec.model_validate(data)
