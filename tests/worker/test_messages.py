"""Tenants see one line without server paths; `started` events carry no hostname or PID."""

from __future__ import annotations

from worker.messages import MAX_CHARS, user_message


def test_paths_are_redacted():
    exc = OSError(2, "No such file or directory", "/srv/brorl/artifacts/jobs/job_1/ckpt")
    msg = user_message(exc)
    assert msg.startswith("FileNotFoundError: ") and "/srv" not in msg and "<path>" in msg
    msg = user_message(ValueError("can't load /home/ops/models/x/config.json: bad key"))
    assert msg == "ValueError: can't load <path>: bad key"


def test_plain_messages_are_kept_and_bounded():
    assert user_message(ValueError("task.dataset.id: dataset ds_1 not found")) == (
        "ValueError: task.dataset.id: dataset ds_1 not found")
    assert user_message(RuntimeError("1/2 steps; lr 1e-6")) == "RuntimeError: 1/2 steps; lr 1e-6"
    assert len(user_message(RuntimeError("x\n" * 5000))) == MAX_CHARS
    assert "\n" not in user_message(RuntimeError("a\nb"))
