"""A grader behind the trainer's scorer interface, and the per-step grader metrics.

`GraderScorer.score(completions, examples, truncated)` returns the same `ScoreResult` as
`trainer.tasks.scoring.Scorer`, so a job whose task has a grader can swap it in where the
step and the evaluation call `run.scorer.score(...)`. The item a grader sees is the dataset
row: the example's payload plus `prompt` / `question` and `answer`. Truncated completions
are not graded (they get `truncated_reward`, as with verifiers). The last batch's per-sample
results stay in `last_results` for the step's sample table, and `step_metrics` turns them into
the step's `grader/*` and `reward/<key>` numbers.
"""
from __future__ import annotations

import time
from typing import Any, Callable, Sequence

from trainer.graders.batch import GradeResult, GraderRuntime
from trainer.graders.schemas import MultiGrader, needs_sandbox, parse_grader
from trainer.graders.sandbox.detect import require_layer
from trainer.tasks.base import Example
from trainer.tasks.scoring import CORRECT_EPS, REWARDS, ScoreResult, truncated_flags


def example_item(example: Example) -> dict[str, Any]:
    """The dataset row a grader's `item` namespace sees."""
    return {**example.payload, "prompt": example.question, "question": example.question,
            "answer": example.answer}


class GraderScorer:
    """Scores with a grader; a context manager whose close() stops its sandboxes."""

    def __init__(self, grader: Any, reward: str = "score", truncated_reward: float = 0.0,
                 runtime: GraderRuntime | None = None, timeout_s: float | None = None,
                 stop_check: Callable[[], None] | None = None):
        if reward not in REWARDS:
            raise ValueError(f"reward must be one of {sorted(REWARDS)}, got {reward!r}")
        self.grader = parse_grader(grader)
        self.reward_fn = REWARDS[reward]
        self.truncated_reward = float(truncated_reward)
        self._own_runtime = runtime is None
        # The job's stop check reaches the sandboxes: a cancel or the wall limit kills a
        # batch that is still grading instead of waiting for it.
        self.runtime = runtime or GraderRuntime(timeout_s=timeout_s, stop_check=stop_check)
        self.last_results: list[GradeResult | None] = []
        # The multi grader's keys: every batch reports each (0 for an ungraded sample), so
        # the step's per-sample sub-reward tensors have the same keys in every round.
        self.sub_reward_keys = sorted(self.grader.graders) \
            if isinstance(self.grader, MultiGrader) else []

    def score(self, completions: Sequence[str], examples: Sequence[Example],
              truncated: Sequence[bool] | None = None) -> ScoreResult:
        start = time.perf_counter()
        n = len(completions)
        truncated = truncated_flags(completions, examples, truncated)
        todo = [i for i in range(n) if not truncated[i]]
        graded = self.runtime.grade(self.grader, [completions[i] for i in todo],
                                    [example_item(examples[i]) for i in todo])
        results: list[GradeResult | None] = [None] * n
        for i, result in zip(todo, graded):
            results[i] = result
        self.last_results = results
        scores = [r.reward if r is not None else 0.0 for r in results]
        correct = [r is not None and r.reward >= 1.0 - CORRECT_EPS for r in results]
        rewards = [self.truncated_reward if t else self.reward_fn(s, c)
                   for s, c, t in zip(scores, correct, truncated)]
        return ScoreResult(
            rewards=rewards, scores=scores, correct=correct,
            timeouts=sum(1 for r in graded if r.errors["unresponsive_reward_error"]),
            errors=sum(1 for r in graded if r.failed),
            seconds=time.perf_counter() - start)

    def close(self) -> None:
        if self._own_runtime:
            self.runtime.close()

    def __enter__(self) -> "GraderScorer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def step_metrics(results: Sequence[GradeResult | None]) -> dict[str, float]:
    """`grader/errors`, `grader/timeouts`, `grader/seconds` and `reward/<key>` means."""
    graded = [r for r in results if r is not None]
    out = {
        "grader/errors": float(sum(r.failed for r in graded)),
        "grader/timeouts": float(sum(r.errors["unresponsive_reward_error"] for r in graded)),
        "grader/seconds": float(sum(r.seconds for r in graded)),
    }
    keys = sorted({k for r in graded for k in r.sub_rewards})
    for key in keys:
        values = [r.sub_rewards[key] for r in graded if key in r.sub_rewards]
        out[f"reward/{key}"] = sum(values) / len(values)
    return out


def make_scorer(spec: Any, task: Any, stop_check: Callable[[], None] | None = None):
    """The job's one scorer: its `task.grader` behind the scorer interface, else the task's
    built-in verifier (`trainer.tasks.scoring.Scorer`). A grader that runs code is refused
    here, before any model is loaded, when this machine has no sandbox layer. `stop_check`
    (raising StopRequested) is polled while a grader batch waits on its sandboxes."""
    if spec.task.grader is None:
        from trainer.tasks.scoring import Scorer

        return Scorer(task, reward=spec.task.reward, truncated_reward=spec.algo.truncated_reward)
    grader = parse_grader(spec.task.grader)
    if needs_sandbox(grader):
        require_layer()
    return GraderScorer(grader, reward=spec.task.reward,
                        truncated_reward=spec.algo.truncated_reward, stop_check=stop_check)


def first_error(results: Sequence[GradeResult | None]) -> str:
    """'<flag>: <details>' of the first failed result ('' when none failed)."""
    for result in results:
        if result is not None and result.failed:
            flag = next(f for f, on in result.errors.items() if on)
            return f"{flag}: {result.details}" if result.details else flag
    return ""


class GraderErrorLimit(RuntimeError):
    """Too many of the job's samples failed to grade for too many steps in a row."""


class GraderErrorWatch:
    """Counts steps in a row where more than `fraction` of the samples had a grader error.

    The step records its results (`record`) before evaluation reuses the scorer; the loop
    checks (`check`) after the step's metrics are written, so a failing job still shows them.
    """

    def __init__(self) -> None:
        self.in_row = 0
        self.errors, self.samples, self.first = 0, 0, ""

    def record(self, results: Sequence[GradeResult | None]) -> None:
        self.errors = sum(1 for r in results if r is not None and r.failed)
        self.samples, self.first = len(results), first_error(results)

    def check(self, step: int, fraction: float, steps: int) -> None:
        """GraderErrorLimit on the `steps`-th step in a row over `fraction`."""
        if self.samples == 0 or self.errors / self.samples <= fraction:
            self.in_row = 0
            return
        self.in_row += 1
        if self.in_row >= steps:
            raise GraderErrorLimit(
                f"the grader failed on more than {fraction:.0%} of the samples for {self.in_row} "
                f"steps in a row (step {step}: {self.errors} of {self.samples}); first error: "
                f"{self.first[:1000]} (limits: task.grader_error_fraction, "
                f"task.grader_error_steps)")
