"""A capped builtin:tiny warm start for tests that need a model that sometimes answers right,
not one in the warm start's target band.

`prebuild(spec)` puts the spec's builtin:tiny model in the cache after at most `sft_steps` SFT
steps (300: pass@1 0.28 on chain_sum 2 x 1 digit in ~1-3 min on 2 shared cores, where the full
warm start can run 1200), so a test's run, or each of its ranks, finds it there.
"""
from __future__ import annotations

from trainer.spec import JobSpec


def prebuild(spec: JobSpec, sft_steps: int = 300) -> None:
    from trainer.run import prepare_tiny_model

    prepare_tiny_model(spec, None, max_sft_steps=sft_steps)
