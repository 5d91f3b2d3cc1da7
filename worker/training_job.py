"""Running a claimed training job: rebuild the spec, train under the lease, record the outcome.

`worker.runner.run_job` claims the row and hands a job of kind `train` here (the lease, its
heartbeat and the outcomes are `worker.lease`'s). What a training job adds:

- the stored spec is validated again, and `model.path` checked against `BRORL_MODEL_ROOTS`
  again: a spec stored before the operator narrowed the roots (or written around the API)
  must not load an arbitrary path;
- `train(spec, DbSink, should_stop, resume=..., out_dir=..., dataset_path=...)`, where
  `out_dir` is this attempt's own folder (`jobs/<id>/attempt-<n>`: attempts never share
  files), `resume` the job's latest recorded checkpoint, and files earlier attempts left
  without a row are deleted first;
- the sink writes the rows it buffered during a database outage before the outcome is.
"""
from __future__ import annotations

import importlib
import logging
import shutil
from pathlib import Path
from typing import Any, Callable

from store import artifacts, jobs
from store.errors import Fenced
from store.model_paths import model_path_problem
from store.tables import Checkpoint
from trainer.checkpoints import format as ckpt_format
from trainer.checkpoints.format import StartFrom
from trainer.spec import JobSpec
from worker.celery_app import Enqueue
from worker.lease import Lease
from worker.messages import user_message
from worker.sink import DatabaseUnavailable, DbSink, SinkBufferFull

log = logging.getLogger(__name__)


def resolve_entrypoint(dotted: str) -> Callable[..., Any]:
    """`"package.module:function"` -> the function (the trainer, or a test double)."""
    module_name, _, attr = dotted.partition(":")
    if not module_name or not attr:
        raise ValueError(f"trainer entrypoint {dotted!r} is not 'module:function'")
    return getattr(importlib.import_module(module_name), attr)


def run_training(lease: Lease, enqueue: Enqueue) -> str | None:
    """Train the claimed job to its outcome; returns the status written (None: not ours)."""
    try:
        spec = JobSpec.model_validate(lease.claim.spec)
    except Exception as exc:  # noqa: BLE001 - a stored spec that no longer validates
        lease.finish("failed", f"invalid spec: {user_message(exc)}")
        return "failed"
    problem = model_path_problem(spec.model.path, lease.settings)
    if problem is not None:
        lease.finish("failed", f"model.path: {problem}")
        return "failed"
    with lease.held(spec.limits.max_wall_seconds):
        return _train_and_record(lease, spec, enqueue)


def _train_and_record(lease: Lease, spec: JobSpec, enqueue: Enqueue) -> str | None:
    settings, state = lease.settings, lease.state

    def on_fenced() -> None:
        state.fenced = True

    sink = DbSink(lease.job_id, lease.attempt, on_fenced=on_fenced,
                  keep_last=spec.checkpoint.keep_last, retry_seconds=settings.lease_seconds,
                  buffer_rows=settings.sink_buffer_rows,
                  max_sample_bytes=settings.max_sample_bytes_per_job,
                  database_url=settings.database_url)
    try:
        # Per attempt: a stale attempt can neither overwrite nor prune its successor's files.
        out_dir = artifacts.attempt_dir(settings, lease.job_id, lease.attempt)
        out_dir.mkdir(parents=True, exist_ok=True)
        _sweep_earlier_attempts(lease)
        train = resolve_entrypoint(settings.trainer_entrypoint)
        start = _start_from(lease, spec)  # only a continuation passes it (test doubles lack it)
        result = train(spec, sink, state.should_stop, resume=_resume_dir(lease),
                       out_dir=out_dir, dataset_path=lease.dataset_path(spec),
                       **({"start_from": start} if start is not None else {}))
        sink.flush()  # rows buffered during a database outage land before the outcome
    except Fenced:
        state.fenced = True
        return None
    except Exception as exc:  # noqa: BLE001 - any trainer error fails the job, not the worker
        if state.fenced:
            return None
        if not isinstance(exc, (SinkBufferFull, DatabaseUnavailable)):
            try:
                sink.flush()  # the steps before the error still count
            except Fenced:
                return None
            except DatabaseUnavailable:
                log.error("job %s: its last metric rows were not written", lease.job_id)
        return lease.fail(exc, spec.resources.gpus_per_node, enqueue, spec.resources.nodes)
    finished_all = getattr(result, "stopped", True) is False
    return lease.settle(lambda: lease.finish("succeeded"), pausable=not finished_all)


def _resume_dir(lease: Lease) -> Path | None:
    """The folder of this job's latest recorded checkpoint, if it still exists on disk."""
    with lease.session() as s:
        ckpt = jobs.latest_checkpoint(s, lease.job_id)
        uri = getattr(ckpt, "uri", None) if ckpt is not None else None
    if not uri:
        return None
    path = Path(uri)  # a checkpoint's uri is its folder
    return path if path.exists() else None


def _start_from(lease: Lease, spec: JobSpec) -> StartFrom | None:
    """A continued job's parent checkpoint (spec.continue_from, its step fixed at submission),
    checked again to belong to the job's tenant; ValueError naming it when it is gone."""
    ref = spec.continue_from
    if ref is None:
        return None
    with lease.session() as s:
        ckpt = jobs.get_checkpoint(s, lease.claim.tenant_id, ref.job, ref.step) if ref.step is not None else None
        uri = ckpt.uri if ckpt is not None else None
    if not uri or not Path(uri).is_dir():
        raise ValueError(f"continue_from: the checkpoint at step {ref.step} of job {ref.job} is gone "
                         "(checkpoint.keep_last rotates old ones out)")
    return StartFrom(Path(uri), ref.optimizer)


def _sweep_earlier_attempts(lease: Lease) -> None:
    """Delete what earlier attempts left on disk without a row: temp folders and unrecorded
    checkpoints of a worker that crashed mid-save. Those attempts are fenced for good (only
    this one may write), so nothing they left can still become a recorded checkpoint."""
    with lease.session() as s:
        recorded = {Path(c.uri) for c in s.query(Checkpoint).filter_by(job_id=lease.job_id)}
    for n in range(1, lease.attempt):
        root = artifacts.attempt_dir(lease.settings, lease.job_id, n) / "checkpoints"
        for path in root.glob("*") if root.is_dir() else []:
            if path.name.startswith(".tmp-"):
                shutil.rmtree(path, ignore_errors=True)
            elif path.is_dir() and path.resolve() not in recorded and path not in recorded:
                ckpt_format.remove(path)
