"""Submitting work: the one sequence every job row goes through, a training job (native
route and OpenAI's) and a probe alike, and the lookups of the caller's rows.

1. the model path is one this deployment may load (store.model_paths);
2. a reasoning-gym config builds a few examples within limits (api.task_check); a multi-turn
   environment (`task.env`) is one this deployment runs: a verifiers id listed in
   BRORL_ENVIRONMENTS, an OpenEnv server listed in BRORL_OPENENV_SERVERS (never a URL), tools
   that parse (never run here);
3. the GPU count is one the workers serve (each count has its own queue);
4. a dataset named by the task is the caller's;
5. the reward can run here (a grader's judge or metric exists; the dataset's rows have the
   fields the grader or verifier reads);
6. the tenant's job quota, counted before the insert but raised only for a new row, so a
   replay of an Idempotency-Key still answers;
7. insert (idempotent), COMMIT;
8. only then enqueue by id on the queue of its GPU count. A worker that got the message before
   the commit would find no row; a broker that is down leaves the row queued (the database is
   the truth) and the worker's requeue of stale queued jobs sends it later.
"""
from __future__ import annotations

import logging
from typing import Annotated, Any, Callable

from fastapi import Header, Request
from sqlalchemy.orm import Session

from store import datasets, job_pause, jobs, probes
from store.errors import NotFound
from store.model_paths import model_path_problem
from store.settings import Settings
from store.tables import Dataset, Job, JobKind, JobStatus
from trainer.graders.judges import JudgeError, get_judge
from trainer.graders.schemas import (
    LabelModelGrader, MultiGrader, ScoreModelGrader, TextSimilarityGrader, parse_grader)
from trainer.graders.similarity import UnsupportedMetric, check_metric
from trainer.probe_spec import ProbeSpec
from trainer.spec import FieldError, JobSpec, ModelSpec, TaskSpec

from api import continuation
from api.deps import Enqueue
from api.errors import ApiError, field_error
from api.quotas import job_quota_error

log = logging.getLogger(__name__)

IdempotencyKey = Annotated[
    str | None,
    Header(alias="Idempotency-Key", max_length=200,
           description="Retry-safe creation: the same key and body return the same row."),
]


# ------------------------------------------------------------------ the caller's rows

def job_or_404(session: Session, tenant_id: int, job_id: str) -> Job:
    """The caller's training job; another tenant's job is as unknown as a made-up id."""
    job = jobs.get_job(session, tenant_id, job_id)
    if job is None:
        raise NotFound(f"job {job_id} not found")
    return job


def probe_or_404(session: Session, tenant_id: int, probe_id: str) -> Job:
    """The caller's probe (a training job's id is a 404 here, as a probe's is under /v1/jobs)."""
    row = jobs.get_job(session, tenant_id, probe_id, JobKind.probe)
    if row is None:
        raise NotFound(f"probe {probe_id} not found")
    return row


# ------------------------------------------------------------------ the checks (1-6)

def check_model_path(path: str, settings: Settings) -> None:
    if (problem := model_path_problem(path, settings)) is not None:
        raise field_error("model.path", problem)  # the worker checks the same rule again


def check_gpus(gpus: int, settings: Settings) -> None:
    if gpus not in settings.gpu_counts:
        # Each GPU count has its own queue; a count no worker serves would wait there for ever.
        served = ", ".join(map(str, settings.gpu_counts))
        raise field_error("resources.gpus_per_node", f"{gpus} GPUs asked; this deployment's "
                          f"workers serve {served} (BRORL_GPU_COUNTS)")


def check_nodes(nodes: int, gpus: int, settings: Settings) -> None:
    """More than one node only where the deployment's Ray cluster serves that shape: a job it
    cannot place would wait for ever."""
    if nodes == 1:
        return
    if not settings.ray_address or settings.ray_max_nodes < 2:
        raise field_error("resources.nodes", f"{nodes} nodes asked; this deployment runs each job on one node "
                          "(multi-node jobs need BRORL_RAY_ADDRESS and BRORL_RAY_MAX_NODES)")
    if nodes > settings.ray_max_nodes:
        raise field_error("resources.nodes", f"{nodes} nodes asked; this deployment's Ray cluster serves "
                          f"at most {settings.ray_max_nodes} (BRORL_RAY_MAX_NODES)")
    if settings.ray_gpus_per_node and gpus > settings.ray_gpus_per_node:
        raise field_error("resources.gpus_per_node", f"{gpus} GPUs per node asked; this deployment's Ray "
                          f"nodes have {settings.ray_gpus_per_node} (BRORL_RAY_GPUS_PER_NODE)")


def check_env(task: TaskSpec | None) -> None:
    """422 naming the field when `task.env` names what this deployment does not run: a
    verifiers id not listed in BRORL_ENVIRONMENTS, an OpenEnv server not listed in
    BRORL_OPENENV_SERVERS, arguments the environment does not take, tools that do not parse.
    Nothing is loaded or contacted here (the worker loads the environment). A deployment whose
    own setting is malformed answers 503 (the operator's to fix, not the tenant's)."""
    if task is None or task.env is None:
        return
    from trainer.rollouts.environments import check_environment
    from trainer.settings import trainer_settings

    try:
        settings = trainer_settings()
        check_environment(task.env, settings)
    except ValueError as exc:
        message = str(exc)
        field, sep, rest = message.partition(": ")
        if sep and field.startswith("task.env"):
            raise field_error(field, rest) from None
        log.error("task.env cannot be checked: the deployment's settings are malformed: %s", message)
        raise ApiError(503, "this deployment's multi-turn environment settings are malformed; "
                       "tell its operator", type_="unavailable") from None


def owned_dataset(session: Session, tenant_id: int, task: TaskSpec | None) -> Dataset | None:
    """The caller's dataset that `task` reads (None when it reads none); 422 when it is not theirs."""
    if task is None or task.dataset is None:
        return None
    stored = datasets.get_dataset(session, tenant_id, task.dataset.id)
    if stored is None:
        raise field_error("task.dataset.id", f"no dataset {task.dataset.id!r} (upload it first)")
    return stored


def check_runnable(grader: Any, path: str = "grader") -> None:
    """422 for what validates but cannot run here: a metric or a judge this server lacks."""
    if isinstance(grader, (ScoreModelGrader, LabelModelGrader)):
        try:
            get_judge(grader.model)
        except JudgeError as exc:
            raise field_error(f"{path}.model", str(exc)) from None
    if isinstance(grader, TextSimilarityGrader):
        try:
            check_metric(grader.evaluation_metric)
        except UnsupportedMetric as exc:
            raise field_error(f"{path}.evaluation_metric", str(exc)) from None
    if isinstance(grader, MultiGrader):
        for key, sub in grader.graders.items():
            check_runnable(sub, f"{path}.graders.{key}")


def check_reward(task: TaskSpec, stored: Dataset | None, settings: Settings) -> None:
    """422 when the reward cannot run: a grader this server cannot run (a metric or a judge
    it lacks), or a dataset whose rows lack a field the grader or verifier reads."""
    from trainer.graders.dataset_check import check_rows_for

    if task.grader is not None:
        check_runnable(parse_grader(task.grader), "task.grader")
    if stored is None:
        return
    try:
        with open(stored.uri, "rb") as fh:
            check_rows_for(fh, task, settings.max_dataset_line_bytes)
    except FieldError as exc:
        raise field_error(exc.path, exc.message) from None
    except (OSError, ValueError) as exc:  # the stored file went missing or no longer parses
        raise field_error("task.dataset.id", f"dataset {stored.id} cannot be read: {exc}") from None


# ------------------------------------------------------------------ insert, commit, enqueue (6-8)

def _insert_then_enqueue(session: Session, insert: Callable[[], tuple[Job, bool]],
                         over_quota: ApiError | None, enqueue: Enqueue, gpus: int,
                         nodes: int = 1) -> tuple[Job, bool]:
    row, created = insert()
    if created and over_quota is not None:  # a replay of an existing row still answers
        session.rollback()
        raise over_quota
    session.commit()
    if created:
        try:
            enqueue(row.id, gpus=gpus, nodes=nodes)
        except Exception:  # committed: it stays queued, and the requeue of stale jobs sends it
            what = "probe" if row.kind == JobKind.probe else "job"
            log.exception("%s %s created but could not be enqueued; it stays queued", what, row.id)
    return row, created


def check_job(spec: JobSpec, session: Session, settings: Settings, tenant_id: int,
              request: Request) -> tuple[ApiError | None, Dataset | None]:
    """Checks 1-6 of a training job: raises what fails; returns the quota error a new row
    would get (None within quota) and the dataset the task reads. A dry run
    (`POST /v1/jobs?dry_run=true`) runs exactly these and stops."""
    check_model_path(spec.model.path, settings)
    request.app.state.task_check.check(spec)
    check_env(spec.task)
    check_gpus(spec.resources.gpus_per_node, settings)
    check_nodes(spec.resources.nodes, spec.resources.gpus_per_node, settings)
    over_quota = job_quota_error(session, settings, tenant_id)
    stored = owned_dataset(session, tenant_id, spec.task)
    check_reward(spec.task, stored, settings)
    return over_quota, stored


def submit_job(spec: JobSpec, session: Session, settings: Settings, tenant_id: int,
               enqueue: Enqueue, request: Request, idempotency_key: str | None = None,
               client_meta: dict[str, Any] | None = None) -> tuple[Job, bool]:
    """A training job through 1-8; returns (job, created). The native route and the
    OpenAI-shaped one (api/openai/jobs.py) both call this. `client_meta` is stored beside the
    spec (store.jobs). A `continue_from` is resolved first (api.continuation: the caller's
    checkpoint, its step fixed, the parent's model), so every check sees the job as it runs."""
    spec, parent_id = continuation.resolve(session, tenant_id, spec)
    over_quota, _ = check_job(spec, session, settings, tenant_id, request)
    return _insert_then_enqueue(session, lambda: jobs.create_job(
        session, tenant_id, spec.model_dump(mode="json"), total_steps=spec.total_steps,
        name=spec.name, idempotency_key=idempotency_key, client_meta=client_meta,
        parent_job_id=parent_id), over_quota, enqueue, spec.resources.gpus_per_node, spec.resources.nodes)


def submit_probe(spec: ProbeSpec, session: Session, settings: Settings, tenant_id: int,
                 enqueue: Enqueue, idempotency_key: str | None = None) -> tuple[Job, bool]:
    """A probe through the same steps. Its model is a path or the caller's checkpoint (resolved
    by store.probes, a 422 naming `model.job` / `model.step` otherwise); it runs on one GPU."""
    if isinstance(spec.model, ModelSpec):
        check_model_path(spec.model.path, settings)
    check_env(spec.task)
    over_quota = job_quota_error(session, settings, tenant_id)
    stored = owned_dataset(session, tenant_id, spec.task)
    if spec.task is not None:
        check_reward(spec.task, stored, settings)

    def insert() -> tuple[Job, bool]:
        try:
            return probes.create_probe(session, tenant_id, spec, idempotency_key)
        except FieldError as exc:
            raise field_error(exc.path, exc.message) from None

    return _insert_then_enqueue(session, insert, over_quota, enqueue, 1)


def resume_job(session: Session, settings: Settings, tenant_id: int, job_id: str,
               enqueue: Enqueue) -> Job:
    """paused -> queued, committed, then enqueued (store.job_pause); a resumed job needs a
    free job slot like a new one (a paused job does not hold one)."""
    job = job_or_404(session, tenant_id, job_id)
    if job.status == JobStatus.paused and (over := job_quota_error(session, settings, tenant_id)):
        raise over
    job = job_pause.resume(session, tenant_id, job_id)
    session.commit()
    if job.status == JobStatus.queued:
        try:
            enqueue(job.id, gpus=jobs.spec_gpus(job.spec), nodes=jobs.spec_nodes(job.spec))
        except Exception:  # it stays queued; requeue recovers it
            log.exception("job %s resumed but could not be enqueued; it stays queued", job.id)
    return job
