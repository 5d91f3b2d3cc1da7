"""The reward-gaming warning: training reward up while eval pass@1 falls, over a window."""
from types import SimpleNamespace

from trainer.algo.gaming import GamingWatch
from trainer.loop import _check_gaming
from trainer.sink import ListSink
from trainer.spec import JobSpec


def _feed(watch, curve, window=3, delta=0.02):
    """curve: (train reward mean of the two steps before, eval pass@1) per evaluation."""
    out = []
    for i, (reward, pass1) in enumerate(curve):
        watch.step(reward)
        watch.step(reward)
        out.append(watch.evaluation(2 * (i + 1), pass1, window, delta))
    return out


def test_warns_once_when_reward_rises_and_eval_falls_over_the_window():
    warnings = _feed(GamingWatch(), [(0.2, 0.5), (0.3, 0.45), (0.4, 0.4), (0.5, 0.35), (0.6, 0.30)])
    assert warnings[:3] == [None, None, None]
    assert "rose from 0.200 to 0.500" in warnings[3] and "fell from 0.500 to 0.350" in warnings[3]
    assert warnings[4] is None  # forgotten after warning: the next needs a new window


def test_no_warning_when_both_rise_or_moves_are_small_or_disabled():
    assert _feed(GamingWatch(), [(0.2, 0.3), (0.3, 0.35), (0.4, 0.4), (0.5, 0.45)]) == [None] * 4
    assert _feed(GamingWatch(), [(0.2, 0.5), (0.205, 0.499), (0.21, 0.498), (0.215, 0.497)]) == [None] * 4
    falling = [(0.2, 0.5), (0.3, 0.45), (0.4, 0.4), (0.5, 0.35)]
    assert _feed(GamingWatch(), falling, window=0) == [None] * 4


def test_the_loop_emits_a_warning_event():
    spec = JobSpec.model_validate({"name": "t", "task": {"reasoning_gym": {"name": "chain_sum"}},
                                   "eval": {"gaming_window": 1, "gaming_min_delta": 0.05}})
    run, sink = SimpleNamespace(spec=spec, gaming=GamingWatch()), ListSink()
    _check_gaming(run, sink, 1, {"reward_mean": 0.1}, {"eval/pass@1": 0.6})
    _check_gaming(run, sink, 2, {"reward_mean": 0.3}, None)
    _check_gaming(run, sink, 3, {"reward_mean": 0.3}, {"eval/pass@1": 0.4, "eval/pass@4": 0.7})
    assert [(t, d["step"]) for t, d in sink.events] == [("warning", 3)]
    assert "may be gamed" in sink.events[0][1]["message"]
