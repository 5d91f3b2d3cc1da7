"""A short builtin:tiny warm start for tests that need a model, not a skilled one.

`prebuild(spec)` puts the spec's builtin:tiny model in the cache with a warm start of a few
SFT steps (seconds, where the real one can take minutes on a loaded machine), so a test's
run, or each of its ranks, finds it there.
"""
from __future__ import annotations

from trainer.spec import JobSpec


def prebuild(spec: JobSpec, sft_steps: int = 40) -> None:
    from trainer.run import _tiny_model_dir
    from trainer.stop import never
    from trainer.tasks import build_task
    from trainer.tasks.scoring import Scorer

    task = build_task(spec.task, spec.seed, None)
    scorer = Scorer(task, reward=spec.task.reward, truncated_reward=spec.algo.truncated_reward)
    try:
        _tiny_model_dir(spec, task, scorer, never, max_sft_steps=sft_steps)
    finally:
        scorer.close()
