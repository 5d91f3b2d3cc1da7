"""`train`: the one entry point. A job on one process runs the loop here; a job of more ranks
(`resources.nodes x gpus_per_node` > 1) is handed to a launcher, whose ranks run the same loop:
the deployment's (BRORL_LAUNCHER) on one node, Ray's across nodes."""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from trainer.checkpoints.io import StartFrom
from trainer.result import TrainResult
from trainer.sink import MetricsSink
from trainer.spec import JobSpec


def train(spec: JobSpec, sink: MetricsSink, should_stop: Callable[[], bool], resume: Path | None = None,
          *, out_dir: Path, dataset_path: Path | None = None,
          on_step: Callable[[int, dict], None] | None = None,
          start_from: StartFrom | None = None) -> TrainResult:
    """Run `spec` to the end of its schedule, or until `should_stop()` (then save and return).

    Steps are counted from 1: metrics row `s` describes the s-th update; checkpoint `s` holds the
    weights after it. `resume` is a checkpoint folder of the same spec. `on_step(step, values)`
    is an optional progress callback (the CLI's progress bar). `start_from`: another job's
    checkpoint this one starts from (`spec.continue_from`; a `resume` of this job's own wins).
    """
    if spec.resources.world_size > 1:
        from trainer.distributed.launch import train_on_ranks
        from trainer.distributed.launchers import launcher_named

        # Only Ray places ranks on other nodes; one node's job goes to the deployment's launcher.
        launcher = launcher_named("ray") if spec.resources.nodes > 1 else None
        return train_on_ranks(spec, sink, should_stop, resume, out_dir=Path(out_dir),
                              dataset_path=dataset_path, on_step=on_step, launcher=launcher,
                              start_from=start_from)
    from trainer.loop import train_in_process

    return train_in_process(spec, sink, should_stop, resume, out_dir=Path(out_dir),
                            dataset_path=dataset_path, on_step=on_step, start_from=start_from)
