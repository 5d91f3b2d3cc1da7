"""Celery's entry points: thin tasks over `worker.runner` (Celery's guide: logic outside the task).

Both tasks take ids, never objects, and are idempotent: `brorl.run_job` claims with a
compare-and-set, so a duplicate delivery does nothing; `brorl.reap` only touches jobs whose
lease has already expired. Neither retries through Celery: the lease and the reaper are the
retry mechanism, bounded by the job's `limits.max_attempts`.
"""
from __future__ import annotations

import logging
import os

from celery.signals import worker_init, worker_process_init, worker_shutting_down

from trainer.graders.sandbox.detect import layer_status
from worker import lease, runner
from store.settings import get_settings
from worker.celery_app import REAP_TASK, RUN_JOB_TASK, app, enqueue_job


# acks_late / reject_on_worker_lost repeat the app config on purpose: they are the reason a
# crash mid-job leaves the message to be redelivered, so they stay visible next to the task.
@app.task(name=RUN_JOB_TASK, acks_late=True, reject_on_worker_lost=True, ignore_result=True)
def run_job(job_id: str) -> str | None:
    # This process's app, bound to the broker it serves: a job a machine fault sent back
    # goes out again from here, to the queue of its GPU count.
    return runner.run_job(job_id, enqueue=enqueue_job)


@app.task(name=REAP_TASK, ignore_result=True)
def reap() -> list[str]:
    return runner.reap_and_requeue(enqueue_job)


@worker_shutting_down.connect
def _stop_running_job(**_: object) -> None:
    # Fires in the worker's main process: with the solo pool (`brorl up`) that is where the
    # job runs, so it stops at its next step. Prefork children keep going until Celery's
    # warm shutdown finishes them or the stop grace period kills them; either way the lease
    # and the reaper recover the job.
    lease.request_shutdown()


@worker_process_init.connect
def _allow_child_processes(**_: object) -> None:
    # A prefork child is a daemonic billiard process, and billiard installs it as
    # multiprocessing's current process too: every child a job starts (the task build's and
    # the graders' process pools, torchrun's ranks) would fail with "daemonic processes are
    # not allowed to have children", and a forkserver start with "Pickling an
    # AuthenticationString object is disallowed" (billiard's own key type, which
    # multiprocessing cannot send). The pool reaps this child either way; the job closes its
    # own children before it returns.
    import multiprocessing.process as mp_process

    config = mp_process.current_process()._config  # noqa: SLF001 - no public setter once started
    config["daemon"] = False
    config["authkey"] = mp_process.AuthenticationString(bytes(config["authkey"]))  # same key


@worker_init.connect
def _hub_offline_unless_allowed(**_: object) -> None:
    # The API only accepts hub ids with BRORL_ALLOW_HUB_MODELS; a worker that is not allowed
    # them never downloads, even for a spec that reached it another way.
    if not get_settings().allow_hub_models:
        os.environ["HF_HUB_OFFLINE"] = "1"


@worker_init.connect
def _log_rank_launcher(**_: object) -> str | None:
    # Many-GPU jobs start their ranks through this launcher (BRORL_LAUNCHER); a bad name is
    # said here, at start, as well as by each such job it fails.
    from trainer.distributed.launchers import configured_launcher

    try:
        name = configured_launcher().name
    except ValueError as exc:
        logging.getLogger(__name__).error("rank launcher: %s", exc)
        return None
    logging.getLogger(__name__).info("rank launcher: %s", name)
    return name


@worker_init.connect
def _log_sandbox_layer(**_: object) -> str:
    # Python and code graders run only inside this layer; with "none" a job that needs one
    # fails at its start with the reason (docs/graders.md, The sandbox). Probed once here so
    # the operator sees it before the first such job.
    status = layer_status()
    level = logging.INFO if status.layer in ("bubblewrap", "landlock") else logging.WARNING
    logging.getLogger(__name__).log(level, "grader sandbox layer: %s%s", status.layer,
                                    f" ({status.reason})" if status.reason else "")
    return status.layer
