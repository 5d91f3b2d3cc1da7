"""Where metrics and events go; the trainer never learns which (the worker, the CLI and tests differ).

A sink gets one `metrics(step, values)` call per step, `samples(step, rows)` with the step's
stored rollouts (`trainer.samples`), and `event(type, data)` calls at stage boundaries,
evaluations, checkpoints and through long phases (`progress`). The worker supplies a database
sink; the CLI a JSONL one; tests a list. `type` is a `trainer.events.EventType` (a plain
string is checked against it): every sink raises `UnknownEventType` on any other.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Protocol

from trainer.events import EventType, event_type


class MetricsSink(Protocol):
    def metrics(self, step: int, values: dict[str, Any]) -> None: ...
    def event(self, type: EventType, data: dict[str, Any]) -> None: ...
    def checkpoint(self, step: int, path: Path, nbytes: int, sha256: str) -> None: ...
    def samples(self, step: int, rows: list[dict[str, Any]]) -> None: ...


class ListSink:
    """Keeps everything in memory, for tests."""

    def __init__(self) -> None:
        self.steps: list[dict[str, Any]] = []
        self.events: list[tuple[EventType, dict[str, Any]]] = []
        self.checkpoints: list[tuple[int, Path, int, str]] = []
        self.samples_by_step: dict[int, list[dict[str, Any]]] = {}

    def metrics(self, step, values):
        self.steps.append({"step": step, **values})

    def event(self, type, data):
        self.events.append((event_type(type), data))

    def checkpoint(self, step, path, nbytes, sha256):
        self.checkpoints.append((step, Path(path), nbytes, sha256))

    def samples(self, step, rows):
        self.samples_by_step[step] = rows


class JsonlSink:
    """Appends one JSON line per step to a file (and events to a second one)."""

    def __init__(self, out_dir: Path) -> None:
        out_dir.mkdir(parents=True, exist_ok=True)
        self._metrics = open(out_dir / "metrics.jsonl", "a", buffering=1)
        self._events = open(out_dir / "events.jsonl", "a", buffering=1)
        self._samples = open(out_dir / "samples.jsonl", "a", buffering=1)

    def metrics(self, step, values):
        self._metrics.write(json.dumps({"step": step, **values}) + "\n")

    def event(self, type, data):
        self._events.write(json.dumps({"type": event_type(type).value, **data}) + "\n")

    def checkpoint(self, step, path, nbytes, sha256):
        self.event(EventType.checkpoint_saved, {"step": step, "path": str(path), "bytes": nbytes, "sha256": sha256})

    def samples(self, step, rows):
        for row in rows:
            self._samples.write(json.dumps({"step": step, **row}) + "\n")



class RecordSink:
    """Every call as one JSON line in `path`, for a process that relays them to the real sink
    (a rank's metrics reach the worker's database sink through `trainer.distributed.launch`)."""

    def __init__(self, path: Path) -> None:
        self._file = open(path, "a", buffering=1)

    def metrics(self, step, values):
        self._write({"call": "metrics", "step": step, "values": values})

    def event(self, type, data):
        self._write({"call": "event", "type": event_type(type).value, "data": data})

    def checkpoint(self, step, path, nbytes, sha256):
        self._write({"call": "checkpoint", "step": step, "path": str(path), "nbytes": nbytes, "sha256": sha256})

    def samples(self, step, rows):
        self._write({"call": "samples", "step": step, "rows": rows})

    def _write(self, record: dict) -> None:
        self._file.write(json.dumps(record) + "\n")


class NullSink:
    """What ranks other than 0 report to: nothing (rank 0 reports the job's figures)."""

    def metrics(self, step, values):
        pass

    def event(self, type, data):
        event_type(type)  # a rank's unknown type fails on that rank too, not only on rank 0

    def checkpoint(self, step, path, nbytes, sha256):
        pass

    def samples(self, step, rows):
        pass


def replay(record: dict[str, Any], sink: MetricsSink) -> None:
    """One `RecordSink` line into `sink`."""
    call = record["call"]
    if call == "metrics":
        sink.metrics(record["step"], record["values"])
    elif call == "event":
        sink.event(record["type"], record["data"])
    elif call == "samples":
        sink.samples(record["step"], record["rows"])
    else:
        sink.checkpoint(record["step"], Path(record["path"]), record["nbytes"], record["sha256"])
