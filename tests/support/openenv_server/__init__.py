"""A real OpenEnv server for the tests: openenv-core in a venv of its own, the game in server.py.

openenv-core 0.3.0 depends on gradio, fastmcp and more, and gradio pins pillow below the
version this project installs, so it is not installed into the project's environment: a venv
under ~/.cache/brorl holds it (made once, then reused), seeing this project's packages
(fastapi, uvicorn, pydantic) through a .pth file, as tests/trainer/algo's TRL venv does.
Without pip access the tests skip (and fail in CI).
"""
from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path
from typing import Iterator

import httpx

from tests.support.services import require_service

OPENENV_VERSION = "0.3.0"
SERVER = Path(__file__).with_name("server.py")


def openenv_python() -> Path:
    """A Python with openenv-core (a venv made once, then reused); skip or fail (CI) without one."""
    home = Path.home() / ".cache" / "brorl" / f"openenv-core-{OPENENV_VERSION}-venv"
    python = home / "bin" / "python"
    probe = "import importlib.util as u; assert u.find_spec('openenv.core') and u.find_spec('uvicorn')"
    ok = python.exists() and subprocess.run([str(python), "-c", probe], capture_output=True).returncode == 0
    if not ok:
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(home)], check=True, capture_output=True)
        site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                              check=True, capture_output=True, text=True).stdout.strip()
        Path(site, "brorl_project.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
        pip = subprocess.run([str(python), "-m", "pip", "install", "-q", f"openenv-core=={OPENENV_VERSION}"],
                             capture_output=True, text=True, timeout=900)
        require_service("openenv-core", "" if pip.returncode == 0 else
                        f"pip install openenv-core=={OPENENV_VERSION}: {pip.stderr.strip()[-400:]}")
    return python


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def guess_server(*, max_sessions: int = 16) -> Iterator[str]:
    """The guessing game's server on a free local port, answering /health; its base URL."""
    python = openenv_python()
    port = _free_port()
    env = {**os.environ, "ENABLE_WEB_INTERFACE": "false"}
    log = tempfile.TemporaryFile("w+")   # a file, not a pipe: a pipe nobody reads would fill and block it
    proc = subprocess.Popen([str(python), str(SERVER), "--port", str(port), "--max-sessions", str(max_sessions)],
                            env=env, stdout=log, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                log.seek(0)
                raise RuntimeError(f"the OpenEnv test server exited: {log.read()[-2000:]}")
            try:
                if httpx.get(url + "/health", timeout=1, trust_env=False).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("the OpenEnv test server did not answer /health within 60 s")
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()   # a step still sleeping ("!hang") holds its thread: then the kill
        try:
            proc.wait(timeout=3)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
