"""Running a claimed probe: resolve it, probe under the lease, record the result.

`worker.runner.run_job` claims every job row the same way and hands rows of kind `probe` here,
so a probe is leased, heartbeated, fenced, cancelled and reaped exactly as a training job
(one definition of each, in store.jobs and worker.lease). What differs: the work is
`trainer.probe.probe`, progress is a `progress` event after each generation chunk (samples
done of n x prompts, in `step` / `total_steps`), and success writes the result and the
`succeeded` status in one transaction, fenced, so a probe retried after a dead worker ends
with exactly one result: that of the attempt that finished.
"""
from __future__ import annotations

import logging
from typing import Any, Callable

from sqlalchemy.exc import OperationalError

from store import jobs, probes
from store.errors import Fenced
from store.model_paths import model_path_problem
from trainer.probe_spec import ProbeSpec
from trainer.spec import ModelSpec
from worker.celery_app import Enqueue
from worker.lease import Lease
from worker.messages import user_message

log = logging.getLogger(__name__)


def run_probe(lease: Lease, enqueue: Enqueue) -> str | None:
    """Run the claimed probe to its outcome; returns the status written (None: not ours)."""
    try:
        spec = ProbeSpec.model_validate(lease.claim.spec)
        with lease.session() as s:
            resolved = probes.resolve(s, lease.claim.tenant_id, spec)
    except Exception as exc:  # noqa: BLE001 - a stored probe that no longer resolves
        return lease.finish("failed", f"invalid probe: {user_message(exc)}")
    if isinstance(spec.model, ModelSpec) and (problem := model_path_problem(spec.model.path, lease.settings)):
        return lease.finish("failed", f"model.path: {problem}")
    with lease.held(spec.limits.max_wall_seconds):
        return _probe_and_record(lease, resolved, enqueue)


def _progress(lease: Lease) -> Callable[[dict[str, Any]], None]:
    state = lease.state

    def report(p: dict[str, Any]) -> None:
        try:
            with lease.session() as s:
                if jobs.record_progress(s, lease.job_id, lease.attempt, p["samples_done"],
                                        p["samples_total"]):
                    state.cancel_requested = True
        except Fenced:
            state.fenced = True
        except OperationalError:  # progress is not worth stopping for; the lease decides
            log.warning("probe %s: progress not recorded (database unreachable)", lease.job_id)
    return report


def _probe_and_record(lease: Lease, resolved: probes.Resolved, enqueue: Enqueue) -> str | None:
    from trainer.probe import probe  # torch and the engines: only in a worker that probes
    from trainer.stop import StopRequested

    try:
        result = probe(resolved.probe, resolved.base, lease.state.should_stop,
                       model_dir=resolved.model_dir, dataset_path=lease.dataset_path(resolved.base),
                       on_progress=_progress(lease), name=f"{lease.job_id}-attempt-{lease.attempt}")
    except Fenced:
        lease.state.fenced = True
        return None
    except StopRequested:
        result = None
    except Exception as exc:  # noqa: BLE001 - a probe's error fails the probe, not the worker
        return lease.fail(exc, resolved.base.resources.gpus_per_node, enqueue)

    return lease.settle_with_result(result, "probe")
