"""An evaluation (`trainer.evaluation.evaluate_models`, what `worker.evaluation_job` runs) of a
job with a multi-turn `task.env` samples episodes against the job's environment: the suite's
shared warm-started builtin:tiny, a built-in tools environment in the real sandbox whose
`_reward` (reward: env) scores every episode, and nothing of it left running after."""
import pytest

from tests.support.tinyprebuild import SHARED_SEED, shared_model_dir
from tests.trainer.test_probe_env import ENV, _sandbox_or_skip, env_task, tools_tag

N, PROMPTS = 2, 2


def test_an_evaluation_of_a_tools_env_job_runs_episodes_and_leaves_nothing_running():
    from trainer.evaluation import Model, evaluate_models
    from trainer.evaluation_spec import EvaluationSpec, Picked, filled, sampling_job_spec
    from trainer.graders.sandbox.process import processes_with
    from trainer.spec import JobSpec

    _sandbox_or_skip()
    job = JobSpec.model_validate({"name": "agents", "seed": SHARED_SEED, "task": env_task(),
                                  "rollout": {"engine": "hf", "max_new_tokens": 24}})
    # The checkpoint evaluated is the shared warm-started model's folder.
    spec = filled(EvaluationSpec(checkpoints=[1], base=False, prompts=PROMPTS, n=N, k=[N], max_new_tokens=24,
                                 engine="hf"), job, "job_env", [Picked(step=1, asked=["1"])])
    sampling = sampling_job_spec(spec, job)
    tag = tools_tag(sampling)
    seen: list[str] = []

    result = evaluate_models(spec, sampling, [Model("step 1", 1, shared_model_dir())], lambda: False,
                             on_progress=lambda p: seen.extend(processes_with(tag)))

    assert seen, "no sandbox process of the evaluation's environment was ever seen"
    assert processes_with(tag) == []
    (row,) = result["models"]
    assert row["samples"] == N * PROMPTS
    env = row["env"]
    assert 1 <= env["turns_mean"] <= ENV["max_turns"] and env["errors"] == 0, env
    # Every sample's reward is the environment's (_reward's 0.375), none the verifier's 0 or 1.
    assert row["mean_reward"] == pytest.approx(0.375) and row["correct"] == [0] * PROMPTS
