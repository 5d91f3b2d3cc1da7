"""The job event vocabulary, one definition: the trainer emits these types, the store keeps
them (`store.tables.JobEvent.type`), the API and the dashboard show them.

`EventType` is a `str` enum: a member is its value wherever a string goes (JSON, the
database column, comparisons with "eval"). A type outside it is a programming error: every
sink raises `UnknownEventType` rather than dropping the event.

`progress` events say where a long phase of a job is (`Phase`): `PhaseProgress` writes them,
at most one per `MIN_INTERVAL_S` per phase besides each phase's first and last, so a phase
that reports often does not flood the events table. Their data:
  {"phase", "message", "done", "total" (null when unknown), "finished": bool,
   "seconds" (on the last one)}, plus what the caller adds (an evaluation's `step`).
A probe's sampling progress (`worker.probe_job`) is a `progress` event too, without a phase.
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from enum import StrEnum
from typing import Any, Callable, Iterator, Protocol


class EventType(StrEnum):
    created = "created"
    started = "started"
    stage_started = "stage_started"
    checkpoint_saved = "checkpoint_saved"
    eval = "eval"
    retried = "retried"
    cancel_requested = "cancel_requested"
    cancelled = "cancelled"
    failed = "failed"
    succeeded = "succeeded"
    warning = "warning"      # what the user must know: a job cannot learn (trainer.loop.stall_reason), it runs on fewer nodes
    broadened = "broadened"  # rollout.broaden started a wider stage on a plateau (trainer.loop)
    progress = "progress"    # a long phase's progress (`Phase`), or a probe's samples done of its total
    broaden_skipped = "broaden_skipped"  # rollout.broaden trigger probe found too little to broaden for
    pause_requested = "pause_requested"  # a running job stops as for a cancel, then `paused`
    paused = "paused"
    resumed = "resumed"    # a paused job queued again; the next attempt resumes its checkpoint


class Phase(StrEnum):
    """The phases of a job that can take more than a few seconds, in the order a job meets them."""

    launch = "launch"              # a launcher starting ranks, or waiting for machines
    task = "task"                  # the task's examples built (a dataset read, a generator run)
    warm_start = "warm_start"      # builtin:tiny built and warm-started (once: then cached)
    model_load = "model_load"      # the policy (and reference) loaded, a checkpoint restored
    engine_start = "engine_start"  # the rollout engine started (vLLM allocates and compiles here)
    eval = "eval"                  # an evaluation over the eval split


class UnknownEventType(ValueError):
    """An event type that is not an `EventType` (a typo, or a type never added to the enum)."""


def event_type(value: EventType | str) -> EventType:
    """`value` as an `EventType`; `UnknownEventType` naming it and the known ones otherwise."""
    try:
        return EventType(value)
    except ValueError:
        raise UnknownEventType(f"unknown event type {value!r}; the types are: "
                               f"{', '.join(t.value for t in EventType)} (trainer.events.EventType)") from None


class EventSink(Protocol):
    def event(self, type: EventType, data: dict[str, Any]) -> None: ...


# The most often one phase writes a progress event (its first and last always go out).
MIN_INTERVAL_S = 1.0
Report = Callable[[int, int | None, str], None]  # (done, total, message)


class PhaseProgress:
    """Writes `progress` events for the phases of one run into `sink`, rate-limited per phase."""

    def __init__(self, sink: EventSink, min_interval_s: float = MIN_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._sink, self._min, self._clock = sink, min_interval_s, clock

    @contextmanager
    def phase(self, phase: Phase, message: str, total: int | None = None, *, lazy: bool = False,
              **data: Any) -> Iterator[Report]:
        """A phase around the `with` body, which may call the yielded `report(done, total,
        message)` as often as it likes. `lazy`: the phase is announced only once the body
        reports (a cached build that returns at once writes nothing). A body that raises ends
        the phase without a last event: the job's own outcome says what happened."""
        t0 = self._clock()
        state = {"started": False, "last": float("-inf"), "done": 0, "total": total, "message": message}

        def emit(finished: bool, **extra: Any) -> None:
            self._sink.event(EventType.progress, {
                "phase": Phase(phase).value, "message": state["message"], "done": state["done"],
                "total": state["total"], "finished": finished, **data, **extra})
            state["last"], state["started"] = self._clock(), True

        def report(done: int, total_now: int | None, text: str) -> None:
            state.update(done=int(done), total=total_now if total_now is not None else state["total"],
                         message=text)
            if not state["started"] or self._clock() - state["last"] >= self._min:
                emit(False)

        if not lazy:
            emit(False)
        yield report
        if state["started"]:
            if state["total"] is not None:
                state["done"] = state["total"]
            emit(True, seconds=round(self._clock() - t0, 3))


class _NoSink:
    def event(self, type: EventType, data: dict[str, Any]) -> None:
        event_type(type)


def no_progress() -> PhaseProgress:
    """A `PhaseProgress` that reports to nothing (a benchmark's, a test's `build_run`)."""
    return PhaseProgress(_NoSink())
