"""The event vocabulary: one enum the trainer emits and the store keeps, sinks that refuse any
other type, and the rate-limited `progress` events of long phases."""
from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from trainer.events import EventType, Phase, PhaseProgress, UnknownEventType, event_type
from trainer.sink import JsonlSink, ListSink, NullSink, RecordSink, replay

TRAINER = Path(__file__).resolve().parents[2] / "trainer"


def test_the_store_keeps_the_trainer_s_enum_with_the_column_s_values():
    from store.tables import EventType as StoredType, JobEvent

    assert StoredType is EventType
    column = JobEvent.__table__.c.type.type
    assert list(column.enums) == [t.value for t in EventType]
    # The values the column held before the enum moved here: a changed one needs a migration.
    assert {t.value for t in EventType} == {
        "created", "started", "stage_started", "checkpoint_saved", "eval", "retried",
        "cancel_requested", "cancelled", "failed", "succeeded", "warning", "broadened", "progress",
        "broaden_skipped", "pause_requested", "paused", "resumed"}


@pytest.mark.parametrize("make", [ListSink, NullSink, lambda tmp: JsonlSink(tmp),
                                  lambda tmp: RecordSink(tmp / "record.jsonl")],
                         ids=["list", "null", "jsonl", "record"])
def test_every_sink_raises_on_an_unknown_event_type(make, tmp_path):
    sink = make(tmp_path) if make not in (ListSink, NullSink) else make()
    with pytest.raises(UnknownEventType, match=r"'evals'.*eval"):
        sink.event("evals", {"step": 1})
    sink.event("eval", {"step": 1})  # a known type given as its string is accepted
    sink.event(EventType.warning, {"message": "m"})


def test_events_keep_their_values_through_json_and_the_rank_relay(tmp_path):
    JsonlSink(tmp_path).event(EventType.eval, {"step": 2})
    assert json.loads((tmp_path / "events.jsonl").read_text()) == {"type": "eval", "step": 2}
    RecordSink(tmp_path / "r.jsonl").event(EventType.progress, {"phase": "eval"})
    out = ListSink()
    replay(json.loads((tmp_path / "r.jsonl").read_text()), out)
    assert out.events == [(EventType.progress, {"phase": "eval"})] and out.events[0][0] == "progress"
    with pytest.raises(UnknownEventType):
        replay({"call": "event", "type": "ranks_started", "data": {}}, out)


def _event_calls(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "event":
            yield node


def test_every_event_the_trainer_emits_names_an_enum_member():
    # Forwarders (a sink passing on its caller's type, the rank relay) are the only calls
    # whose type is not written out; everything else names `EventType.<member>`.
    forwarders = {("sink.py", "replay")}
    seen, checked = set(), 0
    for path in sorted(TRAINER.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for fn in [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]:
            for call in _event_calls(fn):
                first = call.args[0] if call.args else None
                where = f"{path.relative_to(TRAINER)}:{call.lineno}"
                if (path.name, fn.name) in forwarders and not isinstance(first, ast.Attribute):
                    continue
                assert isinstance(first, ast.Attribute) and isinstance(first.value, ast.Name) \
                    and first.value.id == "EventType", f"{where}: the event type is not EventType.<member>"
                assert first.attr in EventType.__members__, f"{where}: EventType has no {first.attr}"
                seen.add(first.attr)
                checked += 1
    # The walk really found the trainer's events (a renamed sink method would find none).
    assert checked >= 10 and {"eval", "warning", "stage_started", "broadened", "progress"} <= seen


def test_every_phase_the_trainer_reports_is_a_phase_member():
    for path in sorted(TRAINER.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "phase":
                first = node.args[0]
                assert isinstance(first, ast.Attribute) and isinstance(first.value, ast.Name) \
                    and first.value.id == "Phase" and first.attr in Phase.__members__, f"{path.name}:{node.lineno}"


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_phase_reports_its_start_its_end_and_at_most_one_update_a_second():
    sink, clock = ListSink(), _Clock()
    progress = PhaseProgress(sink, min_interval_s=1.0, clock=clock)
    with progress.phase(Phase.warm_start, "warm start", total=100, step=0) as report:
        for done in range(1, 13):  # 12 reports over 3 s: 0.25 s apart
            clock.now += 0.25
            report(done, 100, f"step {done}")
    data = [d for t, d in sink.events]
    assert all(t == EventType.progress for t, _ in sink.events)
    assert [d["done"] for d in data] == [0, 4, 8, 12, 100]  # start, one a second, the end
    assert data[0] == {"phase": "warm_start", "message": "warm start", "done": 0, "total": 100,
                       "finished": False, "step": 0}
    assert data[-1]["finished"] and data[-1]["message"] == "step 12" and data[-1]["seconds"] == pytest.approx(3.0)
    assert not any(d["finished"] for d in data[:-1])


def test_phases_are_limited_each_on_its_own_and_a_lazy_one_only_once_it_reports():
    sink, clock = ListSink(), _Clock()
    progress = PhaseProgress(sink, clock=clock)
    with progress.phase(Phase.warm_start, "cached", lazy=True):
        pass  # a cached build: nothing to say
    assert sink.events == []
    with progress.phase(Phase.task, "task") as task_report:
        with progress.phase(Phase.eval, "eval") as eval_report:
            clock.now += 0.5
            eval_report(1, 2, "eval")  # eval's own clock: its start was 0.5 s ago
            task_report(1, None, "task")
    phases = [(d["phase"], d["done"], d["finished"]) for _, d in sink.events]
    # Each update came 0.5 s after its phase's start: dropped; the ends carry what was reported.
    assert phases == [("task", 0, False), ("eval", 0, False), ("eval", 2, True), ("task", 1, True)]


def test_a_phase_that_raises_writes_no_last_event():
    sink = ListSink()
    with pytest.raises(RuntimeError):
        with PhaseProgress(sink).phase(Phase.model_load, "loading"):
            raise RuntimeError("no such model")
    assert [d["finished"] for _, d in sink.events] == [False]


def test_the_tiny_warm_start_reports_its_phase_and_a_cached_model_does_not(monkeypatch, tmp_path):
    from trainer.run import prepare_tiny_model
    from trainer.spec import JobSpec

    monkeypatch.setenv("BRORL_CACHE_DIR", str(tmp_path))
    spec = JobSpec.model_validate({"name": "w", "seed": 3, "task": {"reasoning_gym": {
        "name": "chain_sum", "train_size": 40, "eval_size": 4,
        "config": {"min_terms": 2, "max_terms": 2, "max_digits": 1}}}})
    first, again = ListSink(), ListSink()
    prepare_tiny_model(spec, None, progress=PhaseProgress(first), max_sft_steps=3)
    warm = [d for _, d in first.events if d["phase"] == "warm_start"]
    assert warm[0]["done"] == 0 and warm[0]["total"] == 3 and not warm[0]["finished"]
    assert warm[-1]["finished"] and warm[-1]["done"] == 3 and "warm start done" in warm[-1]["message"]
    assert [d["phase"] for _, d in first.events][0] == "task"
    prepare_tiny_model(spec, None, progress=PhaseProgress(again), max_sft_steps=3)
    assert [d["phase"] for _, d in again.events] == ["task", "task"]  # found in the cache


def test_event_type_names_the_known_types():
    with pytest.raises(UnknownEventType) as e:
        event_type("ranks_started")
    assert "progress" in str(e.value) and isinstance(e.value, ValueError)
