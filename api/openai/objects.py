"""This service's rows as OpenAI's objects: `fine_tuning.job`, `fine_tuning.job.event`,
`fine_tuning.job.checkpoint` and `file`, with the fields the `openai` SDK's types declare
(openai/types/fine_tuning/*.py, file_object.py) and a few of this service's own beside them
(the SDK keeps unknown fields: `job.model_extra`).

Names: a checkpoint is `ft:<job id>:step-<N>`; a succeeded job's `fine_tuned_model` is its
last checkpoint's name. `GET /v1/fine_tuning/checkpoints/{name}/download` (api/openai/jobs.py)
downloads either, as the native `GET /v1/jobs/{id}/checkpoints/{step}/download` does.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any

from store.tables import Checkpoint, Dataset, EventType, Job, JobEvent, JobStatus
from trainer.graders.schemas import parse_grader

from api.openai.mapping import BASE_LR, BASE_N, request_field

CHECKPOINT_NAME = re.compile(r"^ft:(?P<job>[A-Za-z0-9_]{1,40}):step-(?P<step>[0-9]{1,9})$")
EVENT_PREFIX, CHECKPOINT_PREFIX = "ftevent-", "ftckpt-"


def ts(when: datetime | None) -> int | None:
    return None if when is None else int(when.timestamp())


def checkpoint_name(job_id: str, step: int) -> str:
    return f"ft:{job_id}:step-{step}"


def file_object(row: Dataset) -> dict[str, Any]:
    return {"id": row.id, "object": "file", "bytes": row.bytes, "created_at": ts(row.created_at),
            "filename": row.name, "purpose": "fine-tune", "status": "processed",
            "expires_at": None, "status_details": None, "rows": row.rows, "sha256": row.sha256}


def _native_hyperparameters(spec: dict[str, Any]) -> dict[str, Any]:
    """A native job's spec read back as OpenAI's hyperparameters (n_epochs unknown: the
    spec counts steps, not passes over a file)."""
    stage = ((spec.get("rollout") or {}).get("schedule") or [{}])[0]
    ev = spec.get("eval") or {}
    return {"batch_size": stage.get("prompts_per_step"), "n_epochs": None,
            "compute_multiplier": (stage.get("n") or BASE_N) / BASE_N,
            "learning_rate_multiplier": ((spec.get("optim") or {}).get("lr") or BASE_LR) / BASE_LR,
            "eval_interval": ev.get("every"), "eval_samples": ev.get("samples_per_prompt"),
            "reasoning_effort": "default"}


def _grader(grader: dict[str, Any] | None) -> dict[str, Any] | None:
    """The grader as /graders/validate returns it: defaults written out (a `name` where the
    user left it out), which OpenAI's SDK types require."""
    if grader is None:
        return None
    try:
        return parse_grader(grader).model_dump(mode="json", exclude_none=True)
    except ValueError:  # stored by an older version with other rules: show it as stored
        return grader


def job_object(job: Job, last_checkpoint: Checkpoint | None) -> dict[str, Any]:
    """A job row as `fine_tuning.job` (jobs made with the native API too: the same jobs)."""
    spec, meta = job.spec or {}, job.client_meta or {}
    task = spec.get("task") or {}
    hp = meta.get("hyperparameters") or _native_hyperparameters(spec)
    status = job.status.value
    error = None
    if job.status == JobStatus.failed:
        # A job error that blames a spec field starts with it ("task.grader.source: ...");
        # a job made here names the request field that set it.
        field = job.error.split(":", 1)[0] if job.error and ":" in job.error[:80] else None
        param = None
        if field and " " not in field:
            param = request_field(field, meta.get("brorl")) if meta.get("api") == "openai" \
                else field
        error = {"code": "job_failed", "message": job.error or "failed", "param": param}
    done = job.status == JobStatus.succeeded and last_checkpoint is not None
    return {
        "id": job.id, "object": "fine_tuning.job", "created_at": ts(job.created_at),
        "finished_at": ts(job.finished_at), "error": error,
        "fine_tuned_model": checkpoint_name(job.id, last_checkpoint.step) if done else None,
        "hyperparameters": {k: hp.get(k) for k in ("batch_size", "learning_rate_multiplier",
                                                   "n_epochs")},
        "model": (spec.get("model") or {}).get("path", ""),
        "organization_id": f"tenant-{job.tenant_id}",
        "result_files": [], "seed": spec.get("seed", 0), "status": status,
        "trained_tokens": None,
        "training_file": (task.get("dataset") or {}).get("id") or "",
        "validation_file": meta.get("validation_file"),
        "estimated_finish": None, "integrations": [],
        "metadata": meta.get("metadata") or None,
        "method": {"type": "reinforcement", "reinforcement": {
            "grader": _grader(task.get("grader")), "hyperparameters": hp}},
        # This service's own: progress, and the native view of the same job.
        "user_provided_suffix": meta.get("suffix"),
        "step": job.step, "total_steps": job.total_steps, "warning": job.warning,
        "brorl": {"schedule": (spec.get("rollout") or {}).get("schedule"),
                  "native_url": f"/v1/jobs/{job.id}"},
    }


def _progress_text(d: dict[str, Any]) -> str:
    """A long phase's progress (trainer.events): its name, done of total, the trainer's words."""
    phase = str(d.get("phase") or "sampling").replace("_", " ")
    if d.get("finished"):
        return f"Phase {phase} done" + (f" in {d['seconds']:.1f} s" if isinstance(d.get("seconds"), (int, float)) else "")
    count = f" ({d.get('done')}/{d['total']})" if d.get("total") else ""
    return f"Phase {phase}{count}" + (f": {d['message']}" if d.get("message") else "")


def _event_text(event: JobEvent) -> tuple[str, str]:
    """(level, message) of a native event, worded for people."""
    d, kind = event.data or {}, event.type
    texts = {
        EventType.created: f"Created fine-tuning job: {event.job_id}",
        EventType.started: f"Fine-tuning job started (attempt {d.get('attempt', 1)})",
        EventType.stage_started: f"Stage {d.get('index', 0)} started at step {d.get('step')}: "
                                 f"N={d.get('n')} rollouts per prompt, "
                                 f"{d.get('prompts_per_step')} prompts per step",
        EventType.checkpoint_saved: f"Checkpoint saved at step {d.get('step')}: "
                                    f"{checkpoint_name(event.job_id, d.get('step', 0))}",
        EventType.eval: f"Evaluation at step {d.get('step')}",
        EventType.retried: f"Job requeued after a fault ({d.get('reason', '')}); it resumes "
                           f"from its latest checkpoint",
        EventType.cancel_requested: "Cancellation requested",
        EventType.cancelled: "Fine-tuning job cancelled",
        EventType.failed: f"Fine-tuning job failed: {d.get('error', '')}",
        EventType.succeeded: "The job has successfully completed",
        EventType.warning: str(d.get("message", "warning")),
        EventType.broadened: f"Broadened at step {d.get('step')}: N={d.get('n')}",
        EventType.broaden_skipped: f"Broadening skipped at step {d.get('step')}",
        EventType.pause_requested: "Pause requested; the job stops and pauses",
        EventType.paused: "Fine-tuning job paused",
        EventType.resumed: "Fine-tuning job resumed",
        EventType.progress: _progress_text(d),
    }
    level = {EventType.failed: "error", EventType.warning: "warn",
             EventType.broaden_skipped: "warn"}.get(kind, "info")
    return level, texts.get(kind, kind.value)


def event_object(event: JobEvent) -> dict[str, Any]:
    level, message = _event_text(event)
    return {"id": f"{EVENT_PREFIX}{event.id}", "object": "fine_tuning.job.event",
            "created_at": ts(event.created_at), "level": level, "message": message,
            "data": {"type": event.type.value, **(event.data or {})}, "type": "message"}


def checkpoint_object(ckpt: Checkpoint, metrics: dict[str, Any] | None) -> dict[str, Any]:
    m = metrics or {}
    return {
        "id": f"{CHECKPOINT_PREFIX}{ckpt.job_id}-{ckpt.step}",
        "object": "fine_tuning.job.checkpoint", "created_at": ts(ckpt.created_at),
        "fine_tuned_model_checkpoint": checkpoint_name(ckpt.job_id, ckpt.step),
        "fine_tuning_job_id": ckpt.job_id, "step_number": ckpt.step,
        # OpenAI's metric names where one means the same; this service's beside them.
        "metrics": {"step": float(ckpt.step), "train_loss": m.get("loss"),
                    **{k: v for k, v in m.items() if k in (
                        "reward_mean", "pass_rate", "kl", "entropy") or k.startswith("eval/")}},
        "bytes": ckpt.bytes, "sha256": ckpt.sha256,
        "download_url": f"/v1/jobs/{ckpt.job_id}/checkpoints/{ckpt.step}/download",
    }


def cursor_int(value: str | None, prefix: str) -> int | None:
    """An `after` cursor (`ftevent-12` or `12`) as the number it wraps; None when absent."""
    if value is None:
        return None
    raw = value.removeprefix(prefix).rsplit("-", 1)[-1]
    # At most 18 digits: a larger number overflows the database's 64-bit columns (a 500).
    return int(raw) if raw.isdigit() and len(raw) <= 18 else None
