"""Checkpoint archives: a `.tar.gz` of an HF-format folder, built once and cached beside it.

`GET /v1/jobs/{id}/checkpoints/{step}/download` serves `<folder>.tar.gz` with `FileResponse`
(sendfile, `Content-Length`, no Python in the byte path). The archive is built on the first
request into a temp name in the same folder and renamed into place, so a reader never sees a
half-written file and a crash leaves only a stray temp file. Its sha256 (the ETag and
`X-Checksum-Sha256`) is computed while writing and kept in `<folder>.tar.gz.sha256`, so later
requests don't re-hash gigabytes.

Archives are deterministic (sorted entries, zeroed owners, gzip mtime 0, file mtimes kept):
two API replicas racing to build the same archive produce identical bytes, so whichever
rename lands last changes nothing and every ETag handed out stays valid.
Checkpoint folders are immutable once their row exists (the worker writes, then records), so
the cache is never invalidated. A deleted folder (keep_last rotation) makes the checkpoint
unavailable even if a stale archive is still beside it: the folder is the truth.

Entries are relative to the folder (`config.json`, `model.safetensors`, ...): extracting the
archive into an empty directory yields the checkpoint folder itself.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import tarfile
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

_build_lock = threading.Lock()  # one builder per process; replicas are made safe by renames


class _HashingWriter:
    """A write-only file object that hashes and counts what passes through it."""

    def __init__(self, raw):
        self.raw = raw
        self.sha = hashlib.sha256()
        self.size = 0

    def write(self, data: bytes) -> int:
        self.sha.update(data)
        self.size += len(data)
        return self.raw.write(data)

    def flush(self) -> None:
        self.raw.flush()


@dataclass(frozen=True)
class Archive:
    path: Path
    sha256: str
    size: int


def archive_paths(folder: Path) -> tuple[Path, Path]:
    archive = folder.with_name(folder.name + ".tar.gz")
    return archive, archive.with_name(archive.name + ".sha256")


def _reset_owner(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def _write_tar(folder: Path, fileobj) -> None:
    # gzip.GzipFile with mtime=0 and no filename: the header carries nothing that varies.
    with gzip.GzipFile(filename="", mode="wb", fileobj=fileobj, mtime=0, compresslevel=6) as gz:
        with tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for path in sorted(folder.rglob("*")):
                if path.is_symlink() or not (path.is_file() or path.is_dir()):
                    continue  # an HF folder holds plain files; links could leak other paths
                tar.add(path, arcname=path.relative_to(folder).as_posix(),
                        recursive=False, filter=_reset_owner)


def _cached(archive: Path, sidecar: Path) -> Archive | None:
    try:
        sha = sidecar.read_text().strip()
        size = archive.stat().st_size
    except FileNotFoundError:
        return None
    return Archive(archive, sha, size) if len(sha) == 64 else None


def _atomic_text(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def ensure_archive(folder: Path) -> Archive:
    """The cached archive of `folder`, building it first if needed.

    Raises FileNotFoundError when the folder does not exist.
    """
    if not folder.is_dir():
        raise FileNotFoundError(folder)
    archive, sidecar = archive_paths(folder)
    found = _cached(archive, sidecar)
    if found is not None:
        return found
    with _build_lock:
        found = _cached(archive, sidecar)  # another thread may have built it meanwhile
        if found is not None:
            return found
        fd, tmp = tempfile.mkstemp(dir=folder.parent, prefix=f".{archive.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as raw:
                writer = _HashingWriter(raw)
                _write_tar(folder, writer)
            # Sidecar first: an archive without its sidecar is rebuilt, never served unhashed.
            _atomic_text(sidecar, writer.sha.hexdigest() + "\n")
            os.replace(tmp, archive)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    return Archive(archive, writer.sha.hexdigest(), writer.size)
