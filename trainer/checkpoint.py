"""Checkpoints: an HF-format folder plus the trainer state for exact resume.

Layout of `<out_dir>/checkpoints/step-00000012/`:
  config.json, model.safetensors, tokenizer files, generation_config.json   (loads unchanged in
                                      transformers' from_pretrained and vllm.LLM)
  trainer_state/state.json            step, stage, data cursor, reference step, spec hash
  trainer_state/optimizer.pt          AdamW state
  trainer_state/rng.pt                torch / python / numpy RNG states
  trainer_state/ref.safetensors       the KL reference weights (only when they differ from the policy)
  manifest.json                       sha256 and size of every file above
A checkpoint is written into a hidden temporary folder and renamed into place, so a crash
never leaves a half-written `step-*` folder; `load_state` re-checks the manifest anyway.
"""
from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_model, save_model

PREFIX = "step-"


class CheckpointError(RuntimeError):
    """A checkpoint is missing files or does not match its manifest."""


@dataclass
class TrainerState:
    step: int                  # steps completed
    stage: int
    data_cursor: int           # prompts consumed from the shuffled training stream
    ref_step: int              # step at which the KL reference was last reset to the policy
    spec_sha256: str


@dataclass(frozen=True)
class SavedCheckpoint:
    step: int
    path: Path
    nbytes: int
    sha256: str                # sha256 of manifest.json: one digest for the whole folder


def checkpoints_dir(out_dir: Path) -> Path:
    return Path(out_dir) / "checkpoints"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _write_manifest(folder: Path) -> tuple[int, str]:
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p.name != "manifest.json")
    entries = {str(p.relative_to(folder)): {"sha256": _sha256(p), "bytes": p.stat().st_size} for p in files}
    body = json.dumps({"files": entries}, indent=1, sort_keys=True).encode()
    (folder / "manifest.json").write_bytes(body)
    nbytes = sum(e["bytes"] for e in entries.values()) + len(body)
    return nbytes, hashlib.sha256(body).hexdigest()


def verify(folder: Path) -> None:
    """Raise CheckpointError unless every file in the manifest is present and intact."""
    manifest = Path(folder) / "manifest.json"
    if not manifest.is_file():
        raise CheckpointError(f"{folder}: no manifest.json (half-written or not a checkpoint)")
    for rel, meta in json.loads(manifest.read_text())["files"].items():
        p = Path(folder) / rel
        if not p.is_file() or p.stat().st_size != meta["bytes"] or _sha256(p) != meta["sha256"]:
            raise CheckpointError(f"{folder}: {rel} is missing or does not match the manifest")


def save(out_dir: Path, state: TrainerState, policy, tokenizer, optimizer, ref_model, keep_last: int) -> SavedCheckpoint:
    """Write a checkpoint atomically, then prune all but the newest `keep_last`."""
    root = checkpoints_dir(out_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"{PREFIX}{state.step:08d}"
    tmp = root / f".tmp-{final.name}-{uuid.uuid4().hex[:8]}"
    policy.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    ts = tmp / "trainer_state"
    ts.mkdir()
    (ts / "state.json").write_text(json.dumps(asdict(state), indent=1))
    torch.save(optimizer.state_dict(), ts / "optimizer.pt")
    torch.save({"torch": torch.get_rng_state(), "python": random.getstate(),
                "numpy": np.random.get_state()}, ts / "rng.pt")
    if ref_model is not None and state.ref_step != state.step:
        save_model(ref_model, str(ts / "ref.safetensors"))  # handles tied embeddings
    nbytes, digest = _write_manifest(tmp)
    if final.exists():  # a re-run of the same step after a resume: replace it
        shutil.rmtree(final)
    os.replace(tmp, final)
    prune(root, keep_last)
    return SavedCheckpoint(state.step, final, nbytes, digest)


def prune(root: Path, keep_last: int) -> None:
    for old in list_checkpoints(root)[:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)
        for cached in root.glob(old.name + ".tar.gz*"):  # download archives the API cached
            cached.unlink(missing_ok=True)
    for stale in root.glob(".tmp-*"):  # left by a crash mid-save
        shutil.rmtree(stale, ignore_errors=True)


def list_checkpoints(root: Path) -> list[Path]:
    """Complete checkpoint folders, oldest first."""
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.name.startswith(PREFIX) and (p / "manifest.json").is_file())


def latest(out_dir: Path) -> Path | None:
    found = list_checkpoints(checkpoints_dir(out_dir))
    return found[-1] if found else None


def load_state(folder: Path, optimizer, ref_model) -> TrainerState:
    """Verify `folder`, restore optimizer, RNG and reference weights; return the counters.

    The policy weights themselves are loaded by `from_pretrained(folder)` before this call.
    """
    folder = Path(folder)
    verify(folder)
    ts = folder / "trainer_state"
    state = TrainerState(**json.loads((ts / "state.json").read_text()))
    optimizer.load_state_dict(torch.load(ts / "optimizer.pt", weights_only=False))
    rng = torch.load(ts / "rng.pt", weights_only=False)
    torch.set_rng_state(rng["torch"])
    random.setstate(rng["python"])
    np.random.set_state(rng["numpy"])
    if ref_model is not None and (ts / "ref.safetensors").is_file():
        load_model(ref_model, str(ts / "ref.safetensors"))
    return state
