"""The checkpoint format, torch-free: folder names, the manifest and its digest, the archive.

The one definition that the trainer (which writes checkpoints), the store (which knows where a
job's files live) and the API (which serves them) all import. Layout of a checkpoint folder:

    step-00000012/                  `folder_name(12)`; zero-padded so a listing sorts by step
      config.json, model.safetensors, tokenizer files ...   (HF format)
      trainer_state/...             exact-resume state (see trainer.checkpoints.io)
      manifest.json                 sha256 and size of every other file
    step-00000012.tar.gz            the download archive, built once when the checkpoint is
    step-00000012.tar.gz.sha256     recorded; its sha256 (the download's ETag) beside it

A LoRA checkpoint holds PEFT's adapter (`adapter_config.json`, `adapter_model.safetensors`)
instead of the model files, plus `merged/`: an HF folder of the base with the adapter folded
in, with its own manifest. The default archive (the adapter, with the exact-resume state)
leaves `merged/` out; `step-00000012.merged.tar.gz` is `merged/` alone, built on first
download (`VARIANTS`).

A checkpoint's digest is the sha256 of its manifest.json bytes: one number for the folder.
Archives are deterministic (sorted entries, zeroed owners, gzip mtime 0), so two builders
racing produce identical bytes and any ETag handed out stays valid.
"""
from __future__ import annotations

import gzip
import hashlib
import json
import os
import re
import shutil
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

PREFIX = "step-"
MANIFEST = "manifest.json"
ADAPTER_CONFIG = "adapter_config.json"   # PEFT's: present only in a LoRA checkpoint
MERGED_DIR = "merged"                    # a LoRA checkpoint's merged HF folder
# Download variants: None = the folder (the adapter for LoRA); "merged" = merged/ only.
VARIANTS = (None, "merged")
_NAME = re.compile(r"^step-(\d{8,})$")
_CHUNK = 1 << 20


@dataclass(frozen=True)
class StartFrom:
    """Another job's checkpoint a new job starts from (`spec.continue_from`, resolved by the
    worker): its weights (full fine-tuning) or its base and adapter (LoRA), and with `optimizer`
    its optimizer state; the new job's counters, schedule and data stream start afresh."""

    folder: Path
    optimizer: bool = False


class CheckpointError(RuntimeError):
    """A checkpoint is missing files or does not match its manifest."""


@dataclass(frozen=True)
class Archive:
    path: Path
    sha256: str
    size: int


def folder_name(step: int) -> str:
    return f"{PREFIX}{step:08d}"


def step_of(folder: Path) -> int | None:
    """The step a checkpoint folder name encodes, None for anything else."""
    m = _NAME.match(Path(folder).name)
    return int(m.group(1)) if m else None


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()


def holds_an_adapter(folder: Path) -> bool:
    """Whether a checkpoint folder holds a LoRA adapter (and a merged/ folder)."""
    return (Path(folder) / ADAPTER_CONFIG).is_file()


def _own_files(folder: Path) -> list[Path]:
    """Files of `folder` its manifest covers: not the manifest, not merged/ (it has its own)."""
    merged = folder / MERGED_DIR
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST
                  and not (p.is_relative_to(merged) and (merged / MANIFEST).is_file()))


def write_manifest(folder: Path) -> tuple[int, str]:
    """Write manifest.json for every file in `folder` (a merged/ folder with its own manifest
    is left to it); returns (total bytes, digest)."""
    folder = Path(folder)
    files = _own_files(folder)
    entries = {p.relative_to(folder).as_posix(): {"sha256": sha256_file(p), "bytes": p.stat().st_size}
               for p in files}
    body = json.dumps({"files": entries}, indent=1, sort_keys=True).encode()
    (folder / MANIFEST).write_bytes(body)
    return sum(e["bytes"] for e in entries.values()) + len(body), hashlib.sha256(body).hexdigest()


def digest(folder: Path) -> tuple[int, str]:
    """(total bytes, digest) of a folder that already has its manifest."""
    body = (Path(folder) / MANIFEST).read_bytes()
    entries = json.loads(body)["files"].values()
    return sum(e["bytes"] for e in entries) + len(body), hashlib.sha256(body).hexdigest()


def verify(folder: Path) -> None:
    """Raise CheckpointError unless every file in the manifest is present and intact."""
    manifest = Path(folder) / MANIFEST
    if not manifest.is_file():
        raise CheckpointError(f"{Path(folder).name}: no {MANIFEST} (half-written or not a checkpoint)")
    for rel, meta in json.loads(manifest.read_text())["files"].items():
        p = Path(folder) / rel
        if not p.is_file() or p.stat().st_size != meta["bytes"] or sha256_file(p) != meta["sha256"]:
            raise CheckpointError(f"{Path(folder).name}: {rel} is missing or does not match the manifest")
    if (Path(folder) / MERGED_DIR / MANIFEST).is_file():
        verify(Path(folder) / MERGED_DIR)


def list_checkpoints(root: Path) -> list[Path]:
    """Complete checkpoint folders under `root`, oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if step_of(p) is not None and (p / MANIFEST).is_file()]
    return sorted(found, key=lambda p: step_of(p) or 0)


def remove(folder: Path) -> None:
    """Delete a checkpoint folder and its archive (missing parts are fine)."""
    folder = Path(folder)
    shutil.rmtree(folder, ignore_errors=True)
    for variant in VARIANTS:
        for path in archive_paths(folder, variant):
            path.unlink(missing_ok=True)


# --------------------------------------------------------------------------- archive


def archive_paths(folder: Path, variant: str | None = None) -> tuple[Path, Path]:
    suffix = f".{variant}.tar.gz" if variant else ".tar.gz"
    archive = Path(folder).with_name(Path(folder).name + suffix)
    return archive, archive.with_name(archive.name + ".sha256")


class _HashingWriter:
    """A write-only file object that hashes and counts what passes through it."""

    def __init__(self, raw):
        self.raw, self.sha, self.size = raw, hashlib.sha256(), 0

    def write(self, data: bytes) -> int:
        self.sha.update(data)
        self.size += len(data)
        return self.raw.write(data)

    def flush(self) -> None:
        self.raw.flush()


def _reset_owner(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def _write_tar(folder: Path, fileobj, skip: Path | None = None) -> None:
    # gzip with mtime=0 and no filename: the header carries nothing that varies.
    with gzip.GzipFile(filename="", mode="wb", fileobj=fileobj, mtime=0, compresslevel=6) as gz:
        with tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for path in sorted(folder.rglob("*")):
                if path.is_symlink() or not (path.is_file() or path.is_dir()):
                    continue  # a checkpoint holds plain files; links could leak other paths
                if skip is not None and (path == skip or path.is_relative_to(skip)):
                    continue
                tar.add(path, arcname=path.relative_to(folder).as_posix(),
                        recursive=False, filter=_reset_owner)


def cached_archive(folder: Path, variant: str | None = None) -> Archive | None:
    """The archive built for `folder`, or None when it (or its sha256 sidecar) is missing."""
    archive, sidecar = archive_paths(folder, variant)
    try:
        sha = sidecar.read_text().strip()
        size = archive.stat().st_size
    except FileNotFoundError:
        return None
    return Archive(archive, sha, size) if len(sha) == 64 else None


def _atomic_text(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def build_archive(folder: Path, variant: str | None = None) -> Archive:
    """Write `<folder>.tar.gz` (or `<folder>.merged.tar.gz`: merged/ alone) and its sidecar
    (temp name + rename); FileNotFoundError when the folder (or merged/) is gone. A failure
    (disk full) leaves neither a temp file nor a partial archive."""
    folder = Path(folder)
    source = folder / MERGED_DIR if variant == "merged" else folder
    if not source.is_dir():
        raise FileNotFoundError(source)
    archive, sidecar = archive_paths(folder, variant)
    fd, tmp = tempfile.mkstemp(dir=folder.parent, prefix=f".{archive.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as raw:
            writer = _HashingWriter(raw)
            _write_tar(source, writer, skip=None if variant else folder / MERGED_DIR)
        # Sidecar first: an archive without its sidecar is rebuilt, never served unhashed.
        _atomic_text(sidecar, writer.sha.hexdigest() + "\n")
        os.replace(tmp, archive)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return Archive(archive, writer.sha.hexdigest(), writer.size)
