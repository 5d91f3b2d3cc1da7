"""The Celery app: configuration from the settings, task routing and `enqueue_job`.

One queue per GPU count (`queue_for`): a job asking for G GPUs goes to queue `gpu-G` (`gpu`
for one), and only a worker that holds G GPUs serves that queue, so a job never lands on a
machine too small for it and a 1-GPU worker is never blocked by a message it cannot run.
A multi-node job (resources.nodes > 1) goes to queue `ray` whatever its G: its ranks run on
the Ray cluster's nodes, so the worker that claims it only drives it (lease, relay, cancel)
and needs no GPU, and while it waits for Ray to place its nodes it must not hold a GPU worker
that a one-node job behind it could use. `ray` driver workers serve it (`brorl up` starts one
where BRORL_RAY_ADDRESS is set; compose's `ray-driver`).

The API imports this module to enqueue by task name, so it must stay light: no torch, no
trainer internals, and not even `worker.entrypoints` (the worker imports that through
`include`).
The database is the truth about a job; a Celery message is only a trigger that says "look at
job X". That is why results are ignored, retries are not Celery's business, and a duplicate
delivery is harmless (the runner's claim is a compare-and-set that refuses it).

Visibility timeout vs lease (read this before changing either number):
- The lease (`lease_seconds`, renewed every `heartbeat_seconds`) is how a dead worker is
  noticed: the reaper requeues a running job whose lease expired, up to `limits.max_attempts`.
- The broker visibility timeout (Redis only) is how long an unacknowledged message stays
  invisible before Redis hands it to another worker. With `task_acks_late` a training
  message stays unacknowledged for the whole run, so for jobs longer than the timeout Redis
  *will* redeliver it while the job is healthy. That copy is harmless (the claim refuses a
  job that is not queued), but it is noise, so the timeout is set far above the lease
  (default 2 h vs 120 s). Redelivery is never the recovery path: the lease + reaper is.
- The SQLite broker (kombu's SQLAlchemy transport) has no visibility timeout, and its
  transport options are passed to `create_engine`, where an unknown key raises TypeError;
  so the option is only set for Redis.
"""
from __future__ import annotations

from typing import Any, Protocol

from celery import Celery

from store.settings import Settings, get_settings

RUN_JOB_TASK = "brorl.run_job"
REAP_TASK = "brorl.reap"
GPU_QUEUE = "gpu"
RAY_QUEUE = "ray"  # multi-node jobs, driven by workers that need no GPU (docs/many-gpus.md)
# The reaper runs on its own queue so that a CPU-only process (compose's `reaper` service)
# can serve it while every GPU worker is busy with a long training task.
MAINTENANCE_QUEUE = "maintenance"


class Enqueue(Protocol):
    """Sends "run job X" to the queue of its shape, `gpus` per node on `nodes` nodes (call after
    the job row is committed)."""

    def __call__(self, job_id: str, gpus: int = 1, nodes: int = 1) -> None: ...


def queue_for(gpus: int, nodes: int = 1) -> str:
    """The queue of jobs asking for `gpus` GPUs on each of `nodes` nodes: `ray` for more than one
    node; else `gpu` for one GPU (the queue's name before jobs could ask for more, so existing
    workers keep serving it), `gpu-<G>` otherwise."""
    if gpus < 1:
        raise ValueError(f"a job needs at least 1 GPU, got {gpus}")
    if nodes < 1:
        raise ValueError(f"a job needs at least 1 node, got {nodes}")
    if nodes > 1:
        return RAY_QUEUE
    return GPU_QUEUE if gpus == 1 else f"{GPU_QUEUE}-{gpus}"


def _is_redis(url: str) -> bool:
    return url.startswith(("redis://", "rediss://", "redis+socket://"))


def celery_config(settings: Settings) -> dict[str, Any]:
    """The whole Celery configuration, derived from the service settings."""
    interval = float(settings.reaper_interval_seconds)
    conf: dict[str, Any] = {
        "broker_url": settings.broker_url,
        "broker_connection_retry_on_startup": True,
        # The database holds every result; a result backend would be a second truth.
        "result_backend": None,
        "task_ignore_result": True,
        # Ack after the task returns, and requeue if the worker process dies mid-task; the
        # claim CAS makes the redelivered copy a no-op when the job is already running.
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        # One training job per worker process at a time; do not hoard messages that another
        # idle GPU worker could take.
        "worker_prefetch_multiplier": 1,
        "task_serializer": "json",
        "accept_content": ["json"],
        "task_default_queue": GPU_QUEUE,
        "task_routes": {
            # Only a default: `send_job` names the queue of the job's GPU count, which wins.
            RUN_JOB_TASK: {"queue": GPU_QUEUE},
            REAP_TASK: {"queue": MAINTENANCE_QUEUE},
        },
        "beat_schedule": {
            "reap-expired-leases": {
                "task": REAP_TASK,
                "schedule": interval,
                # A reap stuck behind a long job in a busy queue is stale by the next tick.
                "options": {"queue": MAINTENANCE_QUEUE, "expires": max(interval, 1.0)},
            },
        },
        "beat_schedule_filename": str(settings.data_dir / "celerybeat-schedule"),
        "worker_hijack_root_logger": False,
        "enable_utc": True,
    }
    if _is_redis(settings.broker_url):
        conf["broker_transport_options"] = {
            "visibility_timeout": settings.broker_visibility_timeout,
        }
    return conf


def make_app(settings: Settings | None = None) -> Celery:
    """A Celery app bound to `settings` (the process-wide ones when omitted, read lazily)."""
    celery = Celery("brorl", include=["worker.entrypoints"], set_as_current=settings is None)
    if settings is None:
        # Lazy: the settings are read when Celery first needs its config, so importing this
        # module (the API does) neither creates the data dir nor freezes the environment.
        celery.add_defaults(lambda: celery_config(get_settings()))
    else:
        celery.conf.update(celery_config(settings))
    return celery


# `celery -A worker.celery_app worker` finds this attribute.
app = make_app()


def send_job(celery: Celery, job_id: str, gpus: int = 1, nodes: int = 1) -> None:
    """Send "run job `job_id`" through `celery` to the queue of its shape (`queue_for`)."""
    celery.send_task(RUN_JOB_TASK, args=[job_id], queue=queue_for(gpus, nodes))


def enqueue_job(job_id: str, gpus: int = 1, nodes: int = 1) -> None:
    """Ask a worker with `gpus` GPUs (a Ray driver worker for `nodes` > 1) to run job `job_id`
    (call after the job row is committed)."""
    send_job(app, job_id, gpus, nodes)
