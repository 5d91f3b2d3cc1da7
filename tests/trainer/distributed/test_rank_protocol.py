"""trainer.distributed.protocol: what the worker and the ranks say to each other round-trips
through the control folder, and a real rank's error report reads back there."""
import json
import subprocess
import sys
from pathlib import Path

from trainer.distributed.launch import _Relay
from trainer.distributed.protocol import ControlFolder, ErrorReport, JobMessage
from trainer.result import TrainResult
from trainer.sink import ListSink, NullSink
from trainer.spec import JobSpec

ROOT = Path(__file__).resolve().parents[3]
SPEC = {"name": "t", "task": {"reasoning_gym": {"name": "chain_sum"}}, "resources": {"gpus_per_node": 2},
        "algo": {"kl_coef": 0.25}}


def test_the_job_round_trips_with_and_without_its_optional_paths(tmp_path):
    control = ControlFolder.fresh(tmp_path)
    assert control.path == tmp_path / "ranks" and control.path.is_dir()
    spec = JobSpec.model_validate(SPEC)
    job = JobMessage(spec=spec, out_dir=tmp_path, resume=tmp_path / "ckpt" / "step-4", dataset_path=tmp_path / "d.jsonl")
    control.write_job(job)
    assert control.read_job() == job and control.read_job().spec.algo.kl_coef == 0.25
    control.write_job(JobMessage(spec=spec, out_dir=tmp_path))
    back = control.read_job()
    assert (back.resume, back.dataset_path, back.out_dir) == (None, None, tmp_path)


def test_stop_result_and_a_fresh_start_forgets_the_last_one(tmp_path):
    control = ControlFolder.fresh(tmp_path)
    assert not control.stop_requested() and control.read_result() is None and control.read_errors() == {}
    control.request_stop()
    assert control.stop_requested()
    done = TrainResult(steps_completed=3, stopped=True, last_eval={"eval/pass@1": 0.5}, last_checkpoint=tmp_path / "s-3")
    control.write_result(done)
    control.write_error(1, ErrorReport("ValueError", "bad row", False))
    assert control.read_result() == done
    again = ControlFolder.fresh(tmp_path)  # a retry's start: nothing the last one said is read as its
    assert not again.stop_requested() and again.read_result() is None and again.read_errors() == {}
    assert again.text("torchrun.log") == ""


def test_rank_0_reports_through_the_sink_file_and_the_others_report_nothing(tmp_path):
    control = ControlFolder.fresh(tmp_path)
    assert isinstance(control.rank_sink(1), NullSink)
    sink = control.rank_sink(0)
    sink.metrics(1, {"loss": 0.25})
    sink.checkpoint(1, tmp_path / "step-1", 7, "cafe")
    got = ListSink()
    _Relay(control.sink_file, got, None).pump()
    assert [r["step"] for r in got.steps] == [1] and got.checkpoints == [(1, tmp_path / "step-1", 7, "cafe")]


def test_error_reports_read_back_by_rank_with_their_blame(tmp_path):
    control = ControlFolder.fresh(tmp_path)
    control.write_error(0, ErrorReport.of(RuntimeError("Connection reset by peer"), peer_failure=True))
    control.write_error(3, ErrorReport.of(KeyError("answer"), peer_failure=False))
    (control.path / "error-2.json").write_text(json.dumps({"type": "StallError", "message": "m"}))  # no blame field
    errors = control.read_errors()
    assert sorted(errors) == [0, 2, 3]
    assert errors[0] == ErrorReport("RuntimeError", "Connection reset by peer", True)
    assert errors[3] == ErrorReport("KeyError", "'answer'", False)
    assert errors[2].peer_failure is False  # an unmarked error is the rank's own


def test_a_real_rank_s_error_reaches_the_worker_as_its_report(tmp_path):
    """rank_main on one process (no torchrun): a job.json whose spec does not validate is
    reported in error-0.json, the rank exiting 1."""
    control = ControlFolder.fresh(tmp_path)
    (control.path / "job.json").write_text(json.dumps(
        {"spec": {**SPEC, "algo": {"kl_coef": -1}}, "out_dir": str(tmp_path), "resume": None, "dataset_path": None}))
    proc = subprocess.run([sys.executable, "-m", "trainer.distributed.rank_main", str(control.path)],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 1, proc.stderr[-2000:]
    (report,) = control.read_errors().values()
    assert report.type == "ValidationError" and "kl_coef" in report.message and not report.peer_failure
    assert list(control.read_errors()) == [0] and control.read_result() is None
