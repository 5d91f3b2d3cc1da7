"""docker-compose.yml is valid compose (checked by the docker CLI, no engine needed)."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from store.settings import Settings
from tests.support.services import compose_command, compose_missing, require_service

REPO = Path(__file__).resolve().parents[2]


RAY_SERVICES = {"ray-head", "ray-node", "ray-driver"}


@pytest.mark.parametrize("profiles", [(), ("ray",)], ids=["default", "ray"])
def test_compose_config_is_valid(profiles):
    """The file as `docker compose up` reads it, and with each profile on (the v2 plugin leaves a
    profile's services out of the model, and so unchecked, unless it is on)."""
    require_service("docker compose", compose_missing())
    command = [*compose_command(), "-f", "docker-compose.yml"]
    for profile in profiles:
        command += ["--profile", profile]
    result = subprocess.run([*command, "config", "-q"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    listed = subprocess.run([*command, "config", "--services"], cwd=REPO, capture_output=True, text=True,
                            timeout=60)
    assert listed.returncode == 0, listed.stderr
    services = set(listed.stdout.split())
    if "ray" in profiles:
        assert RAY_SERVICES <= services, services


def test_compose_file_shape():
    """What the deployment relies on, checked without docker."""
    services = yaml.safe_load((REPO / "docker-compose.yml").read_text())["services"]
    assert {"postgres", "redis", "migrate", "api", "worker", "reaper"} <= set(services)
    assert services["api"]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    devices = services["worker"]["deploy"]["resources"]["reservations"]["devices"]
    assert devices == [{"driver": "nvidia", "count": 1, "capabilities": ["gpu"]}]
    # One worker kind per GPU count, each serving that count's queue; the API accepts both.
    devices = services["worker-2gpu"]["deploy"]["resources"]["reservations"]["devices"]
    assert devices == [{"driver": "nvidia", "count": 2, "capabilities": ["gpu"]}]
    assert services["worker"]["command"][2:4] == ["--gpus", "1"]
    assert services["worker-2gpu"]["command"][2:4] == ["--gpus", "2"]
    assert services["worker-2gpu"]["image"] == services["worker"]["image"]
    assert Settings(gpu_counts=services["api"]["environment"]["BRORL_GPU_COUNTS"]).gpu_counts \
        == (1, 2)
    beats = [name for name, svc in services.items() if "--beat" in (svc.get("command") or [])]
    assert beats == ["reaper"], "exactly one Celery beat, or the reaper runs twice"
    for name in ("api", "worker", "worker-2gpu"):
        assert "artifacts:/artifacts" in services[name]["volumes"]
    env = services["api"]["environment"]
    assert env["BRORL_DATABASE_URL"].startswith("postgresql+psycopg://")
    # The Ray cluster of multi-node jobs: only in its profile; its nodes see the jobs' folders.
    assert services["ray-head"]["profiles"] == services["ray-node"]["profiles"] == ["ray"]
    assert "--head" in services["ray-head"]["command"] and "ray-head:6379" in " ".join(services["ray-node"]["command"])
    assert "artifacts:/artifacts" in services["ray-node"]["volumes"]
    assert services["ray-node"]["environment"]["BRORL_CACHE_DIR"].startswith("/artifacts/")
    # Multi-node jobs have their own queue, served by a driver that holds no GPU.
    driver = services["ray-driver"]
    assert driver["profiles"] == ["ray"] and "reservations" not in driver["deploy"].get("resources", {})
    assert driver["command"][driver["command"].index("--queues") + 1] == "ray"
    assert driver["command"][driver["command"].index("--pool") + 1] == "solo"
    assert driver["deploy"]["replicas"] >= 2  # one job may wait for its nodes while another runs
    assert "artifacts:/artifacts" in driver["volumes"] and driver["image"] == services["worker"]["image"]
    others = [svc["command"] for name, svc in services.items() if name != "ray-driver" and "--queues" in svc.get("command", [])]
    assert others and not any("ray" in c[c.index("--queues") + 1].split(",") for c in others)
    assert Settings(ray_max_nodes=0).ray_max_nodes == 0 and "BRORL_RAY_ADDRESS" in env
    assert env["BRORL_BROKER_URL"] == "redis://redis:6379/0"
