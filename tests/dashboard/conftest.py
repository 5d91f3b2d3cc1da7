"""One running stack for the browser tests: `brorl up` (SQLite, the real worker and trainer)
on an empty data dir, with two short real jobs on the builtin tiny model, and Chromium.

Job A (two stages, N=4 then N=8) is the one the job page watches live; job B (N=8 from the
start) is queued behind it for the compare page; the cancel test submits its own job.
Chromium is Debian's (`/usr/bin/chromium`) driven by Playwright; without it the tests skip
with that reason (and fail in CI, which installs it: .ci/run).
"""
from __future__ import annotations

import os
import re
from collections.abc import Iterator

import pytest

from tests.dashboard.helpers import SPEC_A, SPEC_B, client
from tests.support.tinyprebuild import prebuild
from tests.support.upstack import Stack, running_stack
from tests.support.services import chromium_missing, require_service
from trainer.spec import JobSpec

CHROMIUM = os.environ.get("BRORL_TEST_CHROMIUM", "/usr/bin/chromium")


# The jobs' builtin:tiny model gets the shared capped warm start (tests/support/tinyprebuild.py)
# in the session's BRORL_CACHE_DIR (tests/conftest.py), which the `brorl up` child inherits, so
# the jobs start in seconds: the dashboard needs numbers that move, not a good model.
@pytest.fixture(scope="session")
def stack(tmp_path_factory) -> Iterator[Stack]:
    prebuild(JobSpec.model_validate(SPEC_A))
    # The real trainer (no BRORL_TRAINER_ENTRYPOINT double); one thread leaves a CPU to the
    # browser.
    with running_stack(tmp_path_factory.mktemp("dashboard"), {
            "BRORL_TRAINER_ENTRYPOINT": None, "OMP_NUM_THREADS": "1",
            "BRORL_HEARTBEAT_SECONDS": "1"}) as stack:
        yield stack


@pytest.fixture(scope="session")
def jobs(stack: Stack) -> dict[str, str]:
    """Job A then job B, submitted at once (one worker: B waits for A)."""
    with client(stack) as c:
        return {"a": c.submit(SPEC_A)["id"], "b": c.submit(SPEC_B)["id"]}


@pytest.fixture(scope="module")  # per module: a module may start a stack of its own
def login_url(stack: Stack) -> str:
    """The dashboard link `brorl up` printed (it carries the local key in the fragment)."""
    match = re.search(r"Dashboard \(logs this browser tab in\): (\S+)", stack.output())
    assert match, stack.output()
    return match.group(1)


@pytest.fixture(scope="module")  # not session: playwright's sync API keeps an event loop marked
def browser():                   # running in the main thread, and later modules' asyncio.run() would fail
    require_service("Chromium", chromium_missing(CHROMIUM))
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
