"""The job page's "try it" box in a real browser against `brorl up`: pick a checkpoint, send a
message, and the answer streams into the page through /v1/chat/completions; a job with no
checkpoint says so and cannot send."""
from __future__ import annotations

from collections.abc import Iterator

import pytest
from playwright.sync_api import expect

from cli.client import BrorlClient
from tests.e2e.test_chat_e2e import PROMPT, _greedy, _trained
from tests.support.jobs import make_spec
from tests.dashboard.helpers import fake_trainer_stack
from tests.support.upstack import Stack

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Iterator[Stack]:
    yield from fake_trainer_stack(tmp_path_factory, "tryit-dashboard", OMP_NUM_THREADS="1")



def test_the_try_it_box_streams_a_checkpoints_answer(stack, page) -> None:
    job_id, folder = _trained(stack, seed=5)
    page.goto(f"{stack.url}/jobs/{job_id}")
    options = page.locator("#tryit-model option")
    expect(options).to_have_count(2)  # the newest, and step 3
    expect(options.nth(1)).to_have_attribute("value", f"{job_id}:3")
    page.select_option("#tryit-model", f"{job_id}:3")
    page.fill("#tryit-prompt", PROMPT)
    page.fill("#tryit-max", "12")
    page.fill("#tryit-temp", "0")
    page.click("#tryit-send")
    # The first message loads the checkpoint in the inference server: seconds on a busy machine.
    expect(page.locator("#tryit-answer")).to_have_attribute("data-done", "true", timeout=90_000)
    assert page.locator("#tryit-answer").inner_text() == _greedy(folder, PROMPT, 12)
    expect(page.locator("#tryit-msg")).to_have_text("")

    page.fill("#tryit-max", "100000")  # past BRORL_INFERENCE_MAX_TOKENS: the 400 names it
    page.click("#tryit-send")
    expect(page.locator("#tryit-msg")).to_contain_text("max_tokens", timeout=30_000)


def test_a_job_without_a_checkpoint_cannot_be_tried(stack, page) -> None:
    client = BrorlClient(stack.url, stack.key, timeout=30)
    job_id = client.submit(make_spec("nocheckpoint fail"))["id"]
    assert client.wait(job_id, poll=0.3, timeout=90)["status"] == "failed"
    page.goto(f"{stack.url}/jobs/{job_id}")
    expect(page.locator("#tryit-msg")).to_have_text("no checkpoint yet")
    expect(page.locator("#tryit-send")).to_be_disabled()
