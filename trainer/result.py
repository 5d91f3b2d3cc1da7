"""What a training run returns, and its JSON form (a rank hands it to the launcher as a file)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass
class TrainResult:
    steps_completed: int
    stopped: bool                       # should_stop() ended the run early
    last_eval: dict[str, float] | None
    last_checkpoint: Path | None

    @classmethod
    def stopped_before_start(cls) -> TrainResult:
        return cls(steps_completed=0, stopped=True, last_eval=None, last_checkpoint=None)

    def to_json(self) -> dict:
        last = self.last_checkpoint
        return {"steps_completed": self.steps_completed, "stopped": self.stopped,
                "last_eval": self.last_eval, "last_checkpoint": str(last) if last else None}

    @classmethod
    def from_json(cls, data: dict) -> TrainResult:
        last = data["last_checkpoint"]
        return cls(steps_completed=data["steps_completed"], stopped=data["stopped"],
                   last_eval=data["last_eval"], last_checkpoint=Path(last) if last else None)
