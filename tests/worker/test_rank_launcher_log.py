"""The worker says at start which launcher starts its many-GPU jobs' ranks, or why none."""
import logging


def test_worker_start_logs_the_rank_launcher_or_the_bad_setting(caplog, monkeypatch):
    from worker import entrypoints

    monkeypatch.delenv("BRORL_LAUNCHER", raising=False)
    with caplog.at_level(logging.INFO, logger="worker.entrypoints"):
        assert entrypoints._log_rank_launcher() == "local"
    assert "rank launcher: local" in caplog.text
    monkeypatch.setenv("BRORL_LAUNCHER", "slurm")  # not a launcher there is
    with caplog.at_level(logging.INFO, logger="worker.entrypoints"):
        assert entrypoints._log_rank_launcher() is None
    assert "BRORL_LAUNCHER='slurm'" in caplog.text and "choose one of local" in caplog.text
