"""Tasks and verifiers: what the model is asked, and how its answers are scored.

`build_task` turns the spec's task section into a `Task` (train/eval examples and a
verifier recipe); `prompts` renders questions and extracts <answer> tags; `Scorer`
(`trainer.tasks.scoring`) scores completions in a process pool with per-sample timeouts.
Importable without torch: the API validates uploads with `dataset_task.validate_jsonl`.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from trainer.tasks.base import Example, Task, TaskSection, VerifierSpec

__all__ = ["Example", "Task", "VerifierSpec", "build_task"]


def build_task_here(task_spec: TaskSection, seed: int, dataset_path: Path | None = None) -> Task:
    """The spec's reasoning-gym task, or its uploaded dataset read from `dataset_path`, built
    in this process (no limits: `build_task` is the one to call on tenant input)."""
    if task_spec.reasoning_gym is not None:
        from trainer.tasks import reasoning_gym_task

        return reasoning_gym_task.build(task_spec.reasoning_gym, seed)
    if dataset_path is None:
        raise ValueError(f"task.dataset {task_spec.dataset.id!r} needs a dataset_path")
    from trainer.tasks import dataset_task

    return dataset_task.build(task_spec.dataset, Path(dataset_path), seed,
                              need_answer=task_spec.grader is None)


def build_task(task_spec: TaskSection, seed: int, dataset_path: Path | None = None,
               stop_check: Callable[[], None] | None = None) -> Task:
    """`build_task_here` in a child process with the time and memory limits of
    `trainer.settings` (BRORL_TASK_BUILD_TIMEOUT_S, BRORL_TASK_BUILD_MEMORY_MB);
    `stop_check` is polled while it works and a stop kills the child."""
    from trainer.settings import trainer_settings
    from trainer.tasks import isolated

    limits = trainer_settings()
    what = (f"building reasoning-gym task {task_spec.reasoning_gym.name}"
            if task_spec.reasoning_gym else f"building dataset task {task_spec.dataset.id}")
    return isolated.run_isolated(
        build_task_here, (task_spec, seed, dataset_path), what=what,
        timeout_s=limits.task_build_timeout_s, memory_mb=limits.task_build_memory_mb,
        stop_check=stop_check)
