"""One job on many ranks, whoever starts them: the calling process's side of the attempt.

The calling process (the Celery worker, or `brorl train --nproc`) keeps the job: its lease,
heartbeat and cancel stay here. `train_on_ranks` writes the job into a fresh control folder
(`trainer.distributed.protocol`), has the deployment's `Launcher` start the ranks
(`trainer.distributed.launchers`; `local`: torchrun on this node), relays rank 0's reports to
the real sink as they come, writes `stop` when `should_stop()` turns true (the ranks agree on it
at the next step boundary, save and leave; after `BRORL_RANK_STOP_GRACE_S` they are
terminated), and judges the end from what the ranks wrote:
- `result.json`: rank 0's TrainResult, the attempt's;
- a rank's own error: the job fails with it (`RankError`, named as the rank's exception);
- no result and only peer failures, or no error at all: a rank died without raising (killed,
  out of memory) and its peers' collectives broke on it: `RankDied`, which the worker treats as
  a fault of the machine (the job is retried and resumes from its checkpoint), naming the rank
  the launcher saw die.
A `Fenced` from `should_stop()` kills the ranks at once (the job is not ours: nothing may be
saved), as does any exception leaving this process.
"""
from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Callable

from trainer.distributed.launchers import Launcher, configured_launcher, launcher_named
from trainer.distributed.protocol import ControlFolder, JobMessage
from trainer.result import TrainResult
from trainer.settings import DEFAULT_LAUNCHER, trainer_settings
from trainer.sink import MetricsSink, replay
from trainer.spec import JobSpec

log = logging.getLogger(__name__)

POLL_S = 0.25


class RankDied(RuntimeError):
    """A rank exited without an error of its own (a signal, the OOM killer): retry the job."""

    retryable = True

    def __init__(self, rank: int | None, exitcode: int | None) -> None:
        self.rank, self.exitcode = rank, exitcode
        who = "a rank" if rank is None else f"rank {rank}"
        how = "" if exitcode is None else (f" (signal {-exitcode})" if exitcode < 0 else f" (exit code {exitcode})")
        super().__init__(f"{who} of this job died{how}; the attempt is retried from its checkpoint")


class RankError(RuntimeError):
    """A rank raised an error (the job's own: a bad dataset, a stall): the job fails with it."""


def stop_grace_s() -> float:
    return trainer_settings().rank_stop_grace_s


class _Relay:
    """Reads rank 0's complete sink lines as they are appended and replays each once."""

    def __init__(self, path: Path, sink: MetricsSink, on_step) -> None:
        self.path, self.sink, self.on_step, self.offset = path, sink, on_step, 0
        self.last_step, self.last_checkpoint = 0, None

    def pump(self) -> None:
        if not self.path.exists():
            return
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            data = f.read()
        end = data.rfind(b"\n") + 1  # a half-written last line waits for the next pump
        for line in data[:end].splitlines():
            record = json.loads(line)
            replay(record, self.sink)
            if record["call"] == "metrics":
                self.last_step = record["step"]
            elif record["call"] == "checkpoint":
                self.last_checkpoint = Path(record["path"])
            if self.on_step and record["call"] == "metrics" and record["step"] > 0:
                self.on_step(record["step"], record["values"])
        self.offset += end


def train_on_ranks(spec: JobSpec, sink: MetricsSink, should_stop: Callable[[], bool],
                   resume: Path | None = None, *, out_dir: Path, dataset_path: Path | None = None,
                   on_step: Callable[[int, dict], None] | None = None,
                   launcher: Launcher | None = None, start_from=None) -> TrainResult:
    """`trainer.entry.train` on the ranks `spec.resources` asks for; same contract. `launcher`:
    the deployment's (`BRORL_LAUNCHER`) when not given."""
    from trainer.events import PhaseProgress
    from trainer.run import prepare_tiny_model
    from trainer.stop import StopRequested, stop_check

    launcher = launcher or configured_launcher()
    try:
        # Where a cancel reaches it, its progress reported as the ranks' own phases would be.
        if start_from is None and resume is None:  # a continuation loads its parent's weights
            prepare_tiny_model(spec, dataset_path, stop_check(should_stop), PhaseProgress(sink))
    except StopRequested:
        return TrainResult.stopped_before_start()
    control = ControlFolder.fresh(out_dir)
    control.write_job(JobMessage(spec=spec, out_dir=Path(out_dir), resume=resume, dataset_path=dataset_path,
                                 start_from=None if resume is not None else start_from))
    relay = _Relay(control.sink_file, sink, on_step)
    ranks = launcher.start(control, spec, sink.event)
    stop_at = None
    try:
        while (rc := ranks.poll()) is None:
            relay.pump()
            if stop_at is None and should_stop():  # may raise Fenced: see `except` below
                control.request_stop()
                stop_at = time.monotonic()
                log.info("asked the ranks to stop at the next step boundary")
            if stop_at is not None and time.monotonic() - stop_at > stop_grace_s():
                log.warning("ranks did not stop within %.0f s; terminating them", stop_grace_s())
                ranks.terminate()
            time.sleep(POLL_S)
    except BaseException:  # Fenced, or this process is going away: the ranks go with it
        ranks.kill()
        raise
    relay.pump()
    return _outcome(control.path, rc, stop_at is not None, relay, launcher)


def _outcome(control: Path, rc: int, stop_asked: bool, relay: _Relay, launcher: Launcher | None = None) -> TrainResult:
    """The attempt's end from what the ranks wrote in `control`; `launcher` (the one that ran
    them: the default, `local`, when not given) names a rank that died."""
    folder = ControlFolder(Path(control))
    result = folder.read_result()
    if result is not None:  # rank 0 wrote it after every rank finished (a barrier)
        if rc != 0:  # e.g. a library thread aborting at interpreter exit: the work is done
            log.warning("the ranks exited %s after they finished; keeping their result", rc)
        return result
    errors = folder.read_errors()
    own = [errors[r] for r in sorted(errors) if not errors[r].peer_failure]
    if own:
        # Named as the rank's own error, so the job's message reads as in one process.
        raise type(own[0].type, (RankError,), {})(own[0].message)
    if stop_asked:  # killed after the grace period: stopped, its last checkpoint stands
        return TrainResult(steps_completed=relay.last_step, stopped=True, last_eval=None,
                           last_checkpoint=relay.last_checkpoint)
    # No rank raised an error of its own: one died (a signal, the OOM killer) and the others'
    # collectives broke on it, or the launcher took them down.
    launcher = launcher or launcher_named(DEFAULT_LAUNCHER)
    text = folder.text(launcher.log_name)
    log.error("the ranks exited %s; the %s launcher's log ends:\n%s", rc, launcher.name, text[-4000:])
    for r in sorted(errors):
        log.error("rank %d lost its peers: %s: %s", r, errors[r].type, errors[r].message[:500])
    raise RankDied(*launcher.dead_rank(folder, set(errors)))
