"""Where files live under the artifact dir, and how they are written safely.

Layout (the database stores absolute paths, so moving the dir means a migration of uris):
    {artifact_dir}/jobs/{job_id}/attempt-{n}/...  what attempt n of a job writes (checkpoints)
    {artifact_dir}/datasets/{dataset_id}.jsonl    uploaded datasets
Each attempt writes only into its own folder: a worker that lost its lease (fenced) and has
not noticed yet can never overwrite or prune the files of the attempt that took the job over.
The checkpoint folder's name, manifest and archive are defined in `trainer.checkpoints.format`.
"""

from __future__ import annotations

from pathlib import Path

from store.settings import Settings
from trainer.checkpoints import format as ckpt_format



def job_dir(settings: Settings, job_id: str) -> Path:
    return settings.artifact_dir / "jobs" / job_id


def attempt_dir(settings: Settings, job_id: str, attempt: int) -> Path:
    """The trainer's `out_dir` for one attempt of a job."""
    return job_dir(settings, job_id) / f"attempt-{attempt}"


def checkpoint_dir(settings: Settings, job_id: str, attempt: int, step: int) -> Path:
    """Where attempt `attempt` writes the checkpoint of `step` (see trainer.checkpoints.io)."""
    return attempt_dir(settings, job_id, attempt) / "checkpoints" / ckpt_format.folder_name(step)


def dataset_path(settings: Settings, dataset_id: str) -> Path:
    return settings.artifact_dir / "datasets" / f"{dataset_id}.jsonl"


