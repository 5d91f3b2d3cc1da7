"""The dashboard in a real browser (Chromium + Playwright) against `brorl up` running real
tiny jobs: list, live job page, x-axis switch, checkpoints, compare, submit errors, cancel,
tenant isolation, offline /docs.

Waits are Playwright locators or Python polling, never `wait_for_function` with a string:
the pages' CSP forbids eval, and the tests keep that CSP on.
Tests run in file order on one session stack: the job page test watches job A while it
trains. `BRORL_DASHBOARD_SCREENSHOTS=docs/img` saves the README's screenshots.
"""
from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import expect

from tests.dashboard.helpers import SHOTS, SPEC_A, client, shot, tiny_spec, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]

CHART_IDS = ("reward", "eval", "schedule", "filter", "kl", "clip", "grad", "length",
             "throughput", "time", "memory")


def _points(page, chart: str) -> int:
    return int(page.get_attribute(f"#chart-{chart}", "data-points") or 0)


def _job(stack, job_id: str) -> dict:
    with client(stack) as c:
        return c._json("GET", f"/v1/jobs/{job_id}")


def _wait_done(stack, job_id: str, timeout: float = 400) -> dict:
    return wait_for(lambda: (j := _job(stack, job_id))["status"] in ("succeeded", "failed", "cancelled") and j,
                    timeout, f"job {job_id} to finish", interval=1)


def test_docs_and_pages_are_served_offline_with_a_csp(stack):
    docs = httpx.get(f"{stack.url}/docs")
    assert docs.status_code == 200 and "/static-offline-docs/swagger-ui-bundle.js" in docs.text
    assert "cdn" not in docs.text.lower()
    assert httpx.get(f"{stack.url}/static-offline-docs/swagger-ui-bundle.js").status_code == 200
    home = httpx.get(f"{stack.url}/")
    assert "script-src 'self'" in home.headers["content-security-policy"]
    assert "http" not in home.text.replace('href="/', "")  # nothing loaded from elsewhere


def test_job_page_charts_gain_points_live_with_stage_boundaries(stack, jobs, page):
    page.goto(f"{stack.url}/jobs/{jobs['a']}")
    page.wait_for_selector("#chart-reward")
    assert "key=" not in page.url  # the login link's key left the address bar
    seen = []  # reward-chart point counts observed without a reload
    def grew():
        n = _points(page, "reward")
        if not seen or n != seen[-1]:
            seen.append(n)
        return len([x for x in seen if x > 0]) >= 2
    wait_for(grew, 360, "the reward chart to gain points twice while live", interval=0.3)
    _wait_done(stack, jobs["a"])
    expect(page.locator("#job-status")).to_have_text("succeeded", timeout=15_000)
    total = SPEC_A["rollout"]["schedule"][0]["steps"] + SPEC_A["rollout"]["schedule"][1]["steps"]
    wait_for(lambda: _points(page, "schedule") >= 2 * total, 15, "every step on the charts")
    for chart in CHART_IDS:  # every group has data, drawn, and the N=4 -> N=8 boundary marked
        assert _points(page, chart) > 0, chart
        assert page.get_attribute(f"#chart-{chart}", "data-drawn") == "true", chart
        assert page.get_attribute(f"#chart-{chart}", "data-boundaries") == "1", chart
    assert page.locator("#events td", has_text="stage_started").count() == 2
    assert "N=4×4 → N=8×4" in page.inner_text("#job-schedule")


def test_x_axis_switch_rescales_every_chart(stack, jobs, page):
    page.goto(f"{stack.url}/jobs/{jobs['a']}")
    wait_for(lambda: _points(page, "reward") > 0, 20, "charts")
    assert float(page.get_attribute("#chart-reward", "data-xmax")) == 8
    with client(stack) as c:
        rows = c._json("GET", f"/v1/jobs/{jobs['a']}/metrics")["data"]
    samples = sum(r["values"].get("samples", 0) for r in rows)
    page.check("input[name=xaxis][value=samples]")
    wait_for(lambda: page.get_attribute("#chart-throughput", "data-xmax") == str(samples), 10, "samples axis")
    assert "generated samples" in page.inner_text("#chart-reward")
    page.check("input[name=xaxis][value=seconds]")
    wait_for(lambda: "wall-clock seconds" in page.inner_text("#chart-memory"), 10, "seconds axis")
    assert 0 < float(page.get_attribute("#chart-memory", "data-xmax")) < 600


def test_samples_table_shows_what_the_model_wrote_by_step_and_reward(stack, jobs, page):
    page.goto(f"{stack.url}/jobs/{jobs['a']}")
    expect(page.locator("#samples-note")).to_have_text("8 sample(s) at step 8", timeout=20_000)
    with client(stack) as c:
        api = c._json("GET", f"/v1/jobs/{jobs['a']}/samples?step=8")["data"]
    shown = page.locator("#samples tbody tr")
    assert shown.count() == len(api) == 8
    assert shown.nth(0).locator("pre").nth(1).inner_text() == api[0]["completion"]
    page.select_option("#samples-step", "1")
    expect(page.locator("#samples-note")).to_contain_text("at step 1")
    page.fill("#samples-threshold", "0.5")
    page.select_option("#samples-filter", "high")
    with client(stack) as c:
        high = c._json("GET", f"/v1/jobs/{jobs['a']}/samples?step=1&min_reward=0.5")["data"]
    expect(page.locator("#samples-note")).to_have_text(f"{len(high)} sample(s) at step 1")
    rewards = [float(t) for t in page.locator("#samples tbody tr td:nth-child(2)").all_inner_texts()]
    assert rewards == [r["reward"] for r in high] and all(r >= 0.5 for r in rewards)
    page.locator("#samples").scroll_into_view_if_needed()
    shot(page, "dashboard_samples.png")


def test_list_shows_jobs_with_progress_and_filters(stack, jobs, page):
    page.goto(f"{stack.url}/")
    row = page.locator(f"tr[data-job='{jobs['a']}']")
    row.wait_for()
    assert "dash-a" in row.inner_text() and "8 / 8" in row.inner_text()
    assert row.locator("progress").get_attribute("value") == "8"
    assert row.locator(".reward").inner_text() != ""  # latest reward shown
    page.select_option("#status-filter", "queued")
    wait_for(lambda: page.locator(f"tr[data-job='{jobs['a']}']").count() == 0, 10, "the filter")


def test_checkpoint_download_matches_its_sha256(stack, jobs, page):
    page.goto(f"{stack.url}/jobs/{jobs['a']}")
    button = page.locator("#checkpoints tr[data-step='8'] button.download")
    button.wait_for()
    with page.expect_download() as info:
        button.click()
    path = info.value.path()
    digest = hashlib.sha256(Path(path).read_bytes()).hexdigest()
    page.wait_for_selector("#checkpoints .sha-ok")
    assert page.inner_text("#checkpoints tr[data-step='8'] .archive-sha") == digest
    head = httpx.get(f"{stack.url}/v1/jobs/{jobs['a']}/checkpoints/8/download",
                     headers={"Authorization": f"Bearer {stack.key}"})
    assert head.headers["X-Checksum-Sha256"] == digest


def test_compare_overlays_two_jobs_with_their_schedules(stack, jobs, page):
    _wait_done(stack, jobs["b"])
    page.goto(f"{stack.url}/compare?job={jobs['a']}&job={jobs['b']}")
    page.wait_for_selector("#compare-chart[data-jobs='2']")
    page.select_option("#metric", "reward_mean")
    legend = page.inner_text("#compare-chart .u-legend")
    assert "dash-a (N=4×4 → N=8×4)" in legend and "dash-b (N=8×4)" in legend
    page.check("input[name=xaxis][value=samples]")
    expect(page.locator("#compare-chart")).to_contain_text("generated samples")
    shot(page, "dashboard_compare.png")


def test_bad_spec_shows_the_error_next_to_its_field(stack, page):
    page.goto(f"{stack.url}/submit")
    page.click("#template")
    expect(page.locator("#spec-text")).to_have_value(re.compile("schedule"))
    text = page.input_value("#spec-text").replace("{n: 8,", "{n: 1,", 1)
    page.fill("#spec-text", text)
    page.click("#submit")
    note = page.locator("[data-field='rollout.schedule.0.n'] > .field-error")
    note.wait_for()
    assert "greater than or equal to 2" in note.inner_text()
    # A valid spec (JSON this time; a long job on the tests' cached tiny model, so it is
    # running or queued when cancelled) is accepted and lands on the new job's page.
    spec = tiny_spec("dash-cancel", [{"n": 4, "prompts_per_step": 2, "steps": 200}])
    page.fill("#spec-text", json.dumps(spec, indent=1))
    page.click("#submit")
    page.wait_for_url(f"{stack.url}/jobs/job_*")
    page.wait_for_selector("#cancel:not([hidden])")
    page.once("dialog", lambda d: d.accept())  # the confirmation
    page.click("#cancel")
    wait_for(lambda: page.inner_text("#job-status") == "cancelled"
             or "cancel requested" in page.inner_text("#job-schedule"), 20, "the cancel to show")
    job_id = page.url.rsplit("/", 1)[1]
    assert _wait_done(stack, job_id, 120)["status"] == "cancelled"
    expect(page.locator("#job-status")).to_have_text("cancelled", timeout=15_000)


def test_another_tenants_key_sees_nothing(stack, jobs, browser):
    out = stack.brorl("keys", "create", "--tenant", "other", "--data-dir", str(stack.data_dir))
    assert out.returncode == 0, out.stderr
    other = out.stdout.strip().splitlines()[-1]
    context = browser.new_context()
    page = context.new_page()
    page.goto(f"{stack.url}/")
    page.fill("#login input", other)
    page.click("#login button")
    page.wait_for_selector("#empty:not([hidden])")
    assert page.locator("#jobs tbody tr").count() == 0
    page.goto(f"{stack.url}/jobs/{jobs['a']}")  # same tab: the key stays in sessionStorage
    expect(page.locator("#job-title")).to_have_text(re.compile("^No job"))
    assert page.locator("#chart-reward").count() == 0
    context.close()


def test_phone_width_has_no_horizontal_scroll(stack, jobs, browser, login_url):
    context = browser.new_context(viewport={"width": 390, "height": 844})
    page = context.new_page()
    page.goto(login_url.replace("/#", f"/jobs/{jobs['a']}#"))
    wait_for(lambda: _points(page, "reward") > 0, 20, "charts")
    wide = page.evaluate("""Array.from(document.querySelectorAll('body *'))
        .filter((e) => e.getBoundingClientRect().right > 391 && !e.closest('.table-wrap, pre'))
        .map((e) => `${e.tagName}#${e.id}.${e.className}`).slice(0, 5)""")
    assert page.evaluate("document.documentElement.scrollWidth") <= 390, wide
    context.close()


@pytest.mark.skipif(not SHOTS, reason="only when saving screenshots (BRORL_DASHBOARD_SCREENSHOTS)")
def test_screenshot_of_a_running_job(stack, page):
    """The README's picture: a job page mid-run, past its N=4 -> N=8 boundary."""
    spec = tiny_spec("broadening-demo", [{"n": 4, "prompts_per_step": 2, "steps": 6},
                                         {"n": 8, "prompts_per_step": 2, "steps": 60}])
    with client(stack) as c:
        job_id = c.submit(spec)["id"]
        page.goto(f"{stack.url}/jobs/{job_id}")
        wait_for(lambda: float(page.get_attribute("#chart-reward", "data-xmax") or 0) >= 14, 120, "step 14")
        assert page.inner_text("#job-status") == "running"
        page.wait_for_timeout(500)  # the throttled redraw
        shot(page, "dashboard_job.png", full_page=True)  # every chart group
        c._json("POST", f"/v1/jobs/{job_id}/cancel")
