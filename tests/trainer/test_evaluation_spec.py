"""The evaluation's spec: nulls become the job's own evaluation settings, its checkpoints steps,
and the job spec it samples with keeps the job's model and seed (its eval split, builtin:tiny's
warm start) under the evaluation's task and sampling."""
from __future__ import annotations

import pytest
from pydantic import ValidationError

from trainer.evaluation_spec import EvaluationSpec, Picked, filled, sampling_job_spec
from trainer.spec import FieldError, JobSpec

JOB = JobSpec.model_validate({
    "name": "j", "seed": 5, "model": {"path": "builtin:tiny"},
    "task": {"reasoning_gym": {"name": "chain_sum", "train_size": 100, "eval_size": 10}},
    "rollout": {"engine": "hf", "max_new_tokens": 40, "schedule": [{"n": 4, "prompts_per_step": 2, "steps": 3}]},
    "eval": {"samples_per_prompt": 8, "k": [1, 4, 8], "temperature": 0.7, "top_p": 0.9},
    "continue_from": {"job": "job_01PARENT", "step": 2},
})
PICKED = [Picked(step=4, asked=["latest", "4"])]


def test_nulls_become_the_jobs_evaluation_settings():
    spec = filled(EvaluationSpec(), JOB, "job_01X", PICKED)
    assert spec.resolved and spec.checkpoints == [4] and spec.job == "job_01X"
    assert (spec.n, spec.k, spec.temperature, spec.top_p, spec.max_new_tokens, spec.engine) == \
        (8, [1, 4, 8], 0.7, 0.9, 40, "hf")
    assert spec.task == JOB.task and spec.ks() == [1, 4, 8]


def test_a_smaller_n_drops_the_jobs_k_above_it_and_given_values_win():
    spec = filled(EvaluationSpec(n=2), JOB, "job_01X", PICKED)
    assert spec.k == [1] and spec.ks() == [1]
    spec = filled(EvaluationSpec(n=16, k=[16], temperature=1.0, max_new_tokens=64, engine="auto"), JOB, "j", PICKED)
    assert (spec.ks(), spec.temperature, spec.max_new_tokens, spec.engine) == ([1, 16], 1.0, 64, "auto")


def test_what_does_not_hold_together_names_its_field():
    with pytest.raises(FieldError) as err:
        filled(EvaluationSpec(k=[16]), JOB, "j", PICKED)  # the job's n is 8
    assert err.value.path == "k"
    with pytest.raises(FieldError) as err:
        filled(EvaluationSpec(max_new_tokens=3), JOB, "j", PICKED)
    assert err.value.path == "max_new_tokens"
    with pytest.raises(ValidationError):
        EvaluationSpec(n=4, k=[8])
    with pytest.raises(ValidationError):
        EvaluationSpec(checkpoints=["newest"])
    with pytest.raises(ValidationError):
        EvaluationSpec(checkpoints=[])


def test_the_sampling_job_spec_keeps_the_jobs_model_and_seed():
    spec = filled(EvaluationSpec(n=4, k=[2], temperature=0.3,
                                 task={"reasoning_gym": {"name": "basic_arithmetic", "eval_size": 7}}),
                  JOB, "j", PICKED)
    sampling = sampling_job_spec(spec, JOB)
    assert sampling.seed == 5 and sampling.model == JOB.model
    assert sampling.task.reasoning_gym.name == "basic_arithmetic"
    assert (sampling.eval.samples_per_prompt, sampling.eval.k, sampling.eval.temperature) == (4, [1, 2], 0.3)
    assert sampling.continue_from is None  # the evaluation loads the folders it resolved
