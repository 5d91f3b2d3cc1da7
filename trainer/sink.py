"""Where metrics and events go; the trainer never learns which (ARCHITECTURE.md rule 5).

A sink gets one `metrics(step, values)` call per step and `event(type, data)` calls at stage
boundaries, evaluations and checkpoints. The worker supplies a database sink; the CLI a
JSONL one; tests a list.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Protocol


class MetricsSink(Protocol):
    def metrics(self, step: int, values: dict[str, Any]) -> None: ...
    def event(self, type: str, data: dict[str, Any]) -> None: ...
    def checkpoint(self, step: int, path: Path, nbytes: int, sha256: str) -> None: ...


class ListSink:
    """Keeps everything in memory, for tests."""

    def __init__(self) -> None:
        self.steps: list[dict[str, Any]] = []
        self.events: list[tuple[str, dict[str, Any]]] = []
        self.checkpoints: list[tuple[int, Path, int, str]] = []

    def metrics(self, step, values):
        self.steps.append({"step": step, **values})

    def event(self, type, data):
        self.events.append((type, data))

    def checkpoint(self, step, path, nbytes, sha256):
        self.checkpoints.append((step, Path(path), nbytes, sha256))


class JsonlSink:
    """Appends one JSON line per step to a file (and events to a second one)."""

    def __init__(self, out_dir: Path) -> None:
        out_dir.mkdir(parents=True, exist_ok=True)
        self._metrics = open(out_dir / "metrics.jsonl", "a", buffering=1)
        self._events = open(out_dir / "events.jsonl", "a", buffering=1)

    def metrics(self, step, values):
        self._metrics.write(json.dumps({"step": step, **values}) + "\n")

    def event(self, type, data):
        self._events.write(json.dumps({"type": type, **data}) + "\n")

    def checkpoint(self, step, path, nbytes, sha256):
        self.event("checkpoint_saved", {"step": step, "path": str(path), "bytes": nbytes, "sha256": sha256})

