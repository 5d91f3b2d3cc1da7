"""Running a claimed evaluation: find its folders, evaluate under the lease, record the result.

`worker.runner.run_job` claims every job row the same way and hands rows of kind `evaluation`
here, so an evaluation is leased, heartbeated, fenced, cancelled and reaped exactly as a
training job or a probe. What differs: the work is `trainer.evaluation.evaluate_models` over
the base and the checkpoints the stored spec names (their folders looked up again now, for the
job's tenant: one rotated out since submission fails the evaluation with that reason),
progress is a `progress` event after each generation chunk (samples done of all models, and
which model), and success writes the result and `succeeded` in one fenced transaction.
"""
from __future__ import annotations

import logging
from typing import Any, Callable

from sqlalchemy.exc import OperationalError

from store import evaluations, jobs
from store.errors import Fenced
from store.model_paths import model_path_problem
from trainer.evaluation_spec import EvaluationSpec, sampling_job_spec
from worker.celery_app import Enqueue
from worker.lease import Lease
from worker.messages import user_message

log = logging.getLogger(__name__)


def run_evaluation(lease: Lease, enqueue: Enqueue) -> str | None:
    """Run the claimed evaluation to its outcome; returns the status written (None: not ours)."""
    from trainer.evaluation import Model

    try:
        spec = EvaluationSpec.model_validate(lease.claim.spec)
        with lease.session() as s:
            job_spec, found = evaluations.folders(s, lease.claim.tenant_id, spec)
        sampling = sampling_job_spec(spec, job_spec)
    except Exception as exc:  # noqa: BLE001 - a stored evaluation that no longer resolves
        return lease.finish("failed", f"invalid evaluation: {user_message(exc)}")
    if spec.base and found.base is None and (problem := model_path_problem(job_spec.model.path, lease.settings)):
        return lease.finish("failed", f"model.path: {problem}")
    models = ([Model("base", None, found.base)] if spec.base else []) + [
        Model(f"step {step}", step, folder) for step, folder in found.steps.items()]
    with lease.held(spec.limits.max_wall_seconds):
        return _evaluate_and_record(lease, spec, sampling, models, enqueue)


def _progress(lease: Lease) -> Callable[[dict[str, Any]], None]:
    state = lease.state

    def report(p: dict[str, Any]) -> None:
        try:
            with lease.session() as s:
                if jobs.record_progress(s, lease.job_id, lease.attempt, p["samples_done"],
                                        p["samples_total"], {"model": p["model"]}):
                    state.cancel_requested = True
        except Fenced:
            state.fenced = True
        except OperationalError:  # progress is not worth stopping for; the lease decides
            log.warning("evaluation %s: progress not recorded (database unreachable)", lease.job_id)
    return report


def _evaluate_and_record(lease: Lease, spec: EvaluationSpec, sampling: Any, models: list,
                         enqueue: Enqueue) -> str | None:
    from trainer.evaluation import evaluate_models  # torch and the engines: only in a worker that evaluates
    from trainer.stop import StopRequested

    try:
        result = evaluate_models(spec, sampling, models, lease.state.should_stop,
                                 dataset_path=lease.dataset_path(sampling), on_progress=_progress(lease),
                                 name=f"{lease.job_id}-attempt-{lease.attempt}")
    except Fenced:
        lease.state.fenced = True
        return None
    except StopRequested:
        result = None
    except Exception as exc:  # noqa: BLE001 - an evaluation's error fails it, not the worker
        return lease.fail(exc, 1, enqueue)

    return lease.settle_with_result(result, "evaluation")
