"""A job's long phases (warm start, model load, engine start, evaluation) as one status line,
for `brorl train` (the local sink's events) and for following a remote job (the stream's
`progress` events). The events are `trainer.events`' `progress` kind."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from rich.console import Console

from trainer.events import EventType, event_type


def phase_line(data: dict[str, Any]) -> str:
    """One line for a `progress` event's data: phase, done/total when known, the message."""
    phase = str(data.get("phase") or "sampling").replace("_", " ")  # a probe's has no phase
    done, total = data.get("done"), data.get("total")
    count = f" {done}/{total}" if total else ""
    message = str(data.get("message") or "")
    if data.get("finished"):
        seconds = data.get("seconds")
        took = f" in {seconds:.1f} s" if isinstance(seconds, (int, float)) else ""
        return f"{phase} done{took}" + (f": {message}" if message else "")
    return f"{phase}{count}" + (f": {message}" if message else "")


class PhaseSink:
    """Passes every call on to `inner` (the JSONL sink); a `progress` event's line also goes to
    `on_phase(line, finished)`."""

    def __init__(self, inner: Any, on_phase: Callable[[str, bool], None]) -> None:
        self._inner, self._on_phase = inner, on_phase

    def event(self, type: EventType | str, data: dict[str, Any]) -> None:
        self._inner.event(type, data)
        if event_type(type) == EventType.progress:
            self._on_phase(phase_line(data), bool(data.get("finished")))

    def metrics(self, step: int, values: dict[str, Any]) -> None:
        self._inner.metrics(step, values)

    def checkpoint(self, step: int, path: Path, nbytes: int, sha256: str) -> None:
        self._inner.checkpoint(step, path, nbytes, sha256)

    def samples(self, step: int, rows: list[dict[str, Any]]) -> None:
        self._inner.samples(step, rows)


class PhaseStatus:
    """The line while following a job: on a terminal one status line that updates in place
    (rich's spinner); elsewhere (a pipe, a CI log) one printed line per phase start and end."""

    def __init__(self, console: Console) -> None:
        self._console = console
        self.current = "waiting for the job to start"  # what the line says now
        self._status = console.status(self.current) if console.is_terminal else None
        self._phase: str | None = None  # the phase whose start was printed (not on a terminal)

    def __enter__(self) -> "PhaseStatus":
        if self._status is not None:
            self._status.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._status is not None:
            self._status.stop()

    def progress(self, data: dict[str, Any]) -> None:
        line, finished = phase_line(data), bool(data.get("finished"))
        self.current = line
        if self._status is not None:
            self._status.update(line)
            return
        phase = data.get("phase")
        if finished or phase != self._phase:  # not every update: a log gets one line a phase
            self._console.print(line, highlight=False, markup=False)
            self._phase = None if finished else phase

    def text(self, line: str) -> None:
        """Anything else the line should say (the job's status, the step it is at)."""
        self.current = line
        if self._status is not None:
            self._status.update(line)
