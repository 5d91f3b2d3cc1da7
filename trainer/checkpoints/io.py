"""Checkpoints: an HF-format folder plus the trainer state for exact resume.

Layout of `<out_dir>/checkpoints/step-00000012/`:
  config.json, model.safetensors, tokenizer files, generation_config.json   (loads unchanged in
                                      transformers' from_pretrained and vllm.LLM)
  trainer_state/state.json            step, stage, data cursor, reference step, spec hash
  trainer_state/optimizer.pt          AdamW state (one process)
  trainer_state/dcp/                  instead, when saved by many ranks: the sharded weights and AdamW
                                      state (torch.distributed.checkpoint; resumes on any rank count)
  trainer_state/rng.pt                torch / python / numpy RNG states
  trainer_state/ref.safetensors       the KL reference weights (only when they differ from the policy)
  manifest.json                       sha256 and size of every file above
A LoRA job's checkpoint holds PEFT's adapter (adapter_config.json, adapter_model.safetensors)
instead of config.json + model.safetensors, and merged/: an HF folder of the base with the
adapter folded in (trainer.models.lora). trainer_state/ref.safetensors is then the reference
adapter's snapshot. On many ranks a LoRA job is replicated, not sharded: rank 0 writes the
same one-process folder (optimizer.pt, no dcp/), which resumes on any rank count.
A checkpoint is written into a hidden temporary folder and renamed into place, so a crash
never leaves a half-written `step-*` folder; `load_state` re-checks the manifest anyway.
Names, manifest, digest and archive are defined once, torch-free, in `trainer.checkpoints.format`.
"""
from __future__ import annotations

import errno
import json
import random
import shutil
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file, save_model

from trainer.checkpoints import format as ckpt_format
from trainer import collectives as distributed
from trainer.models.lora import has_an_adapter, merged_state_dict
from trainer.checkpoints.format import CheckpointError, StartFrom, list_checkpoints, verify  # noqa: F401 - re-exported

PREFIX = ckpt_format.PREFIX


@dataclass
class TrainerState:
    step: int                  # steps completed
    stage: int
    data_cursor: int           # prompts consumed from the shuffled training stream
    ref_step: int              # step at which the KL reference was last reset to the policy
    spec_sha256: str
    # Running counters a resumed run must continue, not restart (older checkpoints: defaults).
    keep_rate_running: float = 1.0   # dynamic sampling's running keep rate (sets oversampling)
    keep_rounds_seen: int = 0
    nonfinite_in_row: int = 0
    stalled_steps: int = 0
    # rollout.broaden: 0-based first steps of the broadened stages, and the plateau rule's memory.
    broaden_starts: list[int] = field(default_factory=list)
    plateau_best: float | None = None
    plateau_since: int = 0
    # algo.difficulty_filter: the retired prompts and the recent draws (DifficultyFilter.state_dict).
    difficulty: dict | None = None
    # The spec this state was trained under (`model_dump(mode="json")`), so that a resume under
    # another spec can name the fields that changed (older checkpoints: only the hash).
    spec: dict | None = None


@dataclass(frozen=True)
class SavedCheckpoint:
    step: int
    path: Path
    nbytes: int
    sha256: str                # sha256 of manifest.json: one digest for the whole folder


def checkpoints_dir(out_dir: Path) -> Path:
    return Path(out_dir) / "checkpoints"


def _write_folder(tmp: Path, state: TrainerState, policy, tokenizer, optimizer, ref_model) -> tuple[int, str]:
    """Every rank writes its shards; rank 0 the rest (other ranks return (0, ""))."""
    sharded = distributed.is_sharded(policy)
    merged_bytes = 0
    save_ref = ref_model is not None and state.ref_step != state.step
    ref_state = _gather_sharded(ref_model) if save_ref and distributed.is_sharded(ref_model) else None
    if sharded:
        distributed.save_sharded(tmp / "trainer_state" / "dcp", policy, optimizer)
        distributed.save_consolidated(tmp, policy, tokenizer)  # gathered; written by rank 0
        if distributed.rank() != 0:
            return 0, ""
    else:
        if distributed.rank() != 0:  # replicated on ranks (LoRA): rank 0's copy is everyone's
            return 0, ""
        policy.save_pretrained(tmp, safe_serialization=True)  # LoRA: PEFT's adapter files
        tokenizer.save_pretrained(tmp)
        if has_an_adapter(policy):
            merged_bytes = write_merged(policy, tokenizer, tmp / ckpt_format.MERGED_DIR)
    ts = tmp / "trainer_state"
    ts.mkdir(exist_ok=True)
    (ts / "state.json").write_text(json.dumps(asdict(state), indent=1))
    if not sharded:
        torch.save(optimizer.state_dict(), ts / "optimizer.pt")
    torch.save({"torch": torch.get_rng_state(), "python": random.getstate(),
                "numpy": np.random.get_state()}, ts / "rng.pt")
    if ref_state is not None:
        save_file(ref_state, str(ts / "ref.safetensors"))
    elif save_ref:
        save_model(ref_model, str(ts / "ref.safetensors"))  # handles tied embeddings
    nbytes, digest = ckpt_format.write_manifest(tmp)
    return nbytes + merged_bytes, digest


def _gather_sharded(model) -> dict:
    """A sharded model's whole weights on rank 0's CPU (empty elsewhere; every rank joins),
    tied duplicates dropped (safetensors stores a tensor once)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    out, seen = {}, set()
    for k, v in full.items():
        if v.data_ptr() not in seen:
            seen.add(v.data_ptr())
            out[k] = v.contiguous()
    return out


def save(out_dir: Path, state: TrainerState, policy, tokenizer, optimizer, ref_model,
         keep_last: int | None = None) -> SavedCheckpoint:
    """Write a checkpoint atomically (then prune all but the newest `keep_last`, when given).

    A failure while writing (disk full, read-only dir) removes the temporary folder and raises
    CheckpointError naming the step and the cause, so the job fails with a clear message and
    no half-written folder stays behind.
    """
    root = checkpoints_dir(out_dir)
    final = root / ckpt_format.folder_name(state.step)
    # Many ranks write into one folder: rank 0 names it, creates it and renames it at the end.
    tmp = root / f".tmp-{final.name}-{distributed.from_rank0(uuid.uuid4().hex[:8])}"
    lead = distributed.rank() == 0
    try:
        if lead:
            (tmp / "trainer_state").mkdir(parents=True)
        distributed.barrier()
        nbytes, digest = _write_folder(tmp, state, policy, tokenizer, optimizer, ref_model)
        distributed.barrier()
        if lead:
            if final.exists():  # a re-run of the same step after a resume: replace it
                shutil.rmtree(final)
            tmp.rename(final)
    except (OSError, RuntimeError) as exc:  # torch.save reports a full disk as RuntimeError
        shutil.rmtree(tmp, ignore_errors=True)
        raise CheckpointError(f"could not write the checkpoint of step {state.step}: "
                              f"{_reason(exc)}") from exc
    nbytes, digest = distributed.from_rank0((nbytes, digest))
    if keep_last is not None and lead:
        prune(root, keep_last)
    return SavedCheckpoint(state.step, final, nbytes, digest)


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.errno == errno.ENOSPC or "No space left" in str(exc):
        return "no space left on device (the artifact dir is full)"
    if isinstance(exc, OSError) and exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        return "the artifact dir is not writable"
    return f"{type(exc).__name__}: {exc}"


def prune(root: Path, keep_last: int) -> None:
    for old in list_checkpoints(root)[:-keep_last]:
        ckpt_format.remove(old)  # the folder and the download archive built for it
    for stale in Path(root).glob(".tmp-*"):  # left by a crash mid-save
        shutil.rmtree(stale, ignore_errors=True)


def latest(out_dir: Path) -> Path | None:
    found = list_checkpoints(checkpoints_dir(out_dir))
    return found[-1] if found else None

def load_optimizer(folder: Path, optimizer, policy=None) -> None:
    """The optimizer state of the checkpoint in `folder` (a many-rank `dcp/` reshards into this
    run, which also reloads the policy's weights it holds; a one-process `optimizer.pt` is split
    over the ranks)."""
    ts = Path(folder) / "trainer_state"
    if (ts / "dcp").is_dir():
        distributed.load_sharded(ts / "dcp", policy, optimizer)
    elif distributed.is_sharded(policy):
        distributed.load_full_optimizer(policy, optimizer, torch.load(ts / "optimizer.pt", weights_only=False))
    else:
        optimizer.load_state_dict(torch.load(ts / "optimizer.pt", weights_only=False))


def load_state(folder: Path, optimizer, ref_model, policy=None) -> TrainerState:
    """Verify `folder`, restore optimizer, RNG and reference weights; return the counters.

    The policy weights themselves are loaded by `from_pretrained(folder)` before this call
    (and sharded, on many ranks). A checkpoint of many ranks (`dcp/`) reshards into this run,
    one process included; a one-process `optimizer.pt` is split over the ranks.
    """
    folder = Path(folder)
    verify(folder)
    ts = folder / "trainer_state"
    state = TrainerState(**json.loads((ts / "state.json").read_text()))
    load_optimizer(folder, optimizer, policy)
    rng = torch.load(ts / "rng.pt", weights_only=False)
    torch.set_rng_state(rng["torch"])
    random.setstate(rng["python"])
    np.random.set_state(rng["numpy"])
    if ref_model is not None and (ts / "ref.safetensors").is_file():
        # Whichever tied name the file kept; on ranks each keeps its shard of the reference.
        distributed.load_full_weights(ref_model, load_file(str(ts / "ref.safetensors")))
    return state


def write_merged(model: torch.nn.Module, tokenizer, folder: Path) -> int:
    """An HF model folder of the merged weights, with its own manifest: loads with
    `from_pretrained` and in vLLM without peft. Weights in the base's dtype (the compute
    dtype). Returns its size in bytes."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    weights, tied = merged_state_dict(model)
    base = model.get_base_model()
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
    base.config.save_pretrained(folder)
    if not tied:  # an adapter on the output head untied it from the embeddings
        config = json.loads((folder / "config.json").read_text())
        config["tie_word_embeddings"] = False
        (folder / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    if base.generation_config is not None:
        base.generation_config.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return ckpt_format.write_manifest(folder)[0]
