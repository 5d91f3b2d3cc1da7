"""`continue_from`: a job that starts from a checkpoint of one of the tenant's earlier jobs.

BroRL's own workflow is "train narrow until the plateau, then continue broad": the continued
job loads the parent's weights (full fine-tuning), or the parent's base and adapter (LoRA: the
adapter continues), optionally the parent's optimizer state, and starts its own schedule at
step 0. Its `model` section is the parent's (a different one is refused at submission).
"""
from __future__ import annotations

from pydantic import Field

from trainer.spec_base import _Frozen


class ContinueFrom(_Frozen):
    """A checkpoint of one of the caller's jobs to start from."""

    job: str = Field(..., min_length=1, max_length=64, description="The earlier job's id.")
    step: int | None = Field(None, ge=0, description="Its checkpoint at this step; null: its newest "
                                                     "when the job is submitted.")
    optimizer: bool = Field(False, description="Also restore the parent's optimizer state (Adam's "
                                               "moments); the schedule and counters start afresh.")
