"""Public response models: what clients see of each entity, and the list envelope.

One `...Public` model per table (the full-stack template's naming), built from the ORM row
with `from_attributes`; internal columns (tenant, lease, idempotency hash, file paths) are
simply not fields here, so they cannot leak. Shapes follow the OpenAI fine-tuning API where
it fits: every object carries `object`, lists are `{"object": "list", "data", "has_more"}`.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Generic, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, model_validator

from store.tables import EventType, JobStatus

T = TypeVar("T")


class _Public(BaseModel):
    model_config = ConfigDict(from_attributes=True)


class ListPublic(BaseModel, Generic[T]):
    """A page of objects; `has_more` says whether asking again with `after` gives more."""

    object: Literal["list"] = "list"
    data: list[T]
    has_more: bool = False


class StagePublic(BaseModel):
    n: int
    prompts_per_step: int
    steps: int


class JobOverview(BaseModel):
    """What a list of jobs shows of each spec: a few fields, not the whole (kilobyte) spec."""

    model: str = Field(description="model.path")
    task: str = Field(description="The reasoning-gym task's name, `dataset <id>`, or the task kind.")
    schedule: list[StagePublic] = Field(description="rollout.schedule: N, prompts and steps per stage.")
    eval_every: int = Field(description="eval.every (0: no periodic evaluation).")


def job_overview(spec: dict[str, Any]) -> JobOverview:
    task = spec.get("task") or {}
    if task.get("reasoning_gym"):
        task_name = task["reasoning_gym"]["name"]
    elif task.get("dataset"):
        task_name = f"dataset {task['dataset'].get('id')}"
    else:
        task_name = next((k for k, v in task.items() if v), "")
    stages = (spec.get("rollout") or {}).get("schedule") or []
    return JobOverview(model=(spec.get("model") or {}).get("path", ""), task=task_name,
                       schedule=[StagePublic(n=st["n"], prompts_per_step=st["prompts_per_step"],
                                             steps=st["steps"]) for st in stages],
                       eval_every=(spec.get("eval") or {}).get("every") or 0)


class JobSummary(_Public):
    """A job in a list: everything but the spec (which can be kilobytes per job)."""

    id: str
    object: Literal["job"] = "job"
    name: str
    status: JobStatus
    created_at: datetime
    started_at: datetime | None = None
    finished_at: datetime | None = None
    attempt: int = Field(description="How many times a worker claimed the job (0 while queued).")
    cancel_requested: bool
    pause_requested: bool = Field(False, description="A pause was asked for; the running job "
                                  "stops and becomes `paused` (POST /v1/jobs/{id}/resume).")
    step: int = Field(description="The last step that wrote metrics.")
    total_steps: int
    error: str | None = None
    warning: str | None = Field(None, description="The trainer's latest warning (e.g. the job "
                                                  "cannot learn, and which field to change).")
    parent_job_id: str | None = Field(None, description="The job whose checkpoint this one continues "
                                      "(spec.continue_from); its continuations: "
                                      "GET /v1/jobs/{id}/continuations.")
    overview: JobOverview = Field(description="Model, task and schedule, from the spec.")

    @model_validator(mode="before")
    @classmethod
    def _with_overview(cls, data: Any) -> Any:
        """From a job row: its columns, plus the overview derived from its spec."""
        if isinstance(data, dict):
            return data
        values = {name: getattr(data, name) for name in cls.model_fields
                  if name != "overview" and hasattr(data, name)}
        values["overview"] = job_overview(data.spec)
        return values


class QueuePublic(BaseModel):
    position: int = Field(description="1: the next job a worker of this queue takes.")
    gpus: int = Field(description="The queue: jobs asking for this many GPUs (per node).")
    multi_node: bool = Field(description="The queue of every multi-node job instead (its Ray "
                             "drivers'), whatever its GPUs per node.")
    ahead: int = Field(description="Queued jobs ahead of this one, every tenant's.")
    yours_ahead: list[str] = Field(description="Your jobs among them (others' are only counted).")
    others_ahead: int
    running: int = Field(description="Jobs of this queue running now.")


class JobPublic(JobSummary):
    spec: dict[str, Any] = Field(description="The job spec as stored, defaults filled in.")
    # Filled by GET /v1/jobs/{id} (api/estimates.py); null elsewhere.
    queue: QueuePublic | None = Field(None, description="A queued job's place in the queue of "
                                      "its GPU count; null when not queued.")
    eta_seconds: float | None = Field(None, description="A running job's seconds left, from its "
                                      "own recent steps; null otherwise or before its first step.")
    eta_at: datetime | None = Field(None, description="When a running job should finish (now + eta_seconds).")


class EventPublic(_Public):
    id: int = Field(description="Increasing; pass the last one seen as `after`.")
    object: Literal["job.event"] = "job.event"
    job_id: str
    type: EventType
    data: dict[str, Any] = Field(default_factory=dict)
    created_at: datetime


class MetricPublic(_Public):
    """One training step. The step's numbers are nested under `values` (not flattened):
    metric names such as `step` or `eval/pass@1` must not collide with the envelope."""

    object: Literal["job.metric"] = "job.metric"
    step: int
    values: dict[str, Any]
    created_at: datetime


class SamplePublic(_Public):
    """One stored rollout of a step (`samples.per_step`): what the model wrote and how it scored."""

    id: int = Field(description="Pass the last one seen as `after` for the next page.")
    object: Literal["job.sample"] = "job.sample"
    step: int
    idx: int = Field(description="Its place among the step's stored samples (highest rewards first).")
    prompt: str
    completion: str
    reward: float
    correct: bool
    truncated: bool = Field(description="Cut at rollout.max_new_tokens before it finished.")
    advantage: float
    sub_rewards: dict[str, float] = Field(default_factory=dict)
    messages: list[SampleMessage] | None = Field(
        None, description="A multi-turn sample's transcript (`task.env`), turn by turn: the opening "
        "messages, the model's turns with their tool calls, the tool results and other environment "
        "messages; each text cut to samples.max_chars. Null for single-turn samples.")
    turns: int | None = Field(None, description="Model turns in the episode (null: single-turn).")
    tool_calls: int | None = Field(None, description="Tool calls the model made in the episode.")
    tool_errors: int | None = Field(None, description="Of which failed: malformed, unknown tool, "
                                    "raised, timed out.")
    messages_dropped: int | None = Field(None, description="Messages at the transcript's end not "
                                         "stored (over 200,000 characters or 512 messages).")
    env_error: str | None = Field(None, description="What broke the environment, when it broke the "
                                  "episode (its reward is then 0 and nothing is learnt from it).")
    created_at: datetime

    @classmethod
    def of(cls, row: Any) -> SamplePublic:
        """From a stored sample row: the episode's counts come out of its `env` column."""
        env = row.env or {}
        fields = {name: getattr(row, name) for name in cls.model_fields if hasattr(row, name)}
        fields.update({k: env.get(k) for k in ("turns", "tool_calls", "tool_errors", "messages_dropped")})
        fields["env_error"] = env.get("error")
        return cls.model_validate(fields)


class SampleToolFunction(BaseModel):
    name: str
    arguments: str = Field(description="The arguments as the model wrote them (a JSON string).")


class SampleToolCall(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: SampleToolFunction


class SampleMessage(BaseModel):
    """One chat message of a stored transcript (OpenAI's shape)."""

    role: str = Field(description="system, user, assistant, tool (or an environment's own role).")
    content: str
    tool_calls: list[SampleToolCall] | None = Field(None, description="An assistant turn's tool calls.")
    tool_call_id: str | None = Field(None, description="A tool result: the call it answers.")
    name: str | None = Field(None, description="A tool result: the tool's name.")
    error: bool | None = Field(None, description="A tool result that reports a failed call.")


class CheckpointPublic(_Public):
    object: Literal["job.checkpoint"] = "job.checkpoint"
    job_id: str
    step: int
    bytes: int = Field(description="Size of the checkpoint folder, as the worker recorded it.")
    sha256: str = Field(description="Checksum the worker recorded for the folder's contents; "
                                    "the archive's own checksum is the download's ETag.")
    created_at: datetime
    kind: Literal["full", "lora"] = Field(
        "full", description="full: the archive is an HF model folder. lora: the archive is PEFT's "
                            "adapter (adapter_config.json + adapter_model.safetensors; load it onto the "
                            "base with peft, or in vLLM with --enable-lora); merged_download_url gives "
                            "the base with the adapter merged in, an HF model folder.")
    download_url: str = Field(description="The archive: the HF folder (full) or the adapter (lora), "
                                          "each with the trainer state for an exact resume.")
    merged_download_url: str | None = Field(
        None, description="lora only: the merged HF model folder (no peft needed); null for full.")


class DatasetPublic(_Public):
    id: str
    object: Literal["dataset"] = "dataset"
    name: str
    rows: int
    bytes: int
    sha256: str = Field(description="sha256 of the uploaded file, as received.")
    created_at: datetime


class StatusPublic(BaseModel):
    status: str
    checks: dict[str, str] | None = None
    sandbox: str | None = Field(None, description="/readyz: the grader sandbox layer "
                                "(bubblewrap, landlock, unsafe or none).")
    sandbox_reason: str | None = Field(None, description="/readyz: why no better sandbox "
                                       "layer works here (what the operator must provide).")
