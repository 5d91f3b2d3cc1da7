"""The broadening schedule and the LR scaling rules."""
import math

import pytest

from trainer.algo.schedule import lr_at, plan, scaled_lr, stage_for_step
from trainer.spec import JobSpec

RG = {"reasoning_gym": {"name": "chain_sum"}}


def spec(rule="sqrt", warmup=0, batch="samples"):
    return JobSpec.model_validate({
        "name": "t", "task": RG,
        "rollout": {"schedule": [{"n": 16, "prompts_per_step": 512, "steps": 3},
                                 {"n": 512, "prompts_per_step": 128, "steps": 2}]},
        "optim": {"lr": 1e-6, "lr_scaling": rule, "warmup_steps": warmup, "lr_batch": batch}})


def test_paper_sqrt_rule():
    # 512x16 -> 128x512 is 8x the samples: the lr grows sqrt(8) ~ 2.83x (the paper's rule).
    p = plan(spec())
    assert p[1].samples_per_step / p[0].samples_per_step == 8
    assert p[1].lr / p[0].lr == pytest.approx(math.sqrt(8))
    assert p[0].lr == 1e-6 and p[1].first_step == 3


@pytest.mark.parametrize("rule, ratio", [("linear", 8.0), ("none", 1.0)])
def test_other_rules(rule, ratio):
    p = plan(spec(rule))
    assert p[1].lr / p[0].lr == pytest.approx(ratio)
    assert scaled_lr(2.0, 4, 1, rule) == pytest.approx(2.0 * (4.0 if rule == "linear" else 1.0))


def test_stage_lookup_and_warmup():
    p = plan(spec(warmup=2))
    assert [stage_for_step(p, s).index for s in range(5)] == [0, 0, 0, 1, 1]
    with pytest.raises(IndexError):
        stage_for_step(p, 5)
    assert lr_at(p, 0, 2) == pytest.approx(0.5e-6) and lr_at(p, 1, 2) == pytest.approx(1e-6)
    assert lr_at(p, 4, 2) == pytest.approx(1e-6 * math.sqrt(8))


def test_stage_warning_flags_few_prompts_per_update():
    from trainer.algo.schedule import stage_warning

    def plans(p0, p1):
        return plan(JobSpec.model_validate({
            "name": "t", "task": RG, "rollout": {"schedule": [{"n": 16, "prompts_per_step": p0, "steps": 1},
                                                              {"n": 128, "prompts_per_step": p1, "steps": 1}]}}))
    issue = plans(16, 4)  # the issue's demo-shaped spec
    assert stage_warning(issue, issue[0]) is None
    assert "4 prompts per step, 4x fewer than stage 0" in stage_warning(issue, issue[1])
    kept = plans(16, 16)
    assert stage_warning(kept, kept[1]) is None  # prompts kept
    paper = plans(512, 128)  # the paper's 512 -> 128: still many prompts per update
    assert stage_warning(paper, paper[1]) is None


def test_default_caps_the_lr_at_the_growth_of_prompts():
    # prompts_capped: 512x16 -> 128x512 has fewer prompts, so the lr does not grow (samples: 2.83x).
    p = plan(spec(batch="prompts_capped"))
    assert p[1].lr == pytest.approx(p[0].lr)
    # The issue's demo-shaped spec: 16x16 -> 128x4 kept lr 1e-4 instead of 1.41e-4.
    s = JobSpec.model_validate({"name": "t", "task": RG, "optim": {"lr": 1e-4},
                                "rollout": {"schedule": [{"n": 16, "prompts_per_step": 16, "steps": 1},
                                                         {"n": 128, "prompts_per_step": 4, "steps": 1},
                                                         {"n": 32, "prompts_per_step": 64, "steps": 1}]}})
    assert s.optim.lr_batch == "prompts_capped"
    lrs = [q.lr for q in plan(s)]
    assert lrs[1] == pytest.approx(1e-4)
    assert lrs[2] == pytest.approx(1e-4 * math.sqrt(4))  # 4x prompts, 8x samples: capped at 4x
    assert scaled_lr(1.0, 8, 2, "linear", prompts=1, base_prompts=2) == pytest.approx(1.0)
    assert scaled_lr(1.0, 1, 2, "linear", prompts=1, base_prompts=2) == pytest.approx(0.5)
