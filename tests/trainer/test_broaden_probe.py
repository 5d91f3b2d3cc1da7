"""rollout.broaden with `trigger: probe` on two constructed plateaus: the probe of the plateaued
policy decides. Many prompts all-wrong at the stage's n yet solved within probe_n: broaden, with
the probe's figures in the `broadened` event. Nothing of the kind: no broadening, a
`broaden_skipped` event, and another look only after `patience` more evaluations."""
import pytest
from pydantic import ValidationError

from tests.trainer.test_broaden import drive, spec
from trainer import loop
from trainer.algo.probe_stats import decision_figures

PROBE_N = 512


@pytest.fixture
def probes(monkeypatch):
    """The probe of each plateau returns figures of constructed counts; records each call."""
    calls = []

    def fake(counts):
        def probe_current(run, step, at_n):
            calls.append((step, at_n))
            return {**decision_figures(counts, PROBE_N, at_n), "truncated_frac": 0.0, "seconds": 0.0}
        monkeypatch.setattr(loop, "_probe_current", probe_current)
        return calls
    return fake


def probe_spec(**over):
    return spec(trigger="probe", probe_n=PROBE_N, min_solvable=0.10, **over)


def test_plateau_with_solvable_all_wrong_prompts_broadens(probes):
    calls = probes([2] * 16 + [300] * 16)  # half the prompts: ~6 % pass@16 each, solved within 512
    run, sink = drive(probe_spec(), [0.4, 0.45, 0.50, 0.505, 0.49])
    assert calls == [(20, 16)]  # probed once, at the plateau, against the stage's n
    assert [t for t, _ in sink.items] == ["broadened"]
    ev = sink.items[0][1]
    assert ev["n"] == 64 and ev["probe"]["solvable_all_wrong"] > 0.4 and ev["probe"]["n"] == PROBE_N
    assert "the probe found" in ev["reason"]
    assert [(p.n, p.first_step) for p in run.plans] == [(16, 0), (64, 20)]


def test_plateau_without_them_does_not_broaden(probes):
    calls = probes([200] * 24 + [0] * 8)  # solved often or never: a flat curve past 16
    run, sink = drive(probe_spec(), [0.4, 0.45, 0.50, 0.505, 0.49, 0.50, 0.50])
    assert [t for t, _ in sink.items] == ["broaden_skipped", "broaden_skipped"]
    assert calls == [(20, 16), (30, 16)]  # looked again after `patience` (2) more evaluations
    assert sink.items[0][1]["probe"]["solvable_all_wrong"] < 0.01
    assert len(run.plans) == 1 and run.state.broaden_starts == []


def test_probe_n_must_see_past_max_n():
    with pytest.raises(ValidationError, match="probe_n"):
        spec(trigger="probe", probe_n=256, max_n=512)
