"""GraderScorer: a grader behind the trainer's Scorer interface, and the step's metrics."""
from __future__ import annotations

import pytest

from trainer.graders.scorer import GraderScorer, example_item, step_metrics
from trainer.tasks.base import Example
from tests.support.services import grader_sandbox_missing, needs_service

EXACT = {"type": "string_check", "name": "exact", "input": "{{ sample.output_text }}",
         "reference": "{{ item.answer }}", "operation": "eq"}
MULTI = {"type": "multi", "name": "m", "calculate_output": "0.5 * exact + 0.5 * unit",
         "graders": {"exact": EXACT,
                     "unit": {"type": "string_check", "name": "unit", "operation": "like",
                              "input": "{{ sample.output_text }}", "reference": "{{ item.unit }}"}}}


def test_item_is_the_dataset_row():
    ex = Example("2+2?", "4", {"unit": "apples", "tests": [1]})
    assert example_item(ex) == {"prompt": "2+2?", "question": "2+2?", "answer": "4",
                                "unit": "apples", "tests": [1]}


def test_scores_like_the_scorer_and_reports_sub_rewards():
    examples = [Example("q", "4", {"unit": "4"}), Example("q", "5", {"unit": "5"}),
                Example("q", "4", {"unit": "4"})]
    with GraderScorer(MULTI, reward="score", truncated_reward=-1.0) as scorer:
        result = scorer.score(["4", "5x", "4"], examples, [False, False, True])
        assert result.scores == [1.0, 0.5, 0.0]
        assert result.rewards == [1.0, 0.5, -1.0]
        assert result.correct == [True, False, False]
        assert (result.errors, result.timeouts) == (0, 0)
        metrics = step_metrics(scorer.last_results)
    assert metrics["reward/exact"] == 0.5 and metrics["reward/unit"] == 1.0
    assert metrics["grader/errors"] == 0.0 and 0.0 < metrics["grader/seconds"] < 60.0


def test_binary_reward():
    with GraderScorer(MULTI, reward="binary") as scorer:
        result = scorer.score(["4", "5x"], [Example("q", "4", {"unit": "4"}),
                                            Example("q", "5", {"unit": "5"})])
    assert result.rewards == [1.0, 0.0]


@needs_service("a grader sandbox", grader_sandbox_missing())
def test_errors_and_timeouts_are_counted():
    grader = {"type": "python", "name": "p",
              "source": "import time\ndef grade(sample, item):\n"
                        "    if sample['output_text'] == 'slow': time.sleep(60)\n"
                        "    if sample['output_text'] == 'bad': raise ValueError('x')\n"
                        "    return 1.0\n"}
    with GraderScorer(grader, timeout_s=1.0) as scorer:
        result = scorer.score(["ok", "slow", "bad"], [Example("q", "a")] * 3)
        metrics = step_metrics(scorer.last_results)
    assert result.scores == [1.0, 0.0, 0.0] and (result.errors, result.timeouts) == (2, 1)
    assert metrics["grader/errors"] == 2.0 and metrics["grader/timeouts"] == 1.0


@pytest.mark.timeout(120)
def test_builtin_verifiers_are_graders():
    from trainer.graders import grade_batch

    texts = ["<answer>4</answer>", "<answer>4.0000000001</answer>", "no answer", "<answer>5</answer>"]
    items = [{"answer": "4"}] * 4
    assert [r.reward for r in grade_batch({"type": "verifier", "name": "numeric"}, texts, items)] \
        == [1.0, 1.0, 0.0, 0.0]
    assert [r.reward for r in grade_batch({"type": "verifier", "name": "exact"}, texts, items)] \
        == [1.0, 0.0, 0.0, 0.0]
    multi = {"type": "multi", "name": "m", "calculate_output": "exact + 0.5 * numeric",
             "graders": {"exact": {"type": "verifier", "name": "exact"},
                         "numeric": {"type": "verifier", "name": "numeric"}}}
    assert [r.reward for r in grade_batch(multi, texts[:2], items[:2])] == [1.5, 0.5]


def test_reasoning_gym_verifier_needs_its_task():
    from pydantic import ValidationError

    from trainer.graders import parse_grader

    with pytest.raises(ValidationError, match="task"):
        parse_grader({"type": "verifier", "name": "reasoning_gym"})
    with pytest.raises(ValidationError, match="(?s)task.*not a reasoning-gym dataset"):
        parse_grader({"type": "verifier", "name": "reasoning_gym", "task": ""})
    assert parse_grader({"type": "verifier", "name": "reasoning_gym", "task": "chain_sum"}).task
    from trainer.graders import grade_batch

    bad_config = {"type": "verifier", "name": "reasoning_gym", "task": "chain_sum",
                  "config": {"no_such_option": 1}}
    result = grade_batch(bad_config, ["<answer>1</answer>"], [{"answer": "1"}])[0]
    assert result.errors["other_error"] and "could not be built" in result.details


@pytest.mark.timeout(120)
def test_reasoning_gym_scorer_as_a_grader():
    import reasoning_gym

    from trainer.graders import grade_batch

    entry = reasoning_gym.create_dataset("chain_sum", size=1, seed=3)[0]
    item = {**entry, "answer": entry["answer"]}
    grader = {"type": "verifier", "name": "reasoning_gym", "task": "chain_sum", "config": {}}
    right, wrong = grade_batch(grader, [f"<answer>{entry['answer']}</answer>",
                                        "<answer>-123456</answer>"], [item, item])
    assert (right.reward, wrong.reward) == (1.0, 0.0) and not right.failed


@pytest.mark.timeout(60)
@needs_service("a grader sandbox", grader_sandbox_missing())
def test_a_stop_reaches_a_batch_that_is_still_grading():
    """A cancel or the wall limit while a step's samples are in the sandbox: the job's stop
    check kills the batch within a second (it used to wait for the whole batch)."""
    import time

    from trainer.stop import StopRequested, stop_check

    slow = {"type": "python", "name": "slow",
            "source": "import time\ndef grade(sample, item):\n    time.sleep(60)\n    return 1.0\n"}
    asked = time.monotonic() + 0.5
    with GraderScorer(slow, stop_check=stop_check(lambda: time.monotonic() > asked)) as scorer:
        with pytest.raises(StopRequested):
            scorer.score(["x"] * 4, [Example("q", "a")] * 4)
    assert time.monotonic() - asked < 2.5
