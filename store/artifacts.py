"""Where files live under the artifact dir, and how they are written safely.

Layout (the database stores absolute paths, so moving the dir means a migration of uris):
    {artifact_dir}/jobs/{job_id}/...            checkpoints and anything else a job writes
    {artifact_dir}/datasets/{dataset_id}.jsonl  uploaded datasets
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path

from store.settings import Settings

_CHUNK = 1024 * 1024


def job_dir(settings: Settings, job_id: str) -> Path:
    return settings.artifact_dir / "jobs" / job_id


def checkpoint_dir(settings: Settings, job_id: str, step: int) -> Path:
    """The folder for one checkpoint; zero-padded so a listing sorts by step."""
    return job_dir(settings, job_id) / "checkpoints" / f"step_{step:08d}"


def dataset_path(settings: Settings, dataset_id: str) -> Path:
    return settings.artifact_dir / "datasets" / f"{dataset_id}.jsonl"


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, chunks: Iterable[bytes]) -> tuple[int, str]:
    """Write `chunks` to `path` all-or-nothing; returns (bytes written, sha256 hex).

    The data goes to a temporary file in the same folder, is fsynced, then renamed over
    `path` (atomic on POSIX), so readers see the old file or the whole new one, never a part;
    a failure midway leaves no file behind.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    nbytes = 0
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            for chunk in chunks:
                f.write(chunk)
                digest.update(chunk)
                nbytes += len(chunk)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)
    return nbytes, digest.hexdigest()


def folder_digest(folder: Path) -> tuple[int, str]:
    """(total bytes, sha256) of a folder: files hashed in sorted relative-path order, each
    as its path, a NUL, its size and its content, so renames and moves change the digest."""
    folder = Path(folder)
    digest = hashlib.sha256()
    total = 0
    for file in sorted(p for p in folder.rglob("*") if p.is_file()):
        size = file.stat().st_size
        total += size
        digest.update(f"{file.relative_to(folder).as_posix()}\0{size}\0".encode())
        with file.open("rb") as f:
            while chunk := f.read(_CHUNK):
                digest.update(chunk)
    return total, digest.hexdigest()
