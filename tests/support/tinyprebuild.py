"""A capped builtin:tiny warm start for tests that need a model that sometimes answers right,
not one in the warm start's target band.

`prebuild(spec)` puts the spec's builtin:tiny model in the cache after at most `sft_steps` SFT
steps (300: pass@1 0.28 on chain_sum 2 x 1 digit in ~1-3 min on 2 shared cores, where the full
warm start can run 1200), so a test's run, or each of its ranks, finds it there.

Each distinct (task, seed) is one more build in every run of the suite (30-60 s), so the tests
that only need such a model share `SHARED_TASK` and `SHARED_SEED` (the loop, LoRA, ranks,
graders and dashboard tests) and `prebuild` them with the default cap. The cache key leaves the
cap out: `prebuild` refuses a second cap for a key it built, so no test gets a weaker model
than it asked for because another ran first.
"""
from __future__ import annotations

import copy

from trainer.spec import JobSpec

SHARED_SEED = 7
_SHARED_TASK = {"reasoning_gym": {"name": "chain_sum", "train_size": 400, "eval_size": 16,
                                  "config": {"min_terms": 2, "max_terms": 2, "max_digits": 1}}}

_caps: dict[str, int] = {}


def shared_task(**over) -> dict:
    """The shared task (one-digit sums and differences), with `over` (a grader, a reward) added."""
    return {**copy.deepcopy(_SHARED_TASK), **over}


def prebuild(spec: JobSpec, sft_steps: int = 300) -> None:
    from trainer.run import prepare_tiny_model, tiny_model_key

    key = tiny_model_key(spec)
    if _caps.setdefault(key, sft_steps) != sft_steps:
        raise AssertionError(f"builtin:tiny {key} was prebuilt with {_caps[key]} SFT steps, this test "
                             f"asks {sft_steps}: the cache would hand it the other model")
    prepare_tiny_model(spec, None, max_sft_steps=sft_steps)


def shared_model_dir():
    """The suite's shared warm-started builtin:tiny as a model folder (for jobs that name a
    folder under BRORL_MODEL_ROOTS): built once, whoever asks first."""
    from trainer.run import cache_dir, tiny_model_key

    warm = JobSpec.model_validate({"name": "warm", "seed": SHARED_SEED, "task": shared_task(),
                                   "rollout": {"engine": "hf", "max_new_tokens": 24}})
    prebuild(warm)
    return cache_dir() / "models" / f"tiny-{tiny_model_key(warm)}"
