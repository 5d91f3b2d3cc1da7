"""The webhooks page in a real browser (Chromium + Playwright) against `brorl up`: register an
endpoint (a receiver on loopback, which the operator allows here), see its secret once, send a
test and watch it arrive signed and logged as delivered, refuse a URL that reaches inside, and
delete the endpoint."""
from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from playwright.sync_api import expect
from standardwebhooks import Webhook

from tests.api.test_webhooks import Receiver
from tests.dashboard.helpers import fake_trainer_stack, shot, wait_for
from tests.support.upstack import Stack

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Iterator[Stack]:
    yield from fake_trainer_stack(tmp_path_factory, "webhooks-dashboard", BRORL_WEBHOOK_ALLOWED_NETWORKS="127.0.0.0/8")



def test_register_test_and_delete_an_endpoint(stack, page):
    receiver = Receiver()
    try:
        page.goto(f"{stack.url}/webhooks")
        page.fill("#wh-url", "http://169.254.169.254/latest/meta-data/")
        page.click("#wh-create")
        expect(page.locator("#wh-msg")).to_contain_text("not a public address")
        page.fill("#wh-url", receiver.url)
        page.check("input[value='job.succeeded']")
        page.click("#wh-create")
        expect(page.locator("#wh-secret")).to_be_visible()
        secret = page.locator("#wh-secret-value").inner_text()
        assert secret.startswith("whsec_")
        row = page.locator("#wh-endpoints tbody tr")
        expect(row).to_have_count(1)
        expect(row).to_contain_text("job.succeeded")
        row.get_by_role("button", name="test").click()
        expect(page.locator("#wh-deliveries tbody tr")).to_contain_text("delivered", timeout=30_000)
        pill = page.locator("#wh-deliveries .pill")  # white text: it needs its status colour
        assert pill.evaluate("e => getComputedStyle(e).backgroundColor") not in ("", "rgba(0, 0, 0, 0)")
        shot(page, "webhooks.png", full_page=True)
        wait_for(lambda: receiver.requests, 10, "the test delivery to arrive")
        (req,) = receiver.requests
        assert Webhook(secret).verify(req["body"], req["headers"])["type"] == "webhook.test"
        assert json.loads(req["body"])["data"]["endpoint_id"] == row.get_attribute("data-endpoint")
        row.get_by_role("button", name="delete").click()
        expect(page.locator("#wh-empty")).to_be_visible()
    finally:
        receiver.close()
