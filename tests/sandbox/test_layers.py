"""Which layer runs graders: a refusal when no layer meets the bar, and the operator's
unsafe override (rlimits + seccomp, no namespaces) when asked for."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from trainer.graders import GraderRuntime, SandboxUnavailable
from trainer.graders.sandbox import detect, layer
from tests.support.services import grader_sandbox_missing, needs_service, require_service

PY = {"type": "python", "name": "p",
      "source": "import os\ndef grade(sample, item):\n"
                "    if sample['output_text'] == 'fork':\n        os.fork()\n    return 0.5\n"}


@pytest.fixture
def no_bubblewrap(monkeypatch):
    """Neither bubblewrap nor Landlock: no layer meets the bar."""
    monkeypatch.setattr(detect, "_detect", lambda: detect.LayerStatus(
        "none", "bubblewrap: not installed; landlock: the kernel has no Landlock"))


def test_refused_without_a_layer(no_bubblewrap, monkeypatch):
    monkeypatch.delenv(layer.UNSAFE_ENV, raising=False)
    assert detect.sandbox_layer() == "none"
    with GraderRuntime() as runtime, pytest.raises(SandboxUnavailable, match="bubblewrap"):
        runtime.grade(PY, ["x"], [{}])


@pytest.mark.timeout(60)
def test_unsafe_override_still_runs_rlimits_and_seccomp(no_bubblewrap, monkeypatch):
    monkeypatch.setenv(layer.UNSAFE_ENV, "1")
    assert detect.sandbox_layer() == "unsafe"
    with GraderRuntime() as runtime:
        ok, forked = runtime.grade(PY, ["x", "fork"], [{}, {}])
    assert ok.reward == 0.5 and not ok.failed
    assert forked.errors["python_grader_runtime_error"] and "PermissionError" in forked.details


@pytest.mark.timeout(60)
@needs_service("a grader sandbox", grader_sandbox_missing())
def test_servers_are_reused_across_batches():
    """One long-lived server serves batch after batch (bwrap's die-with-parent follows the
    thread that started it, so starting servers from a batch's worker threads would kill
    them after every batch)."""
    import time

    ok = {"type": "python", "name": "ok", "source": "def grade(sample, item):\n    return 1.0\n"}
    with GraderRuntime(pool_size=1) as runtime:
        runtime.grade(ok, ["x"] * 5, [{}] * 5)
        pool = runtime.pool("python")
        first = list(pool._all)
        time.sleep(0.3)
        assert [r.reward for r in runtime.grade(ok, ["x"] * 7, [{}] * 7)] == [1.0] * 7
        assert pool._all == first and first[0].alive() and first[0].served == 12


@pytest.mark.timeout(60)
@needs_service("a grader sandbox", grader_sandbox_missing())
def test_a_server_that_died_while_idle_is_not_charged_to_the_next_sample():
    import os
    import signal

    from trainer.graders.sandbox.process import processes_with

    ok = {"type": "python", "name": "ok", "source": "def grade(sample, item):\n    return 1.0\n"}
    with GraderRuntime(pool_size=1) as runtime:
        runtime.grade(ok, ["x"], [{}])
        (server,) = runtime.pool("python")._all
        # The server dies between batches; its bwrap may still look alive for a moment.
        for pid in processes_with(server.token):
            if pid != server.proc.pid:
                os.kill(pid, signal.SIGKILL)
        results = runtime.grade(ok, ["x"] * 3, [{}] * 3)
    assert [r.reward for r in results] == [1.0] * 3 and not any(r.failed for r in results)


@pytest.fixture
def fresh_detection():
    """The layer is probed once per process: probe again here, and again after the test."""
    detect._detect.cache_clear()
    yield
    detect._detect.cache_clear()


@pytest.mark.timeout(120)
@needs_service("root", None if os.geteuid() == 0 else "the uid drop happens for a root service")
def test_a_python_installation_the_sandbox_uid_cannot_reach_is_refused(
        fresh_detection, monkeypatch, tmp_path):
    """Where no layer can run tenant code without root, it is refused, and the reason (also
    on /readyz) names the folder the operator must open."""
    locked = tmp_path / "locked-python"
    locked.mkdir(mode=0o700)
    real = layer._python_paths()
    monkeypatch.setattr(layer, "_python_paths", lambda: real + [str(locked)])
    monkeypatch.delenv(layer.UNSAFE_ENV, raising=False)
    status = detect.layer_status()
    assert status.layer == "none", status
    assert "bubblewrap:" in status.reason and "landlock:" in status.reason
    assert str(tmp_path) in status.reason and "chmod o+x" in status.reason, status.reason
    with GraderRuntime() as runtime, pytest.raises(SandboxUnavailable, match="chmod o"):
        runtime.grade(PY, ["x"], [{}])


@pytest.mark.timeout(120)
def test_bwrap_is_found_wherever_the_operator_put_it(fresh_detection, monkeypatch):
    import shutil
    import tempfile

    found = shutil.which("bwrap", path=":".join(layer.BWRAP_DIRS))
    require_service("bubblewrap", None if found else "bwrap is not installed")
    monkeypatch.setenv("PATH", "/nonexistent")  # not on PATH: the usual folders are searched
    assert layer.bwrap_binary() == found
    elsewhere = Path(tempfile.mkdtemp(prefix="brorl-opt-"))
    try:
        elsewhere.chmod(0o755)
        shutil.copy2(found, elsewhere / "bwrap")
        monkeypatch.setenv("BRORL_BWRAP_PATH", str(elsewhere / "bwrap"))
        assert layer.bwrap_binary() == str(elsewhere / "bwrap")
        assert layer.server_command("bubblewrap", "python", layer.Limits())[0] == \
            str(elsewhere / "bwrap")
        assert detect._why_not("bubblewrap") == ""
        monkeypatch.setenv("BRORL_BWRAP_PATH", str(elsewhere / "missing"))
        assert "not installed" in detect._why_not("bubblewrap")
    finally:
        shutil.rmtree(elsewhere)
