"""The Celery configuration: what the settings turn into, and what the API may import."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from store.settings import Settings
from worker import celery_app
from worker.celery_app import GPU_QUEUE, MAINTENANCE_QUEUE, REAP_TASK, RUN_JOB_TASK

REPO = Path(__file__).resolve().parents[2]


def test_config_for_the_sqlite_broker(tmp_path):
    conf = celery_app.celery_config(Settings(data_dir=tmp_path))
    assert conf["broker_url"] == f"sqla+sqlite:///{tmp_path / 'broker.db'}"
    # kombu's SQLAlchemy transport hands transport options to create_engine (TypeError).
    assert "broker_transport_options" not in conf
    assert conf["task_acks_late"] and conf["task_reject_on_worker_lost"]
    assert conf["task_ignore_result"] and conf["result_backend"] is None
    assert conf["worker_prefetch_multiplier"] == 1
    assert conf["task_routes"][RUN_JOB_TASK] == {"queue": GPU_QUEUE}
    assert conf["task_routes"][REAP_TASK] == {"queue": MAINTENANCE_QUEUE}


def test_config_for_redis_sets_the_visibility_timeout(tmp_path):
    settings = Settings(data_dir=tmp_path, broker_url="redis://127.0.0.1:6379/5",
                        broker_visibility_timeout=999, reaper_interval_seconds=7)
    conf = celery_app.celery_config(settings)
    assert conf["broker_transport_options"] == {"visibility_timeout": 999}
    (entry,) = conf["beat_schedule"].values()
    assert entry["task"] == REAP_TASK and entry["schedule"] == 7.0
    assert entry["options"]["queue"] == MAINTENANCE_QUEUE


def test_enqueue_job_sends_by_name_to_the_gpu_queue(monkeypatch):
    sent = []
    monkeypatch.setattr(celery_app.app, "send_task",
                        lambda name, args, queue: sent.append((name, args, queue)))
    celery_app.enqueue_job("job_1")
    assert sent == [(RUN_JOB_TASK, ["job_1"], GPU_QUEUE)]


def test_tasks_are_registered_by_name():
    import worker.tasks  # noqa: F401 - registers the tasks

    assert {RUN_JOB_TASK, REAP_TASK} <= set(celery_app.app.tasks)


def test_api_side_imports_stay_light():
    code = ("import sys, worker.celery_app, api.app; "
            "bad = [m for m in ('torch', 'vllm', 'worker.tasks', 'worker.runner') if m in sys.modules]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True, timeout=60)
