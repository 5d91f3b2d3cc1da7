"""`brorl up` as a subprocess on an empty data dir, for the tests that drive the embedded stack
as a user would (tests/e2e/test_embedded.py, tests/dashboard)."""
from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[2]  # tests/support/upstack.py -> the repository
# Settings that would point the child at another data dir, database or broker.
OUTSIDE_SETTINGS = ("BRORL_DATA_DIR", "BRORL_DATABASE_URL", "BRORL_BROKER_URL", "BRORL_ARTIFACT_DIR")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_healthy(proc: subprocess.Popen, url: str, timeout: float, output, interval: float = 0.5) -> None:
    """Poll `url` until it answers 200; fail with `output()` if `proc` exits or `timeout` passes."""
    deadline = time.monotonic() + timeout
    while True:
        assert proc.poll() is None, f"the server exited\n{output()}"
        assert time.monotonic() < deadline, f"not healthy in {timeout:.0f} s\n{output()}"
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(interval)


class Stack:
    def __init__(self, proc: subprocess.Popen, log: Path, data_dir: Path, url: str, env: dict):
        self.proc, self.log, self.data_dir, self.url, self.env = proc, log, data_dir, url, env

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    @property
    def key(self) -> str:
        """The local key `brorl up` created on first start."""
        return (self.data_dir / "local.key").read_text().strip()

    def brorl(self, *args: str, key: str | None = None, timeout: float = 120):
        env = {**self.env, "BRORL_URL": self.url}
        env.pop("BRORL_API_KEY", None)
        if key:
            env["BRORL_API_KEY"] = key
        return subprocess.run([sys.executable, "-m", "cli.main", *args], cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=timeout)


@contextlib.contextmanager
def running_stack(tmp: Path, env_overrides: dict[str, str | None],
                  ready_timeout: float = 120) -> Iterator[Stack]:
    """Start `brorl up` in `tmp` (data dir and log there), wait for /readyz, yield the stack;
    on exit Ctrl-C it (unless a test already stopped it) and wait, killing it if it hangs.
    An override of None removes that variable from the child's environment."""
    data_dir, log, port = tmp / "data", tmp / "up.log", free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **env_overrides}
    for name in (*OUTSIDE_SETTINGS, *(k for k, v in env_overrides.items() if v is None)):
        env.pop(name, None)
    with open(log, "wb") as fh:
        proc = subprocess.Popen([sys.executable, "-m", "cli.main", "up", "--port", str(port),
                                 "--data-dir", str(data_dir)], cwd=REPO, env=env,
                                stdout=fh, stderr=subprocess.STDOUT)
    stack = Stack(proc, log, data_dir, f"http://127.0.0.1:{port}", env)
    try:
        wait_healthy(proc, f"{stack.url}/readyz", ready_timeout, stack.output)
        yield stack
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=40)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
