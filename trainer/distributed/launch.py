"""One job on G ranks of this node: `torchrun` starts `trainer.distributed.rank_main` G times.

The calling process (the Celery worker, or `brorl train --nproc`) keeps the job: its lease,
heartbeat and cancel stay here. It talks to the ranks through files in `<out_dir>/ranks/`:
  job.json      the spec and paths, written here before the start
  sink.jsonl    rank 0's metrics, events and checkpoints (`trainer.sink.RecordSink`), relayed
                here to the real sink exactly once, in order, as they come
  stop          written here when `should_stop()` turns true; the ranks agree on it at the next
                step boundary, save and leave; after `BRORL_RANK_STOP_GRACE_S` they are killed
  result.json   rank 0's TrainResult;  error-<rank>.json  an exception a rank raised, marked
                `peer_failure` when it was a collective broken by another rank's death
  torchrun.log  torchrun's and the ranks' output
A `Fenced` from `should_stop()` kills the ranks at once (the job is not ours: nothing may be
saved). A rank that dies without raising (killed, out of memory) raises `RankDied`, which the
worker treats as a fault of the machine: the job is retried and resumes from its checkpoint.
So do ranks whose only errors are peer failures (gloo's "Connection reset by peer" when the
killed rank's sockets close): a rank's own error, when any rank raised one, fails the job.
"""
from __future__ import annotations

import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

from trainer.result import TrainResult
from trainer.settings import trainer_settings
from trainer.sink import MetricsSink, replay
from trainer.spec import JobSpec

log = logging.getLogger(__name__)

POLL_S = 0.25
KILL_WAIT_S = 10.0


class RankDied(RuntimeError):
    """A rank exited without an error of its own (a signal, the OOM killer): retry the job."""

    retryable = True

    def __init__(self, rank: int | None, exitcode: int | None) -> None:
        self.rank, self.exitcode = rank, exitcode
        who = "a rank" if rank is None else f"rank {rank}"
        how = "" if exitcode is None else (f" (signal {-exitcode})" if exitcode < 0 else f" (exit code {exitcode})")
        super().__init__(f"{who} of this job's torchrun died{how}; the attempt is retried from its checkpoint")


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


def _rank_pids(control: Path) -> list[int]:
    """Live processes running `trainer.distributed.rank_main <control>` (read from /proc)."""
    want = f"trainer.distributed.rank_main\0{control}\0".encode()
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and want in (entry / "cmdline").read_bytes():
                pids.append(int(entry.name))
        except OSError:
            continue
    return pids


def _kill(proc: subprocess.Popen, sig: int, control: Path | None = None) -> None:
    """`sig` to torchrun's process group and, with `control`, to every rank of this job
    (torchrun starts each rank in a session of its own, out of reach of its group)."""
    try:
        os.killpg(proc.pid, sig)  # torchrun: its own session (start_new_session)
    except ProcessLookupError:
        pass
    for pid in _rank_pids(control) if control else []:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def _terminate(proc: subprocess.Popen, control: Path) -> None:
    _kill(proc, signal.SIGTERM)  # torchrun passes it on to its ranks
    try:
        proc.wait(KILL_WAIT_S)
    except subprocess.TimeoutExpired:
        _kill(proc, signal.SIGKILL, control)
        proc.wait()


_FAILURE = re.compile(r"rank\s*:\s*(\d+).*?exitcode\s*:\s*(-?\d+)", re.S)
_ROOT_CAUSE = re.compile(r"Root Cause.*?" + _FAILURE.pattern, re.S)


def _dead_rank(log_text: str, raised: set[int] = frozenset()) -> tuple[int | None, int | None]:
    """(rank, exit code) of the rank that died, from torchrun's failure report: one killed by a
    signal and not among `raised` (the ranks that wrote an error) first; else the root cause.
    torchrun's "first observed failure" is often a survivor whose collective broke."""
    report = log_text[log_text.rfind("Failures:"):] if "Failures:" in log_text else log_text
    signalled = [(int(m.group(1)), int(m.group(2))) for m in _FAILURE.finditer(report)
                 if int(m.group(2)) < 0 and int(m.group(1)) not in raised]
    if signalled:  # SIGTERM last: it is what torchrun sends the survivors
        return min(signalled, key=lambda f: f[1] == -signal.SIGTERM)
    m = _ROOT_CAUSE.search(report)
    return (int(m.group(1)), int(m.group(2))) if m else (None, None)


def _command(control: Path, nproc: int) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
            "-m", "trainer.distributed.rank_main", str(control)]


def train_on_ranks(spec: JobSpec, sink: MetricsSink, should_stop: Callable[[], bool],
                   resume: Path | None = None, *, out_dir: Path, dataset_path: Path | None = None,
                   on_step: Callable[[int, dict], None] | None = None) -> TrainResult:
    """`trainer.entry.train` on `spec.resources.gpus_per_node` ranks; same contract."""
    from trainer.run import prepare_tiny_model
    from trainer.stop import StopRequested, stop_check

    nproc = spec.resources.gpus_per_node
    try:
        prepare_tiny_model(spec, dataset_path, stop_check(should_stop))  # where a cancel reaches it
    except StopRequested:
        return TrainResult.stopped_before_start()
    control = Path(out_dir) / "ranks"
    shutil.rmtree(control, ignore_errors=True)
    control.mkdir(parents=True)
    (control / "job.json").write_text(json.dumps({
        "spec": spec.model_dump(mode="json"), "out_dir": str(out_dir),
        "resume": str(resume) if resume else None, "dataset_path": str(dataset_path) if dataset_path else None}))
    relay = _Relay(control / "sink.jsonl", sink, on_step)
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    with open(control / "torchrun.log", "wb") as out:
        proc = subprocess.Popen(_command(control, nproc), stdout=out, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)  # a terminal's Ctrl-C reaches only us
    log.info("started %d ranks (torchrun pid %d), control folder %s", nproc, proc.pid, control)
    stop_at = None
    try:
        while proc.poll() is None:
            relay.pump()
            if stop_at is None and should_stop():  # may raise Fenced: see `except` below
                (control / "stop").touch()
                stop_at = time.monotonic()
                log.info("asked the ranks to stop at the next step boundary")
            if stop_at is not None and time.monotonic() - stop_at > stop_grace_s():
                log.warning("ranks did not stop within %.0f s; terminating them", stop_grace_s())
                _terminate(proc, control)
            time.sleep(POLL_S)
    except BaseException:  # Fenced, or this process is going away: the ranks go with it
        _kill(proc, signal.SIGKILL, control)
        proc.wait()
        raise
    relay.pump()
    return _outcome(control, proc.returncode, stop_at is not None, relay)


def _outcome(control: Path, rc: int, stop_asked: bool, relay: _Relay) -> TrainResult:
    result = control / "result.json"
    if result.is_file():  # rank 0 wrote it after every rank finished (a barrier)
        if rc != 0:  # e.g. a library thread aborting at interpreter exit: the work is done
            log.warning("torchrun exited %s after the ranks finished; keeping their result", rc)
        return TrainResult.from_json(json.loads(result.read_text()))
    errors = {int(p.stem.split("-")[1]): json.loads(p.read_text()) for p in control.glob("error-*.json")}
    own = [errors[r] for r in sorted(errors) if not errors[r].get("peer_failure")]
    if own:
        # Named as the rank's own error, so the job's message reads as in one process.
        raise type(own[0]["type"], (RankError,), {})(own[0]["message"])
    if stop_asked:  # killed after the grace period: stopped, its last checkpoint stands
        return TrainResult(steps_completed=relay.last_step, stopped=True, last_eval=None,
                           last_checkpoint=relay.last_checkpoint)
    # No rank raised an error of its own: one died (a signal, the OOM killer) and the others'
    # collectives broke on it, or torchrun took them down.
    text = (control / "torchrun.log").read_text(errors="replace")
    log.error("torchrun exited %s; its log ends:\n%s", rc, text[-4000:])
    for r in sorted(errors):
        log.error("rank %d lost its peers: %s: %s", r, errors[r]["type"], errors[r]["message"][:500])
    raise RankDied(*_dead_rank(text, set(errors)))
