"""Estimates before submitting (`POST /v1/jobs?dry_run=true`), a queued job's place in its
queue and a running job's ETA (`GET /v1/jobs/{id}`).

The arithmetic is api/estimate_model.py; the deployment's measurements come through
store/estimates.py. Throughput is measured per model (`model.path`, so per model size) from
this deployment's finished jobs, all tenants pooled; only numbers leave this module.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from pydantic import BaseModel, Field
from sqlalchemy.orm import Session

from store import estimates as store_estimates
from store.datasets import get_dataset_unscoped
from store.settings import Settings
from store.tables import Dataset, Job, JobKind, JobStatus
from trainer.spec import JobSpec

from api.schemas import QueuePublic
from api.estimate_model import (PastJob, Throughput, default_throughput, evaluation_count,
                                measured_throughput, memory, past_accuracy, read_model_shape,
                                wall_seconds, work)

TOKENS_NOTE = ("response tokens at most: every sample counted at rollout.max_new_tokens (most "
               "stop earlier); prompt tokens are not counted")


class StageWork(BaseModel):
    stage: int
    n: int
    prompts_per_step: int
    steps: int
    samples: int = Field(description="steps x prompts_per_step x n (dynamic sampling's refills add more).")
    response_tokens_max: int


class EvaluationWork(BaseModel):
    count: int = Field(description="Evaluations: before the first update, every eval.every steps, at the end.")
    prompts: int
    samples_per_prompt: int
    samples: int
    response_tokens_max: int


class ThroughputPublic(BaseModel):
    source: Literal["measured", "default"]
    jobs: int = Field(description="Finished jobs of this model measured (0: the default).")
    step_seconds_per_token: float = Field(description="A step's seconds per budget token (samples x max_new_tokens).")
    generation_seconds_per_token: float
    startup_seconds: float


class WallTime(BaseModel):
    seconds: float
    parts: dict[str, float] = Field(description="startup, steps, evaluation and total, in seconds.")
    derivation: str
    throughput: ThroughputPublic
    past_accuracy: dict[str, Any] = Field(description="Past finished jobs' wall time over the "
                                          "estimate this service would have given them.")


class MemoryEstimate(BaseModel):
    params: int | None = None
    params_from: str | None = Field(None, description="builtin, config.json, or the size in the model's name.")
    micro_batch_tokens: int | None = None
    bytes: dict[str, int] = Field(default_factory=dict, description="Per trainer rank, by part.")
    total_gb: float | None = None
    worker_gb: float | None = Field(None, description="BRORL_WORKER_MEMORY_GB (null: not set).")
    fits: bool | None = Field(None, description="null when the model's size or the workers' memory is unknown.")
    note: str


class JobEstimate(BaseModel):
    object: Literal["job.estimate"] = "job.estimate"
    model: str
    gpus: int
    steps: int
    stages: list[StageWork]
    evaluation: EvaluationWork
    samples: int
    response_tokens_max: int
    tokens_note: str = TOKENS_NOTE
    wall_time: WallTime
    memory: MemoryEstimate
    fits: bool | None = Field(None, description="false: the spec will not fit the workers' memory.")
    multi_node: bool = Field(False, description="It would wait on the multi-node queue (its Ray "
                             "drivers'), not on the queue of its GPU count.")
    queued_ahead: int = Field(description="Jobs queued now on the queue it would join (every tenant).")


# --------------------------------------------------------------------------- from stored specs

def _section(spec: dict[str, Any], name: str) -> dict[str, Any]:
    value = spec.get(name)
    return value if isinstance(value, dict) else {}


def _budget(spec: dict[str, Any]) -> int:
    return int(_section(spec, "rollout").get("max_new_tokens") or 256)


def _eval_prompts(spec: dict[str, Any], dataset_rows: int | None) -> int:
    task = _section(spec, "task")
    if isinstance(task.get("reasoning_gym"), dict):
        return int(task["reasoning_gym"].get("eval_size") or 0)
    if isinstance(task.get("dataset"), dict) and dataset_rows:
        # trainer/tasks/dataset_task.py split(): round(rows x fraction), at least 1 each side
        fraction = float(task["dataset"].get("eval_fraction") or 0.05)
        return min(max(1, round(dataset_rows * fraction)), dataset_rows - 1)
    return 0


def _eval_samples_after(spec: dict[str, Any], total_steps: int, after_step: int,
                        eval_prompts: int) -> int:
    """Evaluation samples still to come once `after_step` steps are done."""
    ev = _section(spec, "eval")
    every = int(ev.get("every") or 0)
    due = [s for s in range(after_step + 1, total_steps + 1)
           if (every and s % every == 0) or s == total_steps] if every else \
        ([total_steps] if after_step < total_steps else [])
    count = len(due) + (1 if after_step == 0 else 0)  # row 0's evaluation, if not yet written
    return count * eval_prompts * int(ev.get("samples_per_prompt") or 16)


def _scheduled_samples(spec: dict[str, Any], steps: int) -> int:
    """Samples the schedule asks for in its first `steps` steps."""
    total = 0
    for stage in _section(spec, "rollout").get("schedule") or []:
        take = min(int(stage["steps"]), steps)
        total += take * int(stage["n"]) * int(stage["prompts_per_step"])
        steps -= take
    return total


def _past_job(s: Session, job: Job, totals: store_estimates.StepTotals) -> PastJob:
    spec = job.spec or {}
    budget = _budget(spec)
    if totals.rows and totals.rows < job.total_steps and totals.scheduled_samples:
        # Only its first rows were read: the rest at their pace (seconds per scheduled sample).
        scale = _scheduled_samples(spec, job.total_steps) / totals.scheduled_samples
        totals = store_estimates.StepTotals(
            totals.rows, totals.scheduled_samples * scale, totals.samples * scale,
            totals.step_s * scale, totals.gen_s * scale)
    rows = None
    dataset = _section(_section(spec, "task"), "dataset")
    if dataset.get("id"):
        stored = get_dataset_unscoped(s, str(dataset["id"]))
        rows = stored.rows if stored is not None else None
    ev = _section(spec, "eval")
    evals = evaluation_count(job.total_steps, int(ev.get("every") or 0))
    eval_samples = evals * _eval_prompts(spec, rows) * int(ev.get("samples_per_prompt") or 16)
    wall = (job.finished_at - job.started_at).total_seconds() if job.finished_at and job.started_at else 0.0
    return PastJob(model=str(_section(spec, "model").get("path", "")),
                   budget_tokens=totals.scheduled_samples * budget, step_s=totals.step_s,
                   gen_tokens=totals.samples * budget, gen_s=totals.gen_s,
                   eval_tokens=eval_samples * budget, wall_s=wall)


# --------------------------------------------------------------------------- the estimate

def _throughput_public(rate: Throughput) -> ThroughputPublic:
    return ThroughputPublic(source="measured" if rate.jobs else "default", jobs=rate.jobs,
                            step_seconds_per_token=rate.step_s_per_token,
                            generation_seconds_per_token=rate.gen_s_per_token,
                            startup_seconds=round(rate.startup_s, 1))


def _derivation(rate: Throughput, model: str) -> str:
    how = ("startup + scheduled samples x max_new_tokens x a step's seconds per token + "
           "evaluation samples x max_new_tokens x generation's seconds per token")
    if rate.jobs:
        return f"{how}; rates measured on {rate.jobs} finished job(s) of {model} on this deployment"
    return (f"{how}; no measurements yet for {model} on this deployment: the default rates "
            "for its size (docs/api.md, Estimates), rough until a job of it has finished")


def estimate(spec: JobSpec, session: Session, settings: Settings,
             dataset: Dataset | None) -> JobEstimate:
    """The estimate of a spec that passed every submission check."""
    model = spec.model.path
    shape = read_model_shape(model)
    figures = work(spec, _eval_prompts(spec.model_dump(mode="json"), dataset.rows if dataset else None))
    past = [_past_job(session, job, totals) for job, totals in store_estimates.finished_jobs(session)]
    shapes = {m: read_model_shape(m) for m in {p.model for p in past} | {model}}
    defaults = {m: default_throughput(sh.params if sh else None) for m, sh in shapes.items()}
    rate = measured_throughput([p for p in past if p.model == model]) or defaults[model]
    parts = wall_seconds(figures, spec.rollout.max_new_tokens, rate)
    if shape is None:
        mem = MemoryEstimate(note=f"the size of {model} is unknown here (no config.json the API "
                             "can read, no size in its name): not checked")
    else:
        mem = MemoryEstimate(**memory(spec, shape, settings.worker_memory_gb), note=(
            "per trainer rank: weights + gradients and AdamW state (or the LoRA adapter's) + one "
            "micro-batch of activations; the rollout engine's KV cache is not counted"
            + ("" if settings.worker_memory_gb else "; BRORL_WORKER_MEMORY_GB is not set, so "
               "the fit is not checked")))
    gpus = spec.resources.gpus_per_node
    return JobEstimate(
        model=model, gpus=gpus, steps=figures["steps"],
        stages=[StageWork(**st) for st in figures["stages"]],
        evaluation=EvaluationWork(**figures["evaluation"]), samples=figures["samples"],
        response_tokens_max=figures["response_tokens_max"],
        wall_time=WallTime(seconds=parts["total"], parts=parts, derivation=_derivation(rate, model),
                           throughput=_throughput_public(rate),
                           past_accuracy=past_accuracy(past, defaults)),
        memory=mem, fits=mem.fits, multi_node=spec.resources.nodes > 1,
        queued_ahead=store_estimates.queued_on(session, store_estimates.queue_key(
            JobKind.train, {"resources": spec.resources.model_dump()})))


# --------------------------------------------------------------------------- queue and ETA

def queue_of(session: Session, job: Job) -> QueuePublic | None:
    place = store_estimates.queue_place(session, job)
    if place is None:
        return None
    return QueuePublic(position=place.position, gpus=place.gpus, multi_node=place.multi_node,
                       ahead=len(place.yours_ahead) + place.others_ahead,
                       yours_ahead=place.yours_ahead, others_ahead=place.others_ahead,
                       running=place.running)


def eta_seconds(session: Session, job: Job) -> float | None:
    """A running job's seconds left, from its own last steps: their seconds per budget token x
    the budget tokens of the steps left (stages differ in size) + the evaluations left x
    generation's seconds per token. None before its first step row."""
    if job.status != JobStatus.running:
        return None
    totals = store_estimates.recent_steps(session, job.id)
    spec = job.spec or {}
    budget = _budget(spec)
    if totals.scheduled_samples <= 0 or totals.step_s <= 0:
        return None
    step_rate = totals.step_s / (totals.scheduled_samples * budget)
    gen_rate = totals.gen_s / (totals.samples * budget) if totals.samples > 0 else step_rate / 3
    left = 0.0
    done = job.step
    start = 0
    for stage in _section(spec, "rollout").get("schedule") or []:
        steps, size = int(stage["steps"]), int(stage["n"]) * int(stage["prompts_per_step"])
        left += max(0, min(steps, start + steps - done)) * size
        start += steps
    dataset = _section(_section(spec, "task"), "dataset")
    rows = None
    if dataset.get("id"):
        stored = get_dataset_unscoped(session, str(dataset["id"]))
        rows = stored.rows if stored is not None else None
    evals = _eval_samples_after(spec, job.total_steps, done, _eval_prompts(spec, rows))
    return round(left * budget * step_rate + evals * budget * gen_rate, 1)


def progress_fields(session: Session, job: Job) -> dict[str, Any]:
    """What `GET /v1/jobs/{id}` adds to a job: its queue place and its ETA."""
    eta = eta_seconds(session, job)
    return {"queue": queue_of(session, job), "eta_seconds": eta,
            "eta_at": None if eta is None else datetime.now(UTC) + timedelta(seconds=eta)}
