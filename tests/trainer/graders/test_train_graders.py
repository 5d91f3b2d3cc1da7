"""Jobs rewarded by `task.grader` on builtin:tiny: the grader is the reward, its errors, time
and multi sub-rewards are step metrics, stored samples carry the sub-rewards, evaluation uses
the same grader, and a grader failing on most samples fails the job naming its error."""
import pytest

from trainer.graders.scorer import GraderErrorLimit
from trainer.sink import ListSink
from trainer.spec import JobSpec

from tests.support.tinyprebuild import SHARED_SEED, prebuild, shared_task
from tests.support.services import grader_sandbox_missing, needs_service

pytestmark = [pytest.mark.integration,
              needs_service("a grader sandbox", grader_sandbox_missing())]

ANSWER_PY = """
import re

def grade(sample, item):
    m = re.search(r"<answer>(.*?)</answer>", sample["output_text"])
    return float(m is not None and m.group(1).strip() == str(item["answer"]))
"""
MULTI = {
    "type": "multi", "name": "answer and format", "calculate_output": "0.75 * right + 0.25 * tagged",
    "graders": {
        "right": {"type": "python", "name": "right", "source": ANSWER_PY},
        "tagged": {"type": "string_check", "name": "tagged", "input": "{{ sample.output_text }}",
                   "reference": "<answer>", "operation": "like"},
    },
}


def grader_spec(grader: dict, steps: int = 2, **task) -> JobSpec:
    return JobSpec.model_validate({
        "name": "grader-test", "seed": SHARED_SEED,
        "task": shared_task(grader=grader, reward="score", **task),
        "rollout": {"engine": "hf", "max_new_tokens": 24,
                    "schedule": [{"n": 4, "prompts_per_step": 2, "steps": steps}]},
        "optim": {"lr": 1e-4},
        "algo": {"mini_batches": 1, "micro_batch_tokens": 256, "dynamic_sampling": False},
        "eval": {"every": 0, "samples_per_prompt": 2, "k": [1]},
        "checkpoint": {"every": 0, "keep_last": 1},
        "samples": {"per_step": 4},
    })


@pytest.fixture(scope="module", autouse=True)
def tiny_model():
    # One capped warm start serves every test: builtin:tiny's cache key leaves the grader out.
    prebuild(grader_spec(MULTI))


def run(spec, out):
    from trainer import train

    sink = ListSink()
    result = train(spec, sink, lambda: False, out_dir=out)
    return sink, result


TAGGED_PY = """
def grade(sample, item):
    # The item is the reasoning-gym entry: its answer is there for the grader to read.
    assert item["answer"] and item["question"]
    return float("</answer>" in sample["output_text"])
"""


def test_a_python_grader_rewards_the_job(tmp_path):
    sink, result = run(grader_spec({"type": "python", "name": "closes the tag",
                                    "source": TAGGED_PY}), tmp_path)
    assert result.steps_completed == 2
    steps = [r for r in sink.steps if r["step"] > 0]
    for row in steps:
        assert row["grader/errors"] == 0 and row["grader/timeouts"] == 0
        assert row["grader/seconds"] > 0
        assert not any(k.startswith("reward/") for k in row)
    # The warm-started tiny model writes its answer in tags: the python grader rewards that,
    # in training and in evaluation (the same grader decides what counts as correct).
    assert max(r["reward_mean"] for r in steps) > 0
    assert sink.steps[0]["eval/pass@1"] > 0


def test_a_multi_grader_logs_each_sub_reward(tmp_path):
    sink, result = run(grader_spec(MULTI), tmp_path)
    assert result.steps_completed == 2
    for row in (r for r in sink.steps if r["step"] > 0):
        assert 0 <= row["reward/right"] <= 1 and row["reward/tagged"] > 0
        # The formula over the means is the mean of the formula (it is linear); the means are
        # over graded samples, so this holds when none was truncated (ungraded).
        expected = 0.75 * row["reward/right"] + 0.25 * row["reward/tagged"]
        if row["truncated_frac"] == 0:
            assert row["reward_mean"] == pytest.approx(expected, abs=1e-5)
    rows = sink.samples_by_step[1]
    assert rows and all(set(r["sub_rewards"]) == {"right", "tagged"} for r in rows)
    for r in rows:
        if not r["truncated"]:
            want = 0.75 * r["sub_rewards"]["right"] + 0.25 * r["sub_rewards"]["tagged"]
            assert r["reward"] == pytest.approx(want, abs=1e-6)


def test_a_grader_that_keeps_failing_fails_the_job_naming_its_error(tmp_path):
    broken = {"type": "python", "name": "broken",
              "source": "def grade(sample, item):\n    raise KeyError('no_such_field')\n"}
    with pytest.raises(GraderErrorLimit) as info:
        run(grader_spec(broken, steps=4, grader_error_steps=2), tmp_path)
    message = str(info.value)
    assert "2 steps in a row" in message and "python_grader_runtime_error" in message
    assert "no_such_field" in message
