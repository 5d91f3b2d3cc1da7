"""`brorl up`'s local key: created once (0600), reused on later starts, replaced if stale."""
from __future__ import annotations

import stat

from cli.server import (RAY_DRIVERS, declare_queues, ensure_local_key, up_ray_driver_commands, up_worker_command, worker_argv,
                        worker_queues)
from store import keys
from store.db import session_scope
from store.settings import Settings


def test_key_is_created_once_then_reused(data_dir):
    key, created = ensure_local_key(data_dir)
    assert created and key.startswith("brorl_")
    path = data_dir / "local.key"
    assert path.read_text().strip() == key
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert ensure_local_key(data_dir) == (key, False)
    with session_scope() as s:
        assert keys.authenticate(s, key).name == "local"


def test_a_key_the_database_does_not_know_is_replaced(data_dir):
    (data_dir / "local.key").write_text("brorl_not-in-this-database\n")
    key, created = ensure_local_key(data_dir)
    assert created and key != "brorl_not-in-this-database"
    assert (data_dir / "local.key").read_text().strip() == key


def test_worker_argv():
    assert worker_argv("gpu", False, "solo", 1, "INFO")[:7] == [
        "worker", "-Q", "gpu", "-c", "1", "--pool", "solo"]
    beat = worker_argv("gpu", True, "prefork", 1, "INFO")
    assert beat[2] == "gpu,maintenance" and "-B" in beat
    assert beat[beat.index("--max-tasks-per-child") + 1] == "1"


def test_worker_queues_from_gpus_and_queues():
    assert worker_queues(None, None) == "gpu"
    assert worker_queues(None, 1) == "gpu"
    assert worker_queues(None, 2) == "gpu-2"
    assert worker_queues("maintenance", 4) == "maintenance,gpu-4"
    assert worker_queues("gpu,gpu-2", 2) == "gpu,gpu-2"


def test_brorl_up_serves_every_gpu_count(tmp_path, monkeypatch):
    assert up_worker_command(Settings(data_dir=tmp_path))[-2:] == ["--queues", "gpu"]
    monkeypatch.setenv("BRORL_GPU_COUNTS", "1,2,8")
    command = up_worker_command(Settings(data_dir=tmp_path))
    assert command[-2:] == ["--queues", "gpu,gpu-2,gpu-8"] and "--beat" in command


def test_brorl_up_drives_multi_node_jobs_in_workers_of_their_own(tmp_path):
    """Only where a Ray cluster is named; the `ray` queue alone (never a GPU queue: a job waiting
    for its nodes must not hold up one-node jobs), several jobs at once (a process each), no beat."""
    assert up_ray_driver_commands(Settings(data_dir=tmp_path)) == []
    commands = up_ray_driver_commands(Settings(data_dir=tmp_path, ray_address="head:6379"))
    assert len(commands) == RAY_DRIVERS >= 2
    for command in commands:
        assert command[command.index("--queues") + 1] == "ray" and "--beat" not in command
        assert command[command.index("--pool") + 1] == "solo"


def test_brorl_up_declares_its_workers_queues_before_starting_them(tmp_path):
    """On the SQLite broker two workers creating one queue at once race (one dies of a UNIQUE
    constraint): `brorl up` creates them all first."""
    import sqlite3

    settings = Settings(data_dir=tmp_path, ray_address="head:6379")
    commands = [up_worker_command(settings), *up_ray_driver_commands(settings)]
    assert declare_queues(settings, commands) == ["maintenance", "gpu", "ray"]
    assert declare_queues(settings, commands) == ["maintenance", "gpu", "ray"]  # again: no error
    with sqlite3.connect(tmp_path / "broker.db") as db:
        assert {name for (name,) in db.execute("select name from kombu_queue")} >= {"maintenance", "gpu", "ray"}
