"""The launcher seam: which launcher a deployment gets (BRORL_LAUNCHER), and a second launcher
plugging in: `train_on_ranks` drives whatever `Launcher` it is given through the protocol alone
(its ranks here: one plain process speaking the protocol, no torch)."""
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from trainer.distributed import launch
from trainer.distributed.launchers import LAUNCHERS, Launcher, Ranks, configured_launcher, launcher_named
from trainer.distributed.local import LocalLauncher
from trainer.events import EventType
from trainer.settings import trainer_settings
from trainer.sink import ListSink
from trainer.spec import JobSpec, ResourcesSpec

ROOT = Path(__file__).resolve().parents[3]
# Not builtin:tiny, so nothing is built before the start (prepare_tiny_model does nothing).
SPEC = JobSpec.model_validate({"name": "t", "task": {"reasoning_gym": {"name": "chain_sum"}},
                               "model": {"path": "Qwen/Qwen2.5-0.5B-Instruct"}, "resources": {"gpus_per_node": 2}})

RANK = """
import os, signal, sys, time
from pathlib import Path
from trainer.distributed.protocol import ControlFolder, ErrorReport
from trainer.result import TrainResult

control, mode = ControlFolder(Path(sys.argv[1])), sys.argv[2]
job = control.read_job()
control.rank_sink(0).metrics(1, {"loss": 0.5, "name": job.spec.name})
if mode == "die":
    os.kill(os.getpid(), signal.SIGKILL)
if mode == "own error":
    control.write_error(0, ErrorReport("ValueError", "dataset row 7 has no answer", False))
    sys.exit(1)
deadline = time.monotonic() + 120
while mode == "wait" and not control.stop_requested() and time.monotonic() < deadline:
    time.sleep(0.05)
control.write_result(TrainResult(1, control.stop_requested(), {"eval/pass@1": 0.5}, None))
"""


class _ProcessRanks(Ranks):
    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc = proc

    def poll(self):
        return self.proc.poll()

    def terminate(self):
        self.proc.terminate()
        self.proc.wait()

    def kill(self):
        self.proc.kill()
        self.proc.wait()


class ProcessLauncher(Launcher):
    """A launcher of this test only: one process per job, whatever the spec asks."""

    name, log_name = "process", "process.log"

    def __init__(self, mode: str) -> None:
        self.mode, self.started = mode, []

    def start(self, control, spec, event):
        with open(control.file(self.log_name), "wb") as out:
            proc = subprocess.Popen([sys.executable, "-c", RANK, str(control.path), self.mode],
                                    stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
        self.started.append(proc)
        event(EventType.progress, {"phase": "launch", "message": f"{self.name}: ranks started"})
        return _ProcessRanks(proc)

    def dead_rank(self, control, raised):
        return 0, self.started[-1].returncode


def _train(tmp_path, launcher, should_stop=lambda: False, on_step=None):
    sink = ListSink()
    return sink, launch.train_on_ranks(SPEC, sink, should_stop, out_dir=tmp_path, launcher=launcher, on_step=on_step)


def test_the_deployment_s_launcher_is_local_unless_named(monkeypatch):
    monkeypatch.delenv("BRORL_LAUNCHER", raising=False)
    assert isinstance(configured_launcher(), LocalLauncher)
    monkeypatch.setenv("BRORL_LAUNCHER", "local")
    assert configured_launcher().name == "local"
    assert all(launcher_named(name).name == name for name in LAUNCHERS)


def test_an_unknown_launcher_is_an_error_naming_the_setting_and_the_choices(monkeypatch, tmp_path):
    with pytest.raises(ValueError, match=r"BRORL_LAUNCHER='mpi'.*local, ray"):
        trainer_settings({"BRORL_LAUNCHER": "mpi"})
    with pytest.raises(ValueError, match=r"BRORL_LAUNCHER='slurm'.*local"):
        launcher_named("slurm")
    monkeypatch.setenv("BRORL_LAUNCHER", "mpi")
    with pytest.raises(ValueError, match="BRORL_LAUNCHER"):  # before anything starts
        launch.train_on_ranks(SPEC, ListSink(), lambda: False, out_dir=tmp_path)
    assert not (tmp_path / "ranks").exists()


def test_the_local_launcher_refuses_more_than_one_node(tmp_path):
    from trainer.distributed.protocol import ControlFolder

    two_nodes = SPEC.model_copy(update={"resources": ResourcesSpec.model_construct(gpus_per_node=2, nodes=2)})
    with pytest.raises(ValueError, match="resources.nodes=2"):
        LocalLauncher().start(ControlFolder.fresh(tmp_path), two_nodes, lambda *_: None)


def test_a_second_launcher_plugs_in_result_relay_and_stop(tmp_path):
    seen = []
    sink, result = _train(tmp_path / "a", ProcessLauncher("finish"), on_step=lambda s, v: seen.append(s))
    assert (result.steps_completed, result.stopped, result.last_eval) == (1, False, {"eval/pass@1": 0.5})
    assert [r["step"] for r in sink.steps] == [1] and sink.steps[0]["name"] == "t" and seen == [1]
    # A launcher's own events reach the job.
    assert sink.events == [("progress", {"phase": "launch", "message": "process: ranks started"})]
    _, result = _train(tmp_path / "b", ProcessLauncher("wait"), should_stop=lambda: True)
    assert result.stopped  # the stop file reached the rank, which reported a stopped result


def test_a_second_launcher_s_dead_rank_and_a_rank_s_own_error(tmp_path):
    with pytest.raises(launch.RankDied) as e:
        _train(tmp_path / "a", ProcessLauncher("die"))
    assert e.value.retryable and (e.value.rank, e.value.exitcode) == (0, -signal.SIGKILL)
    with pytest.raises(launch.RankError, match="dataset row 7") as e:
        _train(tmp_path / "b", ProcessLauncher("own error"))
    assert type(e.value).__name__ == "ValueError"


def test_a_fenced_attempt_kills_the_second_launcher_s_ranks(tmp_path):
    class Fenced(Exception):
        pass

    launcher, calls = ProcessLauncher("wait"), []

    def fenced():
        calls.append(1)
        if len(calls) > 2:
            raise Fenced
        return False

    with pytest.raises(Fenced):
        _train(tmp_path, launcher, should_stop=fenced)
    assert launcher.started[0].returncode == -signal.SIGKILL
    assert not (tmp_path / "ranks" / "result.json").exists()
