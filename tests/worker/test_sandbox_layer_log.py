"""The worker says at start which grader sandbox layer its python and code graders run in."""
import logging

from trainer.graders import sandbox_layer


def test_worker_start_logs_the_sandbox_layer(caplog):
    from worker import entrypoints

    with caplog.at_level(logging.INFO, logger="worker.entrypoints"):
        layer = entrypoints._log_sandbox_layer()
    assert layer == sandbox_layer()
    assert f"grader sandbox layer: {layer}" in caplog.text
