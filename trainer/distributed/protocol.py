"""What the worker and a job's ranks say to each other, and where it travels.

However the ranks were started (a `trainer.distributed.launchers.Launcher`), the calling
process (the Celery worker, or `brorl train --nproc`) and the ranks talk only through the files
of one control folder, `<attempt's out_dir>/ranks/`, which every rank must be able to read and
write (on one node, the local disk; across nodes, a filesystem they all mount):

  job.json           worker -> ranks: the spec and paths (`JobMessage`), written before the start
  sink.jsonl         rank 0 -> worker: metrics, events, samples and checkpoints, one
                     `trainer.sink.RecordSink` line each; the worker relays each to the real sink
                     once, in order (`trainer.distributed.launch`)
  stop               worker -> ranks: present once the job should stop; the ranks agree on it at
                     the next step boundary, save and leave
  result.json        rank 0 -> worker: the `TrainResult`, written after every rank finished
  error-<rank>.json  rank -> worker: an exception the rank raised (`ErrorReport`), marked
                     `peer_failure` when it was a collective broken by another rank's death

A launcher may keep files of its own there (the local one: `torchrun.log`). Files, not sockets:
the worker can restart its relay from any offset, a rank needs no address of the worker, and a
failed attempt leaves everything it said on disk for the post-mortem.
"""
from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from trainer.result import TrainResult
from trainer.checkpoints.io import StartFrom
from trainer.sink import MetricsSink, NullSink, RecordSink
from trainer.spec import JobSpec

FOLDER = "ranks"


@dataclass(frozen=True)
class JobMessage:
    """worker -> ranks: what to train and where (the arguments of `trainer.loop.train_in_process`)."""

    spec: JobSpec
    out_dir: Path
    resume: Path | None = None
    dataset_path: Path | None = None
    start_from: StartFrom | None = None

    def to_json(self) -> dict:
        return {"spec": self.spec.model_dump(mode="json"), "out_dir": str(self.out_dir),
                "resume": str(self.resume) if self.resume else None,
                "dataset_path": str(self.dataset_path) if self.dataset_path else None,
                "start_from": {"folder": str(self.start_from.folder), "optimizer": self.start_from.optimizer}
                if self.start_from else None}

    @classmethod
    def from_json(cls, data: dict) -> JobMessage:
        return cls(spec=JobSpec.model_validate(data["spec"]), out_dir=Path(data["out_dir"]),
                   resume=Path(data["resume"]) if data.get("resume") else None,
                   dataset_path=Path(data["dataset_path"]) if data.get("dataset_path") else None,
                   start_from=StartFrom(Path(data["start_from"]["folder"]), bool(data["start_from"]["optimizer"]))
                   if data.get("start_from") else None)


@dataclass(frozen=True)
class ErrorReport:
    """rank -> worker: an exception a rank raised. `peer_failure`: a collective broken by another
    rank's death (`trainer.collectives.is_peer_failure`), so the death, not this rank, is to blame."""

    type: str
    message: str
    peer_failure: bool = False

    @classmethod
    def of(cls, exc: BaseException, peer_failure: bool) -> ErrorReport:
        return cls(type=type(exc).__name__, message=str(exc), peer_failure=peer_failure)

    def to_json(self) -> dict:
        return {"type": self.type, "message": self.message, "peer_failure": self.peer_failure}

    @classmethod
    def from_json(cls, data: dict) -> ErrorReport:
        return cls(type=str(data["type"]), message=str(data["message"]),
                   peer_failure=bool(data.get("peer_failure", False)))


@dataclass(frozen=True)
class ControlFolder:
    """One attempt's control folder; both sides' reads and writes of the messages above."""

    path: Path

    @classmethod
    def of(cls, out_dir: Path) -> ControlFolder:
        return cls(Path(out_dir) / FOLDER)

    @classmethod
    def fresh(cls, out_dir: Path) -> ControlFolder:
        """An empty folder for a new start: nothing an earlier start said may be read as ours."""
        folder = cls.of(out_dir)
        shutil.rmtree(folder.path, ignore_errors=True)
        folder.path.mkdir(parents=True)
        return folder

    def file(self, name: str) -> Path:
        """A file of the folder: the messages' own, or a launcher's (its log)."""
        return self.path / name

    def text(self, name: str) -> str:
        """A file's text ("" when it is not there: a launcher that never started writes no log)."""
        path = self.path / name
        return path.read_text(errors="replace") if path.is_file() else ""

    @property
    def sink_file(self) -> Path:
        return self.path / "sink.jsonl"

    # worker -> ranks
    def write_job(self, job: JobMessage) -> None:
        (self.path / "job.json").write_text(json.dumps(job.to_json()))

    def read_job(self) -> JobMessage:
        return JobMessage.from_json(json.loads((self.path / "job.json").read_text()))

    def request_stop(self) -> None:
        (self.path / "stop").touch()

    def stop_requested(self) -> bool:
        return (self.path / "stop").exists()

    # ranks -> worker
    def rank_sink(self, rank: int) -> MetricsSink:
        """Rank 0 reports the job's figures; the others report nothing (theirs are summed into
        rank 0's, or the same)."""
        return RecordSink(self.sink_file) if rank == 0 else NullSink()

    def write_result(self, result: TrainResult) -> None:
        (self.path / "result.json").write_text(json.dumps(result.to_json()))

    def read_result(self) -> TrainResult | None:
        path = self.path / "result.json"
        return TrainResult.from_json(json.loads(path.read_text())) if path.is_file() else None

    def write_error(self, rank: int, report: ErrorReport) -> None:
        (self.path / f"error-{rank}.json").write_text(json.dumps(report.to_json()))

    def read_errors(self) -> dict[int, ErrorReport]:
        """Every rank's report, by rank."""
        return {int(p.stem.split("-")[1]): ErrorReport.from_json(json.loads(p.read_text()))
                for p in self.path.glob("error-*.json")}
