"""Which layer runs graders: a refusal when no layer meets the bar, and the operator's
unsafe override (rlimits + seccomp, no namespaces) when asked for."""
from __future__ import annotations

import pytest

from trainer.graders import GraderRuntime, SandboxUnavailable
from trainer.graders.sandbox import layer

PY = {"type": "python", "name": "p",
      "source": "import os\ndef grade(sample, item):\n"
                "    if sample['output_text'] == 'fork':\n        os.fork()\n    return 0.5\n"}


@pytest.fixture
def no_bubblewrap(monkeypatch):
    """Neither bubblewrap nor Landlock: no layer meets the bar."""
    monkeypatch.setattr(layer, "_probe", lambda: layer.LayerStatus(
        "none", "bubblewrap: not installed; landlock: the kernel has no Landlock"))


def test_refused_without_a_layer(no_bubblewrap, monkeypatch):
    monkeypatch.delenv(layer.UNSAFE_ENV, raising=False)
    assert layer.sandbox_layer() == "none"
    with GraderRuntime() as runtime, pytest.raises(SandboxUnavailable, match="bubblewrap"):
        runtime.grade(PY, ["x"], [{}])


@pytest.mark.timeout(60)
def test_unsafe_override_still_runs_rlimits_and_seccomp(no_bubblewrap, monkeypatch):
    monkeypatch.setenv(layer.UNSAFE_ENV, "1")
    assert layer.sandbox_layer() == "unsafe"
    with GraderRuntime() as runtime:
        ok, forked = runtime.grade(PY, ["x", "fork"], [{}, {}])
    assert ok.reward == 0.5 and not ok.failed
    assert forked.errors["python_grader_runtime_error"] and "PermissionError" in forked.details


@pytest.mark.timeout(60)
@pytest.mark.skipif(layer.sandbox_layer() == "none", reason="needs a grader sandbox")
def test_runners_are_reused_across_batches():
    """One long-lived runner serves batch after batch (bwrap's die-with-parent follows the
    thread that started it, so starting runners from a batch's worker threads would kill
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
@pytest.mark.skipif(layer.sandbox_layer() == "none", reason="needs a grader sandbox")
def test_a_runner_that_died_while_idle_is_not_charged_to_the_next_sample():
    import os
    import signal

    from trainer.graders.sandbox.pool import processes_with

    ok = {"type": "python", "name": "ok", "source": "def grade(sample, item):\n    return 1.0\n"}
    with GraderRuntime(pool_size=1) as runtime:
        runtime.grade(ok, ["x"], [{}])
        (runner,) = runtime.pool("python")._all
        # The runner dies between batches; its bwrap may still look alive for a moment.
        for pid in processes_with(runner.token):
            if pid != runner.proc.pid:
                os.kill(pid, signal.SIGKILL)
        results = runtime.grade(ok, ["x"] * 3, [{}] * 3)
    assert [r.reward for r in results] == [1.0] * 3 and not any(r.failed for r in results)
