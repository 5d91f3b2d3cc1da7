"""The Celery configuration: what the settings turn into, and what the API may import."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

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


def test_each_gpu_count_has_its_own_queue():
    assert [celery_app.queue_for(g) for g in (1, 2, 4, 8)] == ["gpu", "gpu-2", "gpu-4", "gpu-8"]
    with pytest.raises(ValueError):
        celery_app.queue_for(0)


def test_a_multi_node_job_has_the_ray_queue_whatever_its_gpus():
    """Its ranks run on Ray's nodes: a driver worker with no GPU claims it, never a GPU worker
    that a one-node job could use while it waits for placement."""
    assert [celery_app.queue_for(g, nodes=n) for g, n in ((1, 2), (8, 4), (2, 1))] == ["ray", "ray", "gpu-2"]
    assert celery_app.RAY_QUEUE == "ray"
    with pytest.raises(ValueError, match="at least 1 node"):
        celery_app.queue_for(1, nodes=0)


def test_enqueue_job_sends_a_multi_node_job_to_the_ray_queue(monkeypatch):
    sent = []
    monkeypatch.setattr(celery_app.app, "send_task",
                        lambda name, args, queue: sent.append((name, args, queue)))
    celery_app.enqueue_job("job_3", gpus=2, nodes=2)
    assert sent == [(RUN_JOB_TASK, ["job_3"], "ray")]


def test_enqueue_job_sends_a_multi_gpu_job_to_its_queue(monkeypatch):
    sent = []
    monkeypatch.setattr(celery_app.app, "send_task",
                        lambda name, args, queue: sent.append((name, args, queue)))
    celery_app.enqueue_job("job_2", gpus=2)
    assert sent == [(RUN_JOB_TASK, ["job_2"], "gpu-2")]


def test_gpu_counts_setting_is_a_comma_list_of_positive_counts(tmp_path, monkeypatch):
    assert Settings(data_dir=tmp_path).gpu_counts == (1,)
    monkeypatch.setenv("BRORL_GPU_COUNTS", " 2,1 ")
    assert Settings(data_dir=tmp_path).gpu_counts == (1, 2)
    for bad in ("0", "1,two", "", "1,-2"):
        monkeypatch.setenv("BRORL_GPU_COUNTS", bad)
        with pytest.raises(ValueError, match="BRORL_GPU_COUNTS"):
            Settings(data_dir=tmp_path)


def test_tasks_are_registered_by_name():
    import worker.entrypoints  # noqa: F401 - registers the tasks

    assert {RUN_JOB_TASK, REAP_TASK} <= set(celery_app.app.tasks)


def test_api_side_imports_stay_light():
    code = ("import sys, worker.celery_app, api.app; "
            "bad = [m for m in ('torch', 'vllm', 'worker.entrypoints', 'worker.runner') if m in sys.modules]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True, timeout=60)
