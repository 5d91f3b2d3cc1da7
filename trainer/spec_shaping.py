"""The spec's reward shaping and prompt-curriculum parts of `algo` (trainer/spec.py):
DAPO's soft overlong punishment and the difficulty filter across steps. Both off by default."""
from __future__ import annotations

from typing import Literal

from pydantic import Field

from trainer.spec_base import _Frozen


class OverlongSpec(_Frozen):
    """DAPO's soft overlong punishment: a response longer than rollout.max_new_tokens - buffer
    tokens loses penalty x (its excess / buffer) of reward, linearly up to the whole penalty at
    max_new_tokens (a cut response gets the whole penalty too, on top of algo.truncated_reward)."""

    buffer: int = Field(..., ge=1, le=131_072, description="Tokens before rollout.max_new_tokens over "
                        "which the penalty grows from 0 to `penalty` (DAPO's L_cache; it used 4,096 of "
                        "20,480). Less than rollout.max_new_tokens.")
    penalty: float = Field(1.0, gt=0, le=1e6, description="The reward lost at max_new_tokens (DAPO: 1, "
                           "the reward's range).")


class DifficultyFilterSpec(_Frozen):
    """Retire a training prompt once the policy has solved every one of its n samples the last
    `window` times it was drawn (or, with retire: solved_or_unsolved, also none of them): its
    groups carry no learning signal, so drawing it again only costs generation."""

    window: int = Field(2, ge=1, le=100, description="The prompt's most recent draws that must all be "
                        "solved (or all unsolved) before it is retired; a draw is one group of n "
                        "samples, and a prompt is drawn about once per pass over the training split.")
    retire: Literal["solved", "solved_or_unsolved"] = Field(
        "solved", description="solved: retire prompts always solved; solved_or_unsolved: also those "
        "never solved (only when the task is known to hold prompts beyond the model: an unsolved "
        "prompt may become solvable later in the run, broadening's whole point).")
