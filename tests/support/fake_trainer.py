"""A stand-in for `trainer.train` (`tests.support.jobs.FAKE_ENTRYPOINT`) used by the worker, fault
and end-to-end tests of the service's plumbing.

It has the real signature and talks to the sink exactly like the trainer: one `metrics` call
per step (3 steps), a `stage_started` event, and a checkpoint folder (two files plus its
sha256) at the last step. It honours `should_stop` before every step and resumes after the
step stored in a checkpoint folder. Tests steer it through the job's `name`, because that
survives the trip through HTTP, the database and a worker subprocess:
- `sleep=SECONDS`: sleep that long in every step (default 0.05 s), to catch a job mid-run;
- `steps=N`: train N steps instead of 3;
- `fail`: raise RuntimeError("fake trainer failure") after the first step;
- `crash`: kill the whole process (os._exit) after the first step, as an OOM kill would;
- `rankdied`: raise `FakeRankDied` (`retryable = True`, like `trainer.distributed.launch.RankDied`)
  after the first step, as a many-GPU job does when one of its ranks dies;
- `ckpt`: save (and record) a checkpoint after every step, not only the last.
- `build`: first build the spec's task as the real trainer does (`trainer.tasks.build_task`,
  in a child process with its limits, a stop polled meanwhile).
- `phases=SECONDS`: first a `warm_start` phase of that long, reporting every 0.1 s through the
  trainer's own `trainer.events.PhaseProgress` (so rate-limited as the trainer's), stopping
  early if asked.
A dataset job fails unless `dataset_path` is an existing file (the runner must resolve it).
"""
from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from trainer.checkpoints import format as ckpt_format

STEPS = 3


class FakeRankDied(RuntimeError):
    """A fault of the machine, not of the job: the runner retries the job."""

    retryable = True


@dataclass
class FakeResult:
    steps_done: int
    stopped: bool
    checkpoint: Path | None


def _options(name: str) -> tuple[float, bool]:
    match = re.search(r"sleep=([0-9.]+)", name)
    return (float(match.group(1)) if match else 0.05), ("fail" in name.split())


def _flag(name: str, flag: str) -> bool:
    return flag in name.split()


def write_checkpoint(out_dir: Path, step: int) -> tuple[Path, int, str]:
    """A checkpoint folder in the trainer's format (`trainer.checkpoints.format`): config, weights,
    state and manifest; returns (dir, bytes, digest)."""
    folder = Path(out_dir) / "checkpoints" / ckpt_format.folder_name(step)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({"model_type": "fake", "step": step}))
    (folder / "model.safetensors").write_bytes(bytes(range(256)) * 8)
    (folder / "trainer_state.json").write_text(json.dumps({"step": step}))
    nbytes, digest = ckpt_format.write_manifest(folder)
    return folder, nbytes, digest


def _warm_start_phase(sink, seconds: float, should_stop: Callable[[], bool]) -> bool:
    """A warm start's `progress` events over `seconds`; False if stopped first."""
    from trainer.events import Phase, PhaseProgress

    ticks = max(1, int(seconds * 10))
    with PhaseProgress(sink).phase(Phase.warm_start, "fake warm start", total=ticks) as report:
        for tick in range(1, ticks + 1):
            if should_stop():
                return False
            time.sleep(0.1)
            report(tick, ticks, f"fake warm start: step {tick}")
    return True


def train(spec, sink, should_stop: Callable[[], bool], resume: Path | None = None, *,
          out_dir: Path, dataset_path: Path | None = None, start_from=None) -> FakeResult:
    sleep_s, fail = _options(spec.name)
    if dataset_path is not None and not Path(dataset_path).is_file():
        raise FileNotFoundError(f"dataset {dataset_path} is missing")
    if _flag(spec.name, "build"):
        from trainer.stop import StopRequested, stop_check
        from trainer.tasks import build_task

        try:
            build_task(spec.task, spec.seed, dataset_path, stop_check=stop_check(should_stop))
        except StopRequested:
            return FakeResult(0, True, None)
    if match := re.search(r"phases=([0-9.]+)", spec.name):
        if not _warm_start_phase(sink, float(match.group(1)), should_stop):
            return FakeResult(0, True, None)
    start = 0
    if resume is not None:
        start = json.loads((Path(resume) / "trainer_state.json").read_text())["step"]
        sink.event("stage_started", {"stage": 0, "resumed_from_step": start})
    if start == 0:
        # A continuation names the parent checkpoint's folder it was handed (trainer.train's start_from).
        origin = {"continued_from": Path(start_from.folder).name, "optimizer": start_from.optimizer} \
            if start_from is not None else {}
        sink.event("stage_started", {"stage": 0, "n": spec.rollout.schedule[0].n, **origin})
    checkpoint = None
    match = re.search(r"steps=([0-9]+)", spec.name)
    steps = int(match.group(1)) if match else STEPS
    for step in range(start + 1, steps + 1):
        if should_stop():
            return FakeResult(step - 1, True, checkpoint)
        time.sleep(sleep_s)
        values: dict[str, Any] = {"reward_mean": 0.1 * step, "loss": 1.0 / step, "stage": 0}
        sink.metrics(step, values)
        if fail:
            raise RuntimeError("fake trainer failure")
        if _flag(spec.name, "rankdied"):
            raise FakeRankDied("rank 1 of 2 died (exit code -9)")
        if _flag(spec.name, "crash"):
            os._exit(3)
        if _flag(spec.name, "ckpt") and step < steps:
            checkpoint, nbytes, sha = write_checkpoint(Path(out_dir), step)
            sink.checkpoint(step, checkpoint, nbytes, sha)
    checkpoint, nbytes, sha = write_checkpoint(Path(out_dir), steps)
    sink.checkpoint(steps, checkpoint, nbytes, sha)
    return FakeResult(steps, False, checkpoint)
