"""rollout.broaden: the plateau rule on synthetic metric curves, the stage table it makes, resume."""
import math
from types import SimpleNamespace

import pytest

from trainer.checkpoints.io import TrainerState
from trainer.loop import _maybe_broaden
from trainer.algo.schedule import Plateau, broaden, plan, replan, stage_for_step, widest_samples
from trainer.spec import JobSpec

RG = {"reasoning_gym": {"name": "chain_sum"}}


def spec(steps=100, every=5, lr_batch="prompts_capped", **broaden_over):
    return JobSpec.model_validate({
        "name": "t", "task": RG, "eval": {"every": every},
        "rollout": {"schedule": [{"n": 16, "prompts_per_step": 32, "steps": steps}],
                    "broaden": {"patience": 2, "min_delta": 0.01, "factor": 4, "max_n": 512,
                                **broaden_over}},
        "optim": {"lr": 1e-4, "lr_batch": lr_batch}})


class Events:
    def __init__(self):
        self.items = []

    def event(self, type, data):
        self.items.append((type, data))


def drive(s: JobSpec, curve: list[float]) -> tuple[SimpleNamespace, Events]:
    """Feed eval values at steps 0, every, 2*every, ... to the loop's broaden hook."""
    run = SimpleNamespace(spec=s, plans=plan(s), plateau=Plateau(),
                          state=TrainerState(step=0, stage=0, data_cursor=0, ref_step=0, spec_sha256=""))
    sink = Events()
    for i, value in enumerate(curve):
        _maybe_broaden(run, sink, i * s.eval.every, {"eval/pass@1": value})
    return run, sink


def test_rising_curve_never_broadens():
    run, sink = drive(spec(), [0.1, 0.2, 0.3, 0.4, 0.5])
    assert sink.items == [] and len(run.plans) == 1


def test_plateau_broadens_after_patience_evals():
    # best 0.50 at step 10; 0.505 (step 15) and 0.49 (step 20) are not +0.01: broaden at 20.
    run, sink = drive(spec(), [0.4, 0.45, 0.50, 0.505, 0.49])
    assert [t for t, _ in sink.items] == ["broadened"]
    ev = sink.items[0][1]
    assert ev["step"] == 20 and ev["from_n"] == 16 and ev["n"] == 64 and ev["stage"] == 1
    assert "did not rise by 0.01 over 2 evaluations" in ev["reason"]
    assert [(p.n, p.first_step, p.steps) for p in run.plans] == [(16, 0, 20), (64, 20, 80)]
    assert stage_for_step(run.plans, 19).n == 16 and stage_for_step(run.plans, 20).n == 64
    assert run.state.broaden_starts == [20]


def test_broadens_up_to_max_n_then_stops():
    flat = [0.5] * 20
    run, sink = drive(spec(), flat)
    ns = [d["n"] for t, d in sink.items]
    assert ns == [64, 256, 512]  # 16 x 4 x 4 = 256, then capped at 512, then no further event
    assert [p.n for p in run.plans] == [16, 64, 256, 512]
    assert sum(p.steps for p in run.plans) == 100


def test_keep_prompts_grows_samples_and_lr_by_the_rule():
    run, _ = drive(spec(lr_batch="samples"), [0.5, 0.5, 0.5])
    first, broad = run.plans
    assert broad.prompts_per_step == 32 and broad.samples_per_step == 64 * 32
    assert broad.lr == pytest.approx(first.lr * math.sqrt(4))  # optim.lr_scaling sqrt on samples
    run, _ = drive(spec(), [0.5, 0.5, 0.5])
    assert run.plans[1].lr == pytest.approx(first.lr)  # the default cap: no more prompts, same lr


def test_keep_samples_divides_prompts_but_not_below_min_prompts():
    run, _ = drive(spec(prompts="keep_samples", min_prompts=4), [0.5] * 9)
    assert [(p.n, p.prompts_per_step) for p in run.plans] == [(16, 32), (64, 8), (256, 4), (512, 4)]
    assert run.plans[1].lr == pytest.approx(1e-4)  # same samples per step: same lr


def test_no_broadening_without_steps_left():
    run, sink = drive(spec(steps=10), [0.5, 0.5, 0.5])  # the 3rd eval is at step 10 = the end
    assert sink.items == [] and len(run.plans) == 1


def test_resume_rebuilds_the_same_plans():
    s = spec()
    run, _ = drive(s, [0.5] * 7)
    assert replan(s, run.state.broaden_starts) == run.plans
    assert widest_samples(s) == 512 * 32


def test_broaden_refuses_step_zero():
    assert broaden(spec(), plan(spec()), 0) is None
