"""The submit page's grader playground in a real browser against `brorl up`: the grader runs
on the server (POST /v1/graders/run; the python grader in the sandbox) and the page shows the
reward, each sub-reward and the error flags. The page's CSP stays on (no inline script, no
eval), so these waits are Playwright locators, never `wait_for_function` with a string."""
from __future__ import annotations

import json

import pytest
from playwright.sync_api import expect

from tests.support.services import grader_sandbox_missing, needs_service

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400),
              needs_service("a grader sandbox", grader_sandbox_missing())]


def _run(page, grader, sample: str, item: dict) -> None:
    page.fill("#pg-grader", json.dumps(grader))
    page.fill("#pg-sample", sample)
    page.fill("#pg-item", json.dumps(item))
    page.click("#pg-run")


def test_playground_shows_reward_sub_rewards_and_errors(stack, page):
    page.goto(f"{stack.url}/submit")
    page.click("#pg-example")  # a multi grader: a python sub-grader and a string_check
    page.click("#pg-run")
    expect(page.locator("#pg-result")).to_be_visible()
    assert float(page.get_attribute("#pg-reward", "data-reward")) == pytest.approx(1.0)
    assert page.get_attribute("[data-key=right] > td[data-reward]", "data-reward") == "1"
    assert page.get_attribute("[data-key=tagged] > td[data-reward]", "data-reward") == "1"
    expect(page.locator("#pg-errors")).to_have_text("no errors")
    from tests.dashboard.helpers import shot
    shot(page, "dashboard_playground.png", full_page=True)

    # A wrong answer: the python sub-grader scores 0, the format check still 1.
    page.fill("#pg-sample", "<answer>6</answer>")
    page.click("#pg-run")
    expect(page.locator("#pg-reward")).to_have_text("0.2000")
    assert page.get_attribute("[data-key=right] > td[data-reward]", "data-reward") == "0"

    # A python grader that raises: reward 0, the runtime error flagged with its details.
    broken = {"type": "python", "name": "broken",
              "source": "def grade(sample, item):\n    return item['missing']\n"}
    _run(page, broken, "anything", {"answer": "1"})
    expect(page.locator("[data-flag=python_grader_runtime_error]")).to_be_visible()
    expect(page.locator("#pg-details")).to_contain_text("missing")
    assert float(page.get_attribute("#pg-reward", "data-reward")) == 0.0

    # An invalid grader: the API's 422 names the field.
    _run(page, {"type": "string_check", "name": "s", "input": "{{ sample.output_text }}",
                "reference": "x", "operation": "contains"}, "x", {})
    expect(page.locator("#pg-msg")).to_contain_text("422")
    assert "operation" in page.get_attribute("#pg-msg", "data-field")
    expect(page.locator("#pg-result")).to_be_hidden()


MULTI = {"type": "multi", "name": "answer and format", "calculate_output": "0.5 * right + 0.5 * tagged",
         "graders": {
             "right": {"type": "verifier", "name": "reasoning_gym", "task": "chain_sum",
                       "config": {"min_terms": 2, "max_terms": 2, "max_digits": 1}},
             "tagged": {"type": "string_check", "name": "tagged", "input": "{{ sample.output_text }}",
                        "reference": "</answer>", "operation": "like"}}}


def test_job_page_charts_the_grader_and_each_sub_reward(stack, page):
    from tests.dashboard.helpers import client, tiny_spec, wait_for

    spec = tiny_spec("dash-grader", [{"n": 4, "prompts_per_step": 2, "steps": 3}])
    spec["task"]["grader"] = MULTI  # same task and seed as job A: its cached tiny model
    with client(stack) as c:
        job_id = c.submit(spec)["id"]
    page.goto(f"{stack.url}/jobs/{job_id}")
    # The sub-reward series are found in the metric rows as they arrive.
    legend = page.locator("#chart-subrewards .u-legend")
    expect(legend).to_contain_text("right", timeout=300_000)
    expect(legend).to_contain_text("tagged")
    for chart in ("grader", "subrewards"):
        wait_for(lambda: int(page.get_attribute(f"#chart-{chart}", "data-points") or 0) > 0,
                 30, f"points on the {chart} chart")
    expect(page.locator("#chart-grader .u-legend")).to_contain_text("timeouts")
