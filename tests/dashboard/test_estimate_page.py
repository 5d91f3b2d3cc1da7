"""Estimates and the queue in a real browser (Chromium + Playwright) against `brorl up` with the
fake trainer: the submit page's Estimate button shows the dry run's figures and submits nothing,
a spec the API refuses shows the error at its field, and a queued job's page shows its place."""
from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from playwright.sync_api import expect

from tests.dashboard.helpers import client, fake_trainer_stack, wait_for
from tests.support.upstack import Stack

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

SPEC = {"name": "estimate-me", "model": {"path": "builtin:tiny"},
        "task": {"reasoning_gym": {"name": "chain_sum", "train_size": 100, "eval_size": 10}},
        "rollout": {"engine": "hf", "max_new_tokens": 32,
                    "schedule": [{"n": 4, "prompts_per_step": 2, "steps": 3},
                                 {"n": 8, "prompts_per_step": 1, "steps": 2}]}}


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Iterator[Stack]:
    yield from fake_trainer_stack(tmp_path_factory, "estimate-dashboard", BRORL_WORKER_MEMORY_GB="16")



def test_estimate_button_shows_the_figures_and_submits_nothing(stack, page):
    page.goto(f"{stack.url}/submit")
    page.fill("#spec-text", json.dumps(SPEC))
    page.click("#estimate")
    box = page.locator("#estimate-box")
    expect(box).to_be_visible(timeout=30_000)  # the dry run builds a few of the task's examples
    expect(box).to_contain_text("stage 1: 2 steps × 1 prompts × n=8 = 16 samples")
    expect(box).to_contain_text("evaluation: 2 × 10 prompts × 16 = 320 samples")
    expect(box).to_contain_text("in all: 360 samples, at most 11,520 response tokens")
    expect(box).to_contain_text("no measurements yet")
    expect(box).to_contain_text("of 16 GiB: fits")
    with client(stack) as c:
        assert c.list_jobs()["data"] == []
    # A spec the submission checks refuse: the error sits at its field, no estimate shown.
    page.fill("#spec-text", json.dumps({**SPEC, "resources": {"gpus_per_node": 2}}))
    page.click("#estimate")
    expect(page.locator("#submit-msg")).to_contain_text("422", timeout=30_000)
    expect(page.locator("[data-for='resources.gpus_per_node']")).to_contain_text("BRORL_GPU_COUNTS")
    expect(box).to_be_hidden()


def test_a_queued_job_page_shows_its_place(stack, page):
    with client(stack) as c:
        # The one worker is busy with a slow job, so the second waits.
        busy = c.submit({**SPEC, "name": "busy sleep=2 steps=60"})["id"]
        wait_for(lambda: c.get_job(busy)["status"] == "running", 60, "the first job to start")
        waiting = c.submit({**SPEC, "name": "waiting"})["id"]
        try:
            page.goto(f"{stack.url}/jobs/{waiting}")
            expect(page.locator("#job-eta")).to_contain_text(
                "queued: position 1 on the 1-GPU queue (0 of yours, 0 other(s) ahead; 1 running)",
                timeout=30_000)
        finally:
            for job_id in (waiting, busy):
                c.cancel(job_id)
