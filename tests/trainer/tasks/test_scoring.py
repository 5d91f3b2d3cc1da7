"""The Scorer: rewards, truncation, and a pool that survives hanging and crashing verifiers."""
from __future__ import annotations

import os
import signal
import time

import pytest

from trainer.spec import ReasoningGymTask
from trainer.tasks import reasoning_gym_task
from trainer.tasks.base import Example, Task, VerifierSpec
from trainer.tasks.scoring import Scorer
from trainer.tasks.scoring_worker import OK, get_verifier, score_item


def graded(extracted: str, answer: str, payload: dict) -> float:
    """A test verifier with partial credit, and misbehaviour on request."""
    if extracted == "sleep":  # a pure-Python hang: the in-worker timer stops it
        time.sleep(10_000)
    if extracted == "block":  # a hang the timer cannot stop (like one inside C code)
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
        time.sleep(10_000)
    if extracted == "exit":
        os._exit(3)
    if extracted == "raise":
        raise RuntimeError("verifier bug")
    if extracted == "nan":
        return float("nan")
    if extracted == "half":
        return 0.5
    return float(extracted == answer)


GRADED = Task("graded", [], [], VerifierSpec.of("callable", ref=f"{__name__}:graded"))
EX = Example("q", "7")


def _tagged(*answers: str) -> list[str]:
    return [f"<answer>{a}</answer>" for a in answers]


@pytest.fixture(scope="module")
def pool_scorer():
    with Scorer(GRADED, workers=2, timeout_s=0.5, grace_s=1.0) as scorer:
        yield scorer


def test_binary_and_score_rewards():
    completions = _tagged("7", "half", "3") + ["no tag"]
    binary = Scorer(GRADED, reward="binary", workers=0).score(completions, [EX] * 4, [False] * 4)
    assert binary.rewards == [1.0, 0.0, 0.0, 0.0]
    assert binary.scores == [1.0, 0.5, 0.0, 0.0]
    assert binary.correct == [True, False, False, False]
    graded_ = Scorer(GRADED, reward="score", workers=0).score(completions, [EX] * 4, [False] * 4)
    assert graded_.rewards == [1.0, 0.5, 0.0, 0.0]
    assert graded_.timeouts == graded_.errors == 0


def test_truncated_samples_get_the_truncated_reward():
    scorer = Scorer(GRADED, reward="score", truncated_reward=-0.5, workers=0)
    res = scorer.score(_tagged("7", "7", "exit"), [EX] * 3, [False, True, True])  # "exit" is never run
    assert res.rewards == [1.0, -0.5, -0.5]
    assert res.correct == [True, False, False]
    assert res.scores == [1.0, 0.0, 0.0]


def test_mismatched_lengths_are_refused():
    with pytest.raises(ValueError):
        Scorer(GRADED, workers=0).score(_tagged("7"), [EX, EX], [False])


def test_bad_scores_are_errors_and_clamped():
    verifier = get_verifier(GRADED.verifier_spec)
    assert score_item(verifier, ("<answer>nan</answer>", "7", {}), None) == (0.0, 2)
    assert score_item(lambda e, a, p: 3.0, ("<answer>1</answer>", "7", {}), None) == (1.0, OK)


def test_hang_and_crash_score_zero_and_are_counted(pool_scorer):
    answers = ["7"] * 60
    answers[3], answers[25], answers[40], answers[50] = "sleep", "exit", "raise", "half"
    res = pool_scorer.score(_tagged(*answers), [EX] * 60, [False] * 60)
    bad = {3, 25, 40, 50}
    assert [i for i, s in enumerate(res.scores) if s != 1.0] == sorted(bad)
    assert res.scores[50] == 0.5
    assert (res.timeouts, res.errors) == (1, 2)
    # the pool recovered: the next call is clean
    again = pool_scorer.score(_tagged("7", "3", "7"), [EX] * 3, [False] * 3)
    assert again.rewards == [1.0, 0.0, 1.0] and again.timeouts == again.errors == 0


def test_hang_the_timer_cannot_stop_is_killed(pool_scorer):
    answers = ["7"] * 20
    answers[11] = "block"
    res = pool_scorer.score(_tagged(*answers), [EX] * 20, [False] * 20)
    assert [i for i, c in enumerate(res.correct) if not c] == [11]
    assert (res.timeouts, res.errors) == (1, 0)
    assert pool_scorer.score(_tagged("7"), [EX], [False]).rewards == [1.0]


def test_chain_sum_throughput():
    spec = ReasoningGymTask(name="chain_sum", config={"min_terms": 2, "max_terms": 3, "max_digits": 2},
                            train_size=64, eval_size=1)
    task = reasoning_gym_task.build(spec, seed=0)
    n, prompts = 320, 64  # 20,480 samples, as a step of N = 320 on 64 prompts
    examples = [ex for ex in task.train[:prompts] for _ in range(n)]
    filler = "Let me add the numbers step by step. " * 6  # ~220 chars of reasoning
    completions = [f"{filler}<answer>{ex.answer if i % 2 else 0}</answer>" for i, ex in enumerate(examples)]
    with Scorer(task, workers=2) as scorer:
        scorer.score(completions[:100], examples[:100], [False] * 100)  # workers up
        res = scorer.score(completions, examples, [False] * len(examples))
    print(f"\nchain_sum scoring: {len(examples)} samples in {res.seconds:.2f} s "
          f"= {len(examples) / res.seconds:,.0f} samples/s (2 workers)")
    assert sum(res.correct) >= len(examples) // 2
    assert res.timeouts == res.errors == 0
    assert res.seconds < 30
