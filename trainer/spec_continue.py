"""`continue_from`: a job that starts from a checkpoint of one of the tenant's earlier jobs.

BroRL's own workflow is "train narrow until the plateau, then continue broad": the continued
job loads the parent's weights (full fine-tuning), or the parent's base and adapter (LoRA: the
adapter continues), optionally the parent's optimizer state, and starts its own schedule at
step 0. Its `model` section is the parent's (a different one is refused at submission).
"""
from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from trainer.spec_base import _Frozen

LATEST = "latest"


class ContinueFrom(_Frozen):
    """A checkpoint of one of the caller's jobs to start from."""

    job: str = Field(..., min_length=1, max_length=64, description="The earlier job's id.")
    step: Annotated[int, Field(ge=0)] | Literal["latest"] | None = Field(
        None, description='Its checkpoint at this step; "latest" or null: its newest when the job is '
                                "submitted (the stored spec names that step).")
    optimizer: bool = Field(False, description="Also restore the parent's optimizer state (Adam's "
                                               "moments); the schedule and counters start afresh.")

    @property
    def pinned_step(self) -> int | None:
        """The step asked for; None for the newest ("latest" or null)."""
        return None if self.step is None or self.step == LATEST else self.step
