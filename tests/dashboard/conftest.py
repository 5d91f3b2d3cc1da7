"""One running stack for the browser tests: `brorl up` (SQLite, the real worker and trainer)
on an empty data dir, with two short real jobs on the builtin tiny model, and Chromium.

Job A (two stages, N=4 then N=8) is the one the job page watches live; job B (N=8 from the
start) is queued behind it for the compare page; the cancel test submits its own job.
Chromium is Debian's (`/usr/bin/chromium`) driven by Playwright; without it the tests skip
with that reason (CI installs it: .ci/run).
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from cli.client import BrorlClient

REPO = Path(__file__).resolve().parents[2]
CHROMIUM = os.environ.get("BRORL_TEST_CHROMIUM", "/usr/bin/chromium")


def tiny_spec(name: str, schedule: list[dict], *, checkpoint_every: int = 4) -> dict:
    return {
        "spec_version": 1, "name": name, "seed": 11,
        "model": {"path": "builtin:tiny"},
        "task": {"reasoning_gym": {"name": "chain_sum", "train_size": 400, "eval_size": 16,
                                   "config": {"min_terms": 2, "max_terms": 2, "max_digits": 1}}},
        "rollout": {"engine": "hf", "schedule": schedule, "max_new_tokens": 24},
        "eval": {"every": 2, "samples_per_prompt": 2, "k": [1, 2]},
        "checkpoint": {"every": checkpoint_every, "keep_last": 2},
        "algo": {"mini_batches": 1},
        "optim": {"lr": 1e-4},
    }


SPEC_A = tiny_spec("dash-a", [{"n": 4, "prompts_per_step": 2, "steps": 4},
                              {"n": 8, "prompts_per_step": 2, "steps": 4}])
SPEC_B = tiny_spec("dash-b", [{"n": 8, "prompts_per_step": 2, "steps": 4}])


class Stack:
    def __init__(self, proc: subprocess.Popen, log: Path, data_dir: Path, url: str, env: dict):
        self.proc, self.log, self.data_dir, self.url, self.env = proc, log, data_dir, url, env

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    @property
    def key(self) -> str:
        return (self.data_dir / "local.key").read_text().strip()

    def client(self, key: str | None = None) -> BrorlClient:
        return BrorlClient(self.url, key or self.key, timeout=30)


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


WARM_START_STEPS = 100


def prebuild_tiny_model(spec: dict) -> None:
    """Build the jobs' builtin:tiny model with a short warm start (100 SFT steps, about a
    minute here, instead of up to 1200) into the session's BRORL_CACHE_DIR (tests/conftest.py),
    which the `brorl up` child inherits, so the jobs start in seconds. The dashboard needs
    numbers that move, not a good model. The key is the trainer's own (task and seed), and
    the seed is one no other test uses, so no test gets this weaker model by accident."""
    from trainer import components, tiny_model
    from trainer.spec import JobSpec
    from trainer.tasks import build_task
    from trainer.tasks.scoring import Scorer

    job = JobSpec.model_validate(spec)
    task = build_task(job.task, job.seed, None)
    full = tiny_model.ensure_tiny_model
    with pytest.MonkeyPatch.context() as mp, \
            Scorer(task, reward=job.task.reward, truncated_reward=job.algo.truncated_reward) as scorer:
        mp.setattr(tiny_model, "ensure_tiny_model",
                   lambda cache, key, **kw: full(cache, key, **kw, max_sft_steps=WARM_START_STEPS))
        components._tiny_model_dir(job, task, scorer)


@pytest.fixture(scope="session")
def stack(tmp_path_factory) -> Stack:
    prebuild_tiny_model(SPEC_A)
    tmp = tmp_path_factory.mktemp("dashboard")
    data_dir, log, port = tmp / "data", tmp / "up.log", _free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1",
           "BRORL_HEARTBEAT_SECONDS": "1"}
    for name in ("BRORL_DATA_DIR", "BRORL_DATABASE_URL", "BRORL_BROKER_URL", "BRORL_ARTIFACT_DIR",
                 "BRORL_TRAINER_ENTRYPOINT"):
        env.pop(name, None)
    with open(log, "wb") as fh:
        proc = subprocess.Popen([sys.executable, "-m", "cli.main", "up", "--port", str(port),
                                 "--data-dir", str(data_dir)], cwd=REPO, env=env,
                                stdout=fh, stderr=subprocess.STDOUT)
    stack = Stack(proc, log, data_dir, f"http://127.0.0.1:{port}", env)
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, f"brorl up exited\n{stack.output()}"
            assert time.monotonic() < deadline, f"not ready in 120 s\n{stack.output()}"
            try:
                if httpx.get(f"{stack.url}/readyz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        yield stack
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=40)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)


@pytest.fixture(scope="session")
def jobs(stack: Stack) -> dict[str, str]:
    """Job A then job B, submitted at once (one worker: B waits for A)."""
    with stack.client() as c:
        return {"a": c.submit(SPEC_A)["id"], "b": c.submit(SPEC_B)["id"]}


@pytest.fixture(scope="session")
def login_url(stack: Stack) -> str:
    """The dashboard link `brorl up` printed (it carries the local key in the fragment)."""
    match = re.search(r"Dashboard \(logs this browser tab in\): (\S+)", stack.output())
    assert match, stack.output()
    return match.group(1)


@pytest.fixture(scope="session")
def browser():
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install chromium chromium-driver)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=[
            "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"])
        yield b
        b.close()


@pytest.fixture
def page(browser, login_url):
    """A fresh tab logged in with the local key through the printed link."""
    context = browser.new_context(viewport={"width": 1280, "height": 800}, accept_downloads=True)
    pg = context.new_page()
    pg.set_default_timeout(30_000)
    pg.goto(login_url)
    yield pg
    context.close()


def wait_for(predicate, timeout: float, what: str, interval: float = 0.5):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out after {timeout:.0f}s waiting for {what}"
        time.sleep(interval)
