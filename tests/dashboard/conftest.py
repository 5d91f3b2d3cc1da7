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
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cli.client import BrorlClient
from tests.upstack import Stack, running_stack

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


WARM_START_STEPS = 100


def prebuild_tiny_model(spec: dict) -> None:
    """Build the jobs' builtin:tiny model with a short warm start (100 SFT steps, about a
    minute here, instead of up to 1200) into the session's BRORL_CACHE_DIR (tests/conftest.py),
    which the `brorl up` child inherits, so the jobs start in seconds. The dashboard needs
    numbers that move, not a good model. The key is the trainer's own (task and seed), and
    the seed is one no other test uses, so no test gets this weaker model by accident."""
    from trainer import run as run_build
    from trainer.models import tiny as tiny_model
    from trainer.stop import never
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
        run_build._tiny_model_dir(job, task, scorer, never)


@pytest.fixture(scope="session")
def stack(tmp_path_factory) -> Iterator[Stack]:
    prebuild_tiny_model(SPEC_A)
    # The real trainer (no BRORL_TRAINER_ENTRYPOINT double); one thread leaves a CPU to the
    # browser.
    with running_stack(tmp_path_factory.mktemp("dashboard"), {
            "BRORL_TRAINER_ENTRYPOINT": None, "OMP_NUM_THREADS": "1",
            "BRORL_HEARTBEAT_SECONDS": "1"}) as stack:
        yield stack


def client(stack: Stack, key: str | None = None) -> BrorlClient:
    return BrorlClient(stack.url, key or stack.key, timeout=30)


@pytest.fixture(scope="session")
def jobs(stack: Stack) -> dict[str, str]:
    """Job A then job B, submitted at once (one worker: B waits for A)."""
    with client(stack) as c:
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
    errors: list[str] = []  # uncaught exceptions in the page's scripts fail the test
    pg.on("pageerror", lambda exc: errors.append(str(exc)))
    pg.set_default_timeout(30_000)
    pg.goto(login_url)
    yield pg
    context.close()
    assert not errors, errors


def wait_for(predicate, timeout: float, what: str, interval: float = 0.5):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out after {timeout:.0f}s waiting for {what}"
        time.sleep(interval)
