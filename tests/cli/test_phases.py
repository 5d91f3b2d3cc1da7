"""The CLI's phase line: `brorl train`'s sink wrapper and following a remote job's stream."""
from __future__ import annotations

import json

import pytest
from rich.console import Console

from cli import remote
from cli.client import SSEvent
from cli.phases import PhaseSink, PhaseStatus, phase_line
from trainer.events import EventType, Phase, PhaseProgress, UnknownEventType
from trainer.sink import JsonlSink


def test_a_phase_line_says_the_phase_its_count_and_the_message():
    assert phase_line({"phase": "warm_start", "done": 40, "total": 1200, "message": "warm start: step 40",
                       "finished": False}) == "warm start 40/1200: warm start: step 40"
    assert phase_line({"phase": "model_load", "done": 0, "total": None, "message": "loading builtin:tiny",
                       "finished": False}) == "model load: loading builtin:tiny"
    assert phase_line({"phase": "eval", "done": 64, "total": 64, "message": "evaluating at step 2",
                       "finished": True, "seconds": 3.04}) == "eval done in 3.0 s: evaluating at step 2"
    assert phase_line({"done": 32, "total": 128}) == "sampling 32/128"  # a probe's progress


def test_the_train_sink_writes_every_event_and_shows_the_phases(tmp_path):
    lines = []
    sink = PhaseSink(JsonlSink(tmp_path), lambda line, finished: lines.append((line, finished)))
    with PhaseProgress(sink).phase(Phase.engine_start, "starting the hf rollout engine"):
        pass
    sink.event(EventType.eval, {"step": 0, "eval/pass@1": 0.5})
    sink.metrics(1, {"loss": 1.0})
    written = [json.loads(x) for x in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert [e["type"] for e in written] == ["progress", "progress", "eval"]
    assert (tmp_path / "metrics.jsonl").read_text().strip() == '{"step": 1, "loss": 1.0}'
    assert [f for _, f in lines] == [False, True]
    assert lines[0][0] == "engine start: starting the hf rollout engine"
    assert lines[1][0].startswith("engine start done in ")
    with pytest.raises(UnknownEventType):
        sink.event("phase", {})


class _Client:
    """What `follow_job` asks a client for: the stream, then the metrics page and the job."""

    def __init__(self, events):
        self._events = events

    def stream_metrics(self, job_id):
        yield from self._events

    def metrics(self, job_id, after_step=None):
        return {"data": []}

    def get_job(self, job_id):
        return {"id": job_id, "status": "succeeded"}


def _progress(phase, done, total, finished=False, **extra):
    return SSEvent(None, "progress", {"type": "progress", "data": {
        "phase": phase, "done": done, "total": total, "finished": finished,
        "message": f"{phase} {done}", **extra}})


def test_following_a_job_prints_each_phase_once_then_the_steps(monkeypatch):
    console = Console(record=True, width=200, force_terminal=False)
    monkeypatch.setattr(remote, "console", console)
    events = [SSEvent(None, "status", {"status": "running", "step": 0}),
              _progress("warm_start", 0, 300), _progress("warm_start", 10, 300), _progress("warm_start", 20, 300),
              _progress("warm_start", 300, 300, finished=True, seconds=12.5),
              SSEvent("1", "metric", {"step": 1, "values": {"reward_mean": 0.25}}),
              SSEvent(None, "end", {"status": "succeeded"})]
    job = remote.follow_job(_Client(events), "job-1", poll=0)
    assert job["status"] == "succeeded"
    out = console.export_text().splitlines()
    # Not a terminal (a pipe, a log): one line as the phase starts, one as it ends.
    assert out == ["warm start 0/300: warm_start 0", "warm start done in 12.5 s: warm_start 300",
                   "step     1  reward_mean=0.25"]


def test_on_a_terminal_the_phase_is_one_updating_status_line():
    console = Console(record=True, width=120, force_terminal=True)
    with PhaseStatus(console) as line:
        line.progress({"phase": "warm_start", "done": 10, "total": 300, "message": "step 10"})
        assert line.current == "warm start 10/300: step 10"
        line.progress({"phase": "warm_start", "done": 20, "total": 300, "message": "step 20"})
        assert line.current == "warm start 20/300: step 20"
    # Rich redraws the one line in place: no update became a line of its own.
    assert "step 10\n" not in console.export_text()
