"""Continue broad from the job page in a real browser (Chromium + Playwright) against `brorl up`
with the test trainer: the button opens the submit page with the continuation's spec (n x 4,
continue_from), submitting it runs the child from the parent's checkpoint, and both job pages
link each other."""
from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
import yaml
from playwright.sync_api import expect

from tests.dashboard.helpers import client, fake_trainer_stack, shot, tiny_spec, wait_for
from tests.support.upstack import Stack

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Iterator[Stack]:
    yield from fake_trainer_stack(tmp_path_factory, "continue-dashboard")



def test_continue_broad_from_the_job_page(stack, page):
    with client(stack) as c:
        parent = c.submit(tiny_spec("parent", [{"n": 4, "prompts_per_step": 2, "steps": 3}]))
        wait_for(lambda: c.get_job(parent["id"])["status"] == "succeeded", 60, "the parent to finish")
    page.goto(f"{stack.url}/jobs/{parent['id']}")
    expect(page.locator("#continue-row")).to_be_visible(timeout=30_000)
    shot(page, "job-continue.png")
    page.click("#continue-broad")
    page.wait_for_url(f"{stack.url}/submit")
    spec = yaml.safe_load(page.locator("#spec-text").input_value())
    shot(page, "submit-continuation.png")
    assert spec["continue_from"]["job"] == parent["id"] and "model" not in spec
    assert spec["rollout"]["schedule"] == [{"n": 16, "prompts_per_step": 2, "steps": 3}]
    page.click("#submit")
    page.wait_for_url(re.compile(r".*/jobs/job_.*"))
    child_id = page.url.rsplit("/", 1)[-1]
    assert child_id != parent["id"]
    expect(page.locator("#job-lineage")).to_contain_text(f"continued from {parent['id']} (step 3)", timeout=30_000)
    with client(stack) as c:
        wait_for(lambda: c.get_job(child_id)["status"] == "succeeded", 60, "the child to finish")
        assert c.get_job(child_id)["parent_job_id"] == parent["id"]
    page.goto(f"{stack.url}/jobs/{parent['id']}")
    expect(page.locator("#job-lineage")).to_contain_text(f"continued by {child_id}", timeout=30_000)
    shot(page, "job-continued-by.png")
    page.click(f"#job-lineage a[href='/jobs/{child_id}']")
    page.wait_for_url(f"{stack.url}/jobs/{child_id}")
