"""trainer.distributed.launch's pieces without torchrun: the relay of rank 0's sink, the outcome of the
ranks (result, a rank's own error, a dead rank), torchrun's root-cause report."""
import json
import os
import socket
from pathlib import Path

import pytest

from trainer.distributed import launch, local
from trainer.sink import ListSink, RecordSink


def test_relay_replays_each_complete_line_once_in_order(tmp_path):
    path = tmp_path / "sink.jsonl"
    rec, sink, seen = RecordSink(path), ListSink(), []
    relay = launch._Relay(path, sink, lambda step, v: seen.append(step))
    relay.pump()  # no file yet
    rec.metrics(0, {"eval/pass@1": 0.5})
    rec.event("stage_started", {"step": 1})
    relay.pump()
    with open(path, "a") as f:  # a rank mid-write: half a line waits
        f.write('{"call": "metrics", "step": 1, "values": {"loss": NaN')
    relay.pump()
    assert [r["step"] for r in sink.steps] == [0] and sink.events == [("stage_started", {"step": 1})]
    with open(path, "a") as f:
        f.write('}}\n')
    rec.checkpoint(1, tmp_path / "step-1", 10, "ab")
    relay.pump()
    relay.pump()
    assert [r["step"] for r in sink.steps] == [0, 1] and seen == [1]  # step 0 is no progress
    assert sink.checkpoints == [(1, tmp_path / "step-1", 10, "ab")]
    assert relay.last_step == 1 and relay.last_checkpoint == tmp_path / "step-1"


TORCHRUN_REPORT = """torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
trainer.distributed.rank_main FAILED
------------------------------------------------------------
Failures:
  <NO_OTHER_FAILURES>
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-05_06:00:00
  host      : box
  rank      : 1 (local_rank: 1)
  exitcode  : -9 (pid: 4242)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 4242
============================================================"""


def _control(tmp_path: Path, log: str = "") -> Path:
    (tmp_path / "torchrun.log").write_text(log)
    return tmp_path


def test_a_killed_rank_is_a_retryable_fault_naming_the_rank(tmp_path):
    relay = launch._Relay(tmp_path / "none", ListSink(), None)
    with pytest.raises(launch.RankDied) as e:
        launch._outcome(_control(tmp_path, "noise\n" + TORCHRUN_REPORT), 1, False, relay)
    assert e.value.retryable and (e.value.rank, e.value.exitcode) == (1, -9)
    assert "rank 1" in str(e.value) and "signal 9" in str(e.value)
    with pytest.raises(launch.RankDied) as e:  # no report at all: still a fault, rank unknown
        launch._outcome(_control(tmp_path, "Killed"), -9, False, relay)
    assert e.value.rank is None and "a rank" in str(e.value)


def test_a_rank_s_own_error_fails_the_job_under_its_name(tmp_path):
    control = _control(tmp_path, TORCHRUN_REPORT)
    (control / "error-1.json").write_text(json.dumps({"type": "StallError", "message": "no learning for 5 steps"}))
    with pytest.raises(launch.RankError) as e:
        launch._outcome(control, 1, False, launch._Relay(tmp_path / "x", ListSink(), None))
    assert type(e.value).__name__ == "StallError" and not getattr(e.value, "retryable", False)
    assert str(e.value) == "no learning for 5 steps"


# What torchrun printed in CI when rank 1 was SIGKILLed and rank 0's all-reduce then broke:
# the survivor is the "root cause", the killed rank one of the other failures.
SURVIVOR_FIRST_REPORT = """Failures:
[1]:
  time      : 2026-12-07_01:22:20
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : -9 (pid: 5507)  (SIGKILL)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 5507
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-07_01:22:20
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : 1 (pid: 5506)
  error_file: <N/A>
============================================================"""
GLOO_RESET = ("[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:14723: "
              "Connection reset by peer. This is typically caused by a remote worker hanging")


def _error(control: Path, rank: int, type_: str, message: str, peer_failure: bool) -> None:
    (control / f"error-{rank}.json").write_text(
        json.dumps({"type": type_, "message": message, "peer_failure": peer_failure}))


def test_a_survivor_s_broken_collective_is_blamed_on_the_killed_rank(tmp_path):
    control = _control(tmp_path, SURVIVOR_FIRST_REPORT)
    _error(control, 0, "RuntimeError", GLOO_RESET, True)
    with pytest.raises(launch.RankDied) as e:
        launch._outcome(control, 1, False, launch._Relay(tmp_path / "x", ListSink(), None))
    assert e.value.retryable and (e.value.rank, e.value.exitcode) == (1, -9)
    # ... but a rank's own error, raised before its peer's collective broke, still fails the job
    _error(control, 1, "ValueError", "dataset row 7 has no answer", False)
    with pytest.raises(launch.RankError, match="dataset row 7") as e:
        launch._outcome(control, 1, False, launch._Relay(tmp_path / "x", ListSink(), None))
    assert type(e.value).__name__ == "ValueError"


def test_the_rank_torchrun_terminated_is_not_the_one_blamed():
    report = SURVIVOR_FIRST_REPORT.replace("exitcode  : 1 (pid: 5506)", "exitcode  : -15 (pid: 5506)")
    report = report.replace("[1]:", "[0]:\n  rank      : 0 (local_rank: 0)\n  exitcode  : -15 (pid: 5506)\n[1]:", 1)
    assert local._dead_rank(report) == (1, -9)
    assert local._dead_rank(report, raised={1}) == (0, -15)
    assert local._dead_rank("no report") == (None, None)


PEER_DIES = """
import json, os, signal, sys, torch, torch.distributed as dist
from trainer.collectives import is_peer_failure
dist.init_process_group("gloo")
x = torch.ones(4096)
for i in range(200):
    if dist.get_rank() == 1 and i == 3:
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        dist.all_reduce(x)
    except Exception as exc:
        json.dump({"peer": is_peer_failure(exc), "own": is_peer_failure(ValueError("x")),
                   "message": str(exc)}, open(sys.argv[1], "w"))
        break
"""


def test_a_gloo_collective_broken_by_a_killed_peer_is_a_peer_failure(tmp_path):
    """The survivor's real exception, not a copy of its message: gloo's wording may change."""
    import subprocess
    import sys

    (tmp_path / "peer_dies.py").write_text(PEER_DIES)
    out = tmp_path / "seen.json"
    # Two processes started here, not by torchrun: torchrun's agent terminates the survivor as
    # soon as it sees rank 1 die, which under load came before the survivor's collective
    # failed, and then nothing was written.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ranks = [subprocess.Popen([sys.executable, str(tmp_path / "peer_dies.py"), str(out)],
                              cwd=Path(__file__).resolve().parents[3], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL,
                              env={**os.environ, "RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": "2",
                                   "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
             for r in range(2)]
    try:
        ranks[0].wait(timeout=120)
    finally:
        for p in ranks:
            p.kill()
            p.wait()
    seen = json.loads(out.read_text())
    assert seen["peer"] and not seen["own"], seen


def test_result_and_a_stop_killed_after_its_grace(tmp_path):
    relay = launch._Relay(tmp_path / "x", ListSink(), None)
    relay.last_step, relay.last_checkpoint = 4, tmp_path / "step-4"
    out = launch._outcome(_control(tmp_path), -15, True, relay)  # killed after the stop grace
    assert (out.stopped, out.steps_completed, out.last_checkpoint) == (True, 4, tmp_path / "step-4")
    (tmp_path / "result.json").write_text(json.dumps(
        {"steps_completed": 6, "stopped": False, "last_eval": {"eval/pass@1": 0.5}, "last_checkpoint": None}))
    out = launch._outcome(tmp_path, 0, False, relay)
    assert (out.steps_completed, out.stopped, out.last_eval, out.last_checkpoint) == (6, False, {"eval/pass@1": 0.5}, None)
    # torchrun exiting non-zero after rank 0 reported (a thread aborting at exit): still done.
    assert launch._outcome(tmp_path, -6, False, relay).steps_completed == 6


def test_many_ranks_refuse_optimizers_fsdp_does_not_shard():
    from pydantic import ValidationError

    from trainer.spec import JobSpec

    base = {"name": "t", "task": {"reasoning_gym": {"name": "chain_sum"}}, "resources": {"gpus_per_node": 2}}
    JobSpec.model_validate(base)
    with pytest.raises(ValidationError, match="optim.optimizer_state"):
        JobSpec.model_validate({**base, "optim": {"optimizer_state": "8bit"}})


def test_train_result_round_trips_through_its_json(tmp_path):
    from trainer.result import TrainResult

    done = TrainResult(steps_completed=3, stopped=False, last_eval={"eval/pass@1": 0.25},
                       last_checkpoint=tmp_path / "step-3")
    assert TrainResult.from_json(json.loads(json.dumps(done.to_json()))) == done
    stopped = TrainResult.stopped_before_start()
    assert TrainResult.from_json(stopped.to_json()) == stopped and stopped.last_checkpoint is None


def test_the_launcher_and_the_loop_do_not_import_each_other():
    """One entry point dispatches; neither side needs the other (no import cycle)."""
    import subprocess
    import sys

    for module, other in (("trainer.distributed.launch", "trainer.loop"), ("trainer.loop", "trainer.distributed.launch")):
        code = f"import sys, {module}; assert '{other}' not in sys.modules, '{module} imports {other}'"
        subprocess.run([sys.executable, "-c", code], check=True)


def test_one_process_loop_refuses_a_many_rank_spec_outside_ranks(tmp_path):
    from trainer.loop import train_in_process
    from trainer.sink import NullSink
    from trainer.spec import JobSpec

    spec = JobSpec.model_validate({"name": "t", "task": {"reasoning_gym": {"name": "chain_sum"}},
                                   "resources": {"gpus_per_node": 2}})
    with pytest.raises(ValueError, match="gpus_per_node"):
        train_in_process(spec, NullSink(), lambda: False, out_dir=tmp_path)
