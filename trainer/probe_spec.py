"""What a pass@k probe samples: the request body of `POST /v1/probes` and `brorl probe`.

A probe asks "is what N = 16 misses solvable?" before anyone spends GPU hours on broad
exploration: it samples a model `n` times on each of `prompts` eval prompts of a task. Like the
job spec it is a frozen pydantic model, importable without torch, whose violations name their
field; `model` and `task` are the job spec's own sections (one definition), or `model` names a
checkpoint of one of the tenant's jobs (`{job, step}`), whose task is then the default.
"""
from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, ValidationError, model_validator

from trainer.spec import (
    TINY_MIN_NEW_TOKENS,
    TINY_MODEL,
    FieldError,
    JobSpec,
    LimitsSpec,
    ModelSpec,
    TaskSpec,
    _Frozen,
    spec_errors,
)

PROBE_MAX_N = 4096
PROBE_MAX_PROMPTS = 1024
# Samples generated per engine call: memory stays bounded whatever n is (n up to 4096), and
# a cancel is looked at between calls.
DEFAULT_CHUNK_SAMPLES = 1024


class CheckpointRef(_Frozen):
    """A checkpoint of one of the caller's jobs: its `step`, or the newest when null."""

    job: str = Field(..., min_length=1, max_length=64)
    step: int | None = Field(None, ge=0)


class ProbeSpec(_Frozen):
    """A pass@k probe: `n` samples on each of `prompts` eval prompts of `task`."""

    spec_version: Literal[1] = 1
    model: ModelSpec | CheckpointRef = Field(default_factory=ModelSpec)
    task: TaskSpec | None = Field(None, description="Required unless model is a job checkpoint.")
    n: int = Field(512, ge=2, le=PROBE_MAX_N, description="Samples per prompt.")
    prompts: int = Field(64, ge=1, le=PROBE_MAX_PROMPTS, description="Eval prompts probed.")
    max_new_tokens: int = Field(256, ge=1, le=131_072)
    temperature: float = Field(1.0, gt=0, le=2, description="Training's rollout temperature by default.")
    top_p: float = Field(1.0, gt=0, le=1)
    seed: int = Field(0, ge=0, le=2**32 - 1)
    engine: Literal["auto", "vllm", "hf"] = "auto"
    chunk_samples: int = Field(DEFAULT_CHUNK_SAMPLES, ge=16, le=65_536,
                               description="Samples per generation call (memory bound).")
    limits: LimitsSpec = Field(default_factory=LimitsSpec)

    @model_validator(mode="after")
    def _task_known(self) -> "ProbeSpec":
        if self.task is None and not isinstance(self.model, CheckpointRef):
            raise FieldError("task", "required (a job spec's task section) unless model is "
                             "{job, step}, whose job's task is then used")
        if isinstance(self.model, ModelSpec) and self.model.path == TINY_MODEL \
                and self.max_new_tokens < TINY_MIN_NEW_TOKENS:
            raise FieldError("max_new_tokens", f"{self.max_new_tokens} is too short for builtin:tiny, "
                             f"which writes one character per token: use at least {TINY_MIN_NEW_TOKENS}")
        return self


def base_job_spec(probe: ProbeSpec, model: ModelSpec | None = None, task: TaskSpec | None = None,
                  name: str = "probed") -> JobSpec:
    """The job spec a probe stands for (its model, task, seed, sampling): the base of the
    recommended spec, and the key of builtin:tiny's warm-started model (the same model a job
    on this task and seed trains from)."""
    model = model or (probe.model if isinstance(probe.model, ModelSpec) else ModelSpec())
    task = task or probe.task
    return JobSpec(name=name, seed=probe.seed, model=model, task=task,
                   rollout={"max_new_tokens": probe.max_new_tokens, "temperature": probe.temperature,
                            "top_p": probe.top_p, "engine": probe.engine})


def job_spec_of_checkpoint(probe: ProbeSpec, job_spec: dict[str, Any]) -> JobSpec:
    """The job spec a probe of a job's checkpoint stands for: the job's (as stored), with the
    probe's task when it names one, its sampling and its seed. FieldError naming the probe's
    field (or `model.job`) when the probe's sampling does not suit the job's model."""
    spec = JobSpec.model_validate(job_spec).model_dump(mode="json")
    if probe.task is not None:
        spec["task"] = probe.task.model_dump(mode="json")
    spec["rollout"].update({"max_new_tokens": probe.max_new_tokens, "temperature": probe.temperature,
                            "top_p": probe.top_p, "engine": probe.engine})
    spec["seed"] = probe.seed
    try:
        return JobSpec.model_validate(spec)
    except ValidationError as exc:
        err = spec_errors(exc)[0]
        field = err["field"].removeprefix("rollout.")
        raise FieldError(field if field in ProbeSpec.model_fields else "model.job", err["message"]) from None
