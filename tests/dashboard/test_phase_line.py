"""The job page's phase line in a real browser (Chromium + Playwright) against `brorl up`: a job
in a long phase shows it live (phase, done / total, the trainer's message) from the metrics
stream's `progress` events, and the line goes once the phase ends.

The stack's trainer is the double (tests/support/fake_trainer.py) whose `phases=SECONDS`
writes a warm start's progress through the trainer's own `PhaseProgress`: a real warm start
takes minutes on a fresh cache, and the trainer's phases are tested on the real trainer in
tests/trainer (test_events.py, test_train_loop.py). Worker, sink, database, stream and page
are the real ones.
"""
from __future__ import annotations

from collections.abc import Iterator

import pytest
from playwright.sync_api import expect

from tests.dashboard.helpers import client, fake_trainer_stack, shot, tiny_spec, wait_for
from tests.support.upstack import Stack

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Iterator[Stack]:
    yield from fake_trainer_stack(tmp_path_factory, "phase-dashboard", BRORL_HEARTBEAT_SECONDS="1")



def _value(line) -> int:
    bar = line.locator("progress")
    return int(bar.get_attribute("value") or 0) if bar.count() else 0


def test_the_job_page_shows_a_long_phase_live_then_drops_it(stack, page):
    with client(stack) as c:
        job = c.submit(tiny_spec("phases=15 sleep=0.5 steps=3", [{"n": 4, "prompts_per_step": 2, "steps": 3}]))
    page.goto(f"{stack.url}/jobs/{job['id']}")
    line = page.locator("#job-phase")
    expect(line).to_be_visible(timeout=60_000)
    expect(line).to_contain_text("warm-starting builtin:tiny")
    expect(line).to_contain_text("fake warm start: step")
    assert line.get_attribute("data-phase") == "warm_start"
    assert line.locator("progress").get_attribute("max") == "150"
    first = _value(line)
    wait_for(lambda: _value(line) > first, 15, "the phase line to advance without a reload", interval=0.3)
    shot(page, "job-phase.png")
    expect(line).to_be_hidden(timeout=60_000)  # the phase ended: the steps' figures take over
    expect(page.locator("#job-status")).to_have_text("succeeded", timeout=60_000)
    with client(stack) as c:
        events = c.events(job["id"], after=None)["data"]
    progress = [e["data"] for e in events if e["type"] == "progress"]
    # Rate-limited at the source: 150 reports over 15 s became about one event a second.
    assert 5 <= len(progress) <= 25 and progress[-1]["finished"] and progress[-1]["done"] == 150
    # The timeline keeps the phase's end, not every update.
    expect(page.locator("#events tr.ev-progress")).to_have_count(1, timeout=15_000)
