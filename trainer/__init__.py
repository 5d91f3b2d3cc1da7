"""BroRL: the training library. Pure: no web, database or queue imports.

`train` is imported lazily so that `trainer.spec` stays importable without torch.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from trainer.checkpoints.format import StartFrom
    from trainer.result import TrainResult
    from trainer.sink import MetricsSink
    from trainer.spec import JobSpec


def train(spec: JobSpec, sink: MetricsSink, should_stop: Callable[[], bool], resume: Path | None = None,
          *, out_dir: Path, dataset_path: Path | None = None,
          on_step: Callable[[int, dict], None] | None = None, start_from: StartFrom | None = None) -> TrainResult:
    """See `trainer.entry.train`."""
    from trainer.entry import train as _train

    return _train(spec, sink, should_stop, resume, out_dir=out_dir, dataset_path=dataset_path,
                  on_step=on_step, start_from=start_from)
